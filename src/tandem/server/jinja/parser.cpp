#include "tandem/server/jinja/parser.h"

#include <algorithm>
#include <charconv>
#include <initializer_list>

#include "tandem/server/jinja/builtins.h"
#include "tandem/server/jinja/error.h"

namespace tandem::server::jinja {
namespace {

using T = Token::Type;

// Nesting deeper than this (brackets, unary operators, blocks) is refused rather than risking the stack.
constexpr int kMaxDepth = 200;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  Body run() {
    std::string end_tag;
    Body body = subparse({}, end_tag);
    return body;
  }

 private:
  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& advance() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool at_op(std::string_view op) const { return current().type == T::kOperator && current().text == op; }
  bool at_name(std::string_view name) const { return current().type == T::kName && current().text == name; }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    advance();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case T::kEnd:
        return "the end of the template";
      case T::kText:
        return "text";
      case T::kBlockEnd:
        return "'%}'";
      case T::kVarEnd:
        return "'}}'";
      case T::kString:
        return "a string";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw SyntaxError(what, current().line, current().column);
  }
  [[noreturn]] void fail_expected(const std::string& what) const {
    fail("expected " + what + ", found " + describe(current()));
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail_expected("'" + std::string(op) + "'");
  }
  void expect_block_end() {
    if (current().type != T::kBlockEnd) fail_expected("'%}' to end the tag");
    advance();
  }
  std::string expect_name(const char* what) {
    if (current().type != T::kName) fail_expected(what);
    return advance().text;
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxDepth)
        parser.fail("the template nests deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  ExprPtr node(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  // Records a finished node's depth and refuses trees deeper than kMaxDepth: evaluating (and destroying) an
  // expression recurses once per level, and a chain such as a + a + ... + a nests one level per operator.
  ExprPtr done(ExprPtr e) const {
    int deepest = 0;
    auto see = [&](const ExprPtr& child) {
      if (child) deepest = std::max(deepest, child->depth);
    };
    see(e->object);
    for (const ExprPtr& c : e->items) see(c);
    for (const ExprPtr& c : e->args) see(c);
    for (const auto& kw : e->kwargs) see(kw.second);
    e->depth = deepest + 1;
    if (e->depth > kMaxDepth)
      throw SyntaxError("the expression nests deeper than " + std::to_string(kMaxDepth) + " levels", e->line,
                        e->column);
    return e;
  }

  StmtPtr statement(Stmt::Kind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  // Statements until a block tag named in `end_tags`; leaves the stream after that tag's name and stores the
  // name in `found`. With no end tags, runs to the end of the template.
  Body subparse(std::initializer_list<std::string_view> end_tags, std::string& found,
                const Token* opener = nullptr) {
    DepthGuard guard(*this);
    Body body;
    for (;;) {
      const Token& t = current();
      if (t.type == T::kEnd) {
        if (end_tags.size() == 0) return body;
        std::string names;
        for (std::string_view tag : end_tags)
          names += (names.empty() ? "'" : " or '") + std::string(tag) + "'";
        fail("the template ended inside the block opened at line " +
             std::to_string(opener ? opener->line : 0) + "; expected " + names);
      }
      if (t.type == T::kText) {
        auto s = statement(Stmt::Kind::kText, t);
        s->text = advance().text;
        body.push_back(std::move(s));
      } else if (t.type == T::kVarBegin) {
        auto s = statement(Stmt::Kind::kOutput, advance());
        s->expr = parse_tuple(true);
        if (current().type != T::kVarEnd) fail_expected("'}}' to end the expression");
        advance();
        body.push_back(std::move(s));
      } else if (t.type == T::kBlockBegin) {
        advance();
        if (current().type != T::kName) fail_expected("a statement name after '{%'");
        const std::string& name = current().text;
        if (std::find(end_tags.begin(), end_tags.end(), name) != end_tags.end()) {
          found = advance().text;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& at = current();
    const std::string name = advance().text;
    if (name == "if") return parse_if(at);
    if (name == "for") return parse_for(at);
    if (name == "set") return parse_set(at);
    if (name == "macro") return parse_macro(at);
    if (name == "filter") return parse_filter_block(at);
    if (name == "with") return parse_with(at);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) throw SyntaxError("'" + name + "' outside a for loop", at.line, at.column);
      auto s = statement(name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, at);
      expect_block_end();
      return s;
    }
    if (name == "generation") {
      auto s = statement(Stmt::Kind::kBlock, at);
      expect_block_end();
      std::string end;
      s->body = subparse({"endgeneration"}, end, &at);
      expect_block_end();
      return s;
    }
    if (name == "include" || name == "import" || name == "from" || name == "extends" || name == "block")
      throw SyntaxError("'" + name + "' is not supported: a chat template is rendered on its own", at.line,
                        at.column);
    throw SyntaxError("unknown tag '" + name + "'", at.line, at.column);
  }

  StmtPtr parse_if(const Token& at) {
    auto s = statement(Stmt::Kind::kIf, at);
    ExprPtr condition = parse_tuple(false);
    for (;;) {
      expect_block_end();
      std::string end;
      Body body = subparse({"elif", "else", "endif"}, end, &at);
      s->branches.emplace_back(std::move(condition), std::move(body));
      if (end == "endif") break;
      if (end == "else") {
        expect_block_end();
        Body else_body = subparse({"endif"}, end, &at);
        s->branches.emplace_back(nullptr, std::move(else_body));
        break;
      }
      condition = parse_tuple(false);
    }
    expect_block_end();
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool parens = skip_op("(");
    do {
      names.push_back(expect_name("a variable name"));
    } while (skip_op(","));
    if (parens) expect_op(")");
    return names;
  }

  StmtPtr parse_for(const Token& at) {
    auto s = statement(Stmt::Kind::kFor, at);
    s->targets = parse_targets();
    if (!skip_name("in")) fail_expected("'in'");
    s->expr = parse_tuple(false);
    if (skip_name("if")) s->filter = parse_expression(true);
    if (at_name("recursive")) fail("recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    std::string end;
    s->body = subparse({"endfor", "else"}, end, &at);
    --loop_depth_;
    if (end == "else") {
      expect_block_end();
      s->else_body = subparse({"endfor"}, end, &at);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(const Token& at) {
    auto s = statement(Stmt::Kind::kSet, at);
    if (current().type == T::kName && peek().type == T::kOperator && peek().text == ".") {
      s->targets.push_back(advance().text);
      advance();
      s->attribute = expect_name("an attribute name after '.'");
    } else {
      s->targets = parse_targets();
    }
    if (skip_op("=")) {
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    if (!s->attribute.empty() || s->targets.size() != 1) fail_expected("'='");
    s->kind = Stmt::Kind::kSetBlock;
    if (at_op("|")) s->filter = parse_filter_chain();
    expect_block_end();
    std::string end;
    s->body = subparse({"endset"}, end, &at);
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro(const Token& at) {
    auto s = statement(Stmt::Kind::kMacro, at);
    s->name = expect_name("the macro's name");
    expect_op("(");
    while (!at_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (at_op(")")) break;
      s->params.push_back(expect_name("a parameter name"));
      s->values.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    advance();
    expect_block_end();
    std::string end;
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = subparse({"endmacro"}, end, &at);
    loop_depth_ = saved_loops;
    if (current().type == T::kName) advance();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  // |name(args)|name... applied to a value given later (a {% filter %} or {% set %} block's output).
  ExprPtr parse_filter_chain() {
    ExprPtr chain;
    while (at_op("|") || !chain) {
      if (chain) advance();
      chain = parse_filter(std::move(chain));
    }
    return chain;
  }

  StmtPtr parse_filter_block(const Token& at) {
    auto s = statement(Stmt::Kind::kFilterBlock, at);
    s->filter = parse_filter_chain();
    expect_block_end();
    std::string end;
    s->body = subparse({"endfilter"}, end, &at);
    expect_block_end();
    return s;
  }

  StmtPtr parse_with(const Token& at) {
    auto s = statement(Stmt::Kind::kWith, at);
    while (current().type != T::kBlockEnd) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(expect_name("a variable name"));
      expect_op("=");
      s->values.push_back(parse_expression(true));
    }
    expect_block_end();
    std::string end;
    s->body = subparse({"endwith"}, end, &at);
    expect_block_end();
    return s;
  }

  // Expressions, from the loosest binding to the tightest (Jinja2's parser.py).

  bool at_expression_end() const {
    const Token& t = current();
    return t.type == T::kBlockEnd || t.type == T::kVarEnd || t.type == T::kEnd ||
           (t.type == T::kOperator && (t.text == ")" || t.text == "]" || t.text == "}" || t.text == "=")) ||
           (t.type == T::kName && (t.text == "if" || t.text == "in" || t.text == "recursive"));
  }

  ExprPtr parse_tuple(bool with_condexpr) {
    const Token& at = current();
    ExprPtr first = parse_expression(with_condexpr);
    if (!at_op(",")) return first;
    auto tuple = node(Expr::Kind::kTuple, at);
    tuple->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (at_expression_end()) break;
      tuple->items.push_back(parse_expression(with_condexpr));
    }
    return done(std::move(tuple));
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (at_name("if")) {
      auto cond = node(Expr::Kind::kCond, advance());
      cond->object = std::move(expr);
      cond->items.push_back(parse_or());
      DepthGuard guard(*this);
      cond->items.push_back(skip_name("else") ? parse_condexpr() : nullptr);
      expr = done(std::move(cond));
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      auto e = node(Expr::Kind::kOr, advance());
      e->object = std::move(left);
      e->items.push_back(parse_and());
      left = done(std::move(e));
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      auto e = node(Expr::Kind::kAnd, advance());
      e->object = std::move(left);
      e->items.push_back(parse_not());
      left = done(std::move(e));
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      DepthGuard guard(*this);
      auto e = node(Expr::Kind::kNot, advance());
      e->object = parse_not();
      return done(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& at = current();
    ExprPtr expr = parse_math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (current().type == T::kOperator &&
          (at_op("==") || at_op("!=") || at_op("<") || at_op(">") || at_op("<=") || at_op(">="))) {
        op = advance().text;
      } else if (at_name("in")) {
        advance();
        op = "in";
      } else if (at_name("not") && peek().type == T::kName && peek().text == "in") {
        advance();
        advance();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Kind::kCompare, at);
        cmp->object = std::move(expr);
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? done(std::move(cmp)) : std::move(expr);
  }

  ExprPtr binary(ExprPtr left, const Token& at, ExprPtr right) {
    auto e = node(Expr::Kind::kBinary, at);
    e->name = at.text;
    e->object = std::move(left);
    e->items.push_back(std::move(right));
    return done(std::move(e));
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& at = advance();
      left = binary(std::move(left), at, parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    const Token& at = current();
    ExprPtr first = parse_math2();
    if (!at_op("~")) return first;
    auto e = node(Expr::Kind::kConcat, at);
    e->items.push_back(std::move(first));
    while (skip_op("~")) e->items.push_back(parse_math2());
    return done(std::move(e));
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& at = advance();
      left = binary(std::move(left), at, parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_op("**")) {
      const Token& at = advance();
      left = binary(std::move(left), at, parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      const Token& at = advance();
      e = node(at.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, at);
      e->object = parse_unary(false);
    } else {
      e = parse_postfix(parse_primary());
    }
    e = done(std::move(e));
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = current();
    switch (t.type) {
      case T::kName: {
        advance();
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          auto e = node(Expr::Kind::kLiteral, t);
          e->value = Value::boolean(t.text == "true" || t.text == "True");
          return done(std::move(e));
        }
        if (t.text == "none" || t.text == "None") {
          auto e = node(Expr::Kind::kLiteral, t);
          e->value = Value::none();
          return done(std::move(e));
        }
        auto e = node(Expr::Kind::kName, t);
        e->name = t.text;
        return done(std::move(e));
      }
      case T::kString: {
        std::string text;
        while (current().type == T::kString) text += advance().text;
        auto e = node(Expr::Kind::kLiteral, t);
        e->value = Value::string(std::move(text));
        return done(std::move(e));
      }
      case T::kInt: {
        advance();
        int64_t v = 0;
        std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        auto e = node(Expr::Kind::kLiteral, t);
        e->value = Value::integer(v);
        return done(std::move(e));
      }
      case T::kFloat: {
        advance();
        auto e = node(Expr::Kind::kLiteral, t);
        e->value = Value::number(std::stod(t.text));
        return done(std::move(e));
      }
      case T::kOperator:
        if (t.text == "(") {
          advance();
          if (skip_op(")")) return node(Expr::Kind::kTuple, t);
          ExprPtr inner = parse_tuple(true);
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          advance();
          auto e = node(Expr::Kind::kList, t);
          while (!at_op("]")) {
            if (!e->items.empty()) expect_op(",");
            if (at_op("]")) break;
            e->items.push_back(parse_expression(true));
          }
          advance();
          return done(std::move(e));
        }
        if (t.text == "{") {
          advance();
          auto e = node(Expr::Kind::kDict, t);
          while (!at_op("}")) {
            if (!e->items.empty()) expect_op(",");
            if (at_op("}")) break;
            e->items.push_back(parse_expression(true));
            expect_op(":");
            e->items.push_back(parse_expression(true));
          }
          advance();
          return done(std::move(e));
        }
        break;
      default:
        break;
    }
    fail_expected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (at_op(".")) {
        const Token& at = advance();
        if (current().type == T::kInt) {
          auto item = node(Expr::Kind::kItem, at);
          item->object = std::move(e);
          item->items.push_back(parse_primary());
          e = done(std::move(item));
          continue;
        }
        auto attr = node(Expr::Kind::kAttr, at);
        attr->name = expect_name("an attribute name after '.'");
        attr->object = std::move(e);
        e = done(std::move(attr));
      } else if (at_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return done(std::move(e));
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    const Token& at = advance();
    ExprPtr parts[3];
    int colons = 0;
    for (;;) {
      if (at_op("]")) break;
      if (at_op(":")) {
        if (++colons > 2) fail("a slice takes at most start:stop:step");
        advance();
        continue;
      }
      if (parts[colons]) fail_expected("':' or ']'");
      parts[colons] = parse_expression(true);
    }
    advance();
    if (colons == 0) {
      if (!parts[0]) throw SyntaxError("expected an index inside '[]'", at.line, at.column);
      auto e = node(Expr::Kind::kItem, at);
      e->object = std::move(object);
      e->items.push_back(std::move(parts[0]));
      return done(std::move(e));
    }
    auto e = node(Expr::Kind::kSlice, at);
    e->object = std::move(object);
    for (ExprPtr& p : parts) e->items.push_back(std::move(p));
    return done(std::move(e));
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!at_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (at_op(")")) break;
      if (at_op("*") || at_op("**")) fail("*args and **kwargs in calls are not supported");
      if (current().type == T::kName && peek().type == T::kOperator && peek().text == "=") {
        std::string key = advance().text;
        advance();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("a positional argument follows a keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(Expr::Kind::kCall, current());
    e->line = callee->line;  // errors point at what is called, not at its '('
    e->column = callee->column;
    e->object = std::move(callee);
    parse_call_args(*e);
    return done(std::move(e));
  }

  ExprPtr parse_filter(ExprPtr object) {
    const Token& at = current();
    std::string name = expect_name("a filter name");
    if (!has_filter(name)) throw SyntaxError("unknown filter '" + name + "'", at.line, at.column);
    auto e = node(Expr::Kind::kFilter, at);
    e->name = std::move(name);
    e->object = std::move(object);
    if (at_op("(")) parse_call_args(*e);
    return done(std::move(e));
  }

  ExprPtr parse_test(ExprPtr object) {
    const Token& at = advance();  // 'is'
    auto e = node(Expr::Kind::kTest, at);
    e->negated = skip_name("not");
    const Token& name_at = current();
    e->name = expect_name("a test name after 'is'");
    if (!has_test(e->name)) throw SyntaxError("unknown test '" + e->name + "'", name_at.line, name_at.column);
    e->object = std::move(object);
    const Token& t = current();
    if (at_op("(")) {
      parse_call_args(*e);
    } else if ((t.type == T::kName || t.type == T::kString || t.type == T::kInt || t.type == T::kFloat ||
                at_op("[") || at_op("{")) &&
               !(at_name("else") || at_name("or") || at_name("and") || at_name("if") || at_name("in") ||
                 at_name("not"))) {
      if (at_name("is")) fail("tests cannot be chained with 'is'");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    return done(std::move(e));
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (at_op("|")) {
        advance();
        e = parse_filter(std::move(e));
      } else if (at_name("is")) {
        e = parse_test(std::move(e));
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return done(std::move(e));
      }
    }
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens) {
  return Parser(tokens).run();
}

}  // namespace tandem::server::jinja
