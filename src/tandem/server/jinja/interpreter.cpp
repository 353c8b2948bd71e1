#include "tandem/server/jinja/interpreter.h"

#include "tandem/server/jinja/builtins.h"
#include "tandem/server/jinja/lexer.h"
#include "tandem/server/jinja/operators.h"
#include "tandem/server/jinja/parser.h"

namespace tandem::server::jinja {
namespace {

class MacroCallable : public Callable {
 public:
  explicit MacroCallable(const Stmt& macro) : macro_(macro) {}
  Value call(Interpreter& in, const CallArgs& args) const override { return in.call_macro(macro_, args); }
  std::string name() const override { return macro_.name; }

 private:
  const Stmt& macro_;  // owned by the Template, which outlives its renders
};

class CycleCallable : public Callable {
 public:
  explicit CycleCallable(int64_t index0) : index0_(index0) {}
  Value call(Interpreter&, const CallArgs& args) const override {
    if (args.positional.empty()) type_error("loop.cycle() needs at least one value");
    return args.positional[static_cast<size_t>(index0_) % args.positional.size()];
  }
  std::string name() const override { return "loop.cycle"; }

 private:
  int64_t index0_;
};

// Evaluation recurses once per nested statement or expression level, and macros nest those further; past this
// many levels a render is refused well before the stack of a server thread (8 MiB) could run out.
constexpr int kMaxNesting = 1500;

}  // namespace

Interpreter::NestingGuard::NestingGuard(Interpreter& interpreter) : in(interpreter) {
  if (++in.nesting_ > kMaxNesting) {
    --in.nesting_;
    throw RenderError("RecursionError: the render nests deeper than " + std::to_string(kMaxNesting) +
                      " levels (macros calling macros?)");
  }
}

const Value* Interpreter::Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent)
    for (const auto& [key, value] : s->vars)
      if (key == name) return &value;
  return nullptr;
}

void Interpreter::Scope::set(const std::string& name, Value value) {
  for (auto& [key, existing] : vars)
    if (key == name) {
      existing = std::move(value);
      return;
    }
  vars.emplace_back(name, std::move(value));
}

void Interpreter::fail_step_limit() const {
  throw RenderError("StepLimitError: the template ran past its limit of " +
                    std::to_string(options_.max_steps) +
                    " steps; a loop that never ends, or a conversation too long for this template?");
}

std::string Interpreter::render(const Body& body, const Dict& vars) {
  for (auto& [key, value] : make_globals().entries) globals_.set(key.as_string(), value);
  Scope root;
  root.parent = &globals_;
  for (const auto& [key, value] : vars.entries)
    if (key.is_string()) root.set(key.as_string(), value);
  root_ = &root;
  std::string out;
  exec_body(body, root, out);
  root_ = nullptr;
  return out;
}

void Interpreter::append(std::string& out, std::string_view text) const {
  if (out.size() + text.size() > limits().max_string_bytes)
    throw RenderError("MemoryError: the template's output passed " +
                      std::to_string(limits().max_string_bytes) + " bytes");
  out += text;
}

Interpreter::Flow Interpreter::exec_body(const Body& body, Scope& scope, std::string& out) {
  for (const StmtPtr& s : body) {
    const Flow flow = exec(*s, scope, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, Scope& scope, std::string& out) {
  step();
  NestingGuard nesting(*this);
  try {
    return exec_inner(s, scope, out);
  } catch (const RenderError& e) {
    if (e.line() > 0) throw;
    throw RenderError(e.detail(), s.expr ? s.expr->line : s.line, s.expr ? s.expr->column : s.column);
  }
}

Interpreter::Flow Interpreter::exec_inner(const Stmt& s, Scope& scope, std::string& out) {
  switch (s.kind) {
    case Stmt::Kind::kText:
      append(out, s.text);
      return Flow::kNormal;
    case Stmt::Kind::kOutput:
      append(out, to_str(eval(*s.expr, scope)));
      return Flow::kNormal;
    case Stmt::Kind::kIf:
      for (const auto& [condition, body] : s.branches)
        if (!condition || eval(*condition, scope).truthy()) return exec_body(body, scope, out);
      return Flow::kNormal;
    case Stmt::Kind::kFor:
      exec_for(s, scope, out);
      return Flow::kNormal;
    case Stmt::Kind::kSet: {
      Value value = eval(*s.expr, scope);
      if (s.attribute.empty()) {
        assign(s.targets, value, scope);
        return Flow::kNormal;
      }
      const Value* ns = scope.find(s.targets[0]);
      if (!ns || ns->kind() != Value::Kind::kNamespace)
        throw RenderError("TemplateRuntimeError: cannot assign attribute on non-namespace object ('" +
                              s.targets[0] + "' is " + (ns ? ns->type_name() : "undefined") + ")",
                          s.line, s.column);
      ns->namespace_dict().set(Value::string(s.attribute), std::move(value));
      return Flow::kNormal;
    }
    case Stmt::Kind::kSetBlock: {
      std::string captured;
      exec_body(s.body, scope, captured);
      Value value = Value::string(std::move(captured));
      if (s.filter) value = eval_filter(*s.filter, scope, &value);
      scope.set(s.targets[0], std::move(value));
      return Flow::kNormal;
    }
    case Stmt::Kind::kMacro:
      scope.set(s.name, Value::callable(std::make_shared<MacroCallable>(s)));
      return Flow::kNormal;
    case Stmt::Kind::kFilterBlock: {
      std::string captured;
      exec_body(s.body, scope, captured);
      const Value input = Value::string(std::move(captured));
      append(out, to_str(eval_filter(*s.filter, scope, &input)));
      return Flow::kNormal;
    }
    case Stmt::Kind::kWith: {
      Scope inner;
      inner.parent = &scope;
      for (size_t i = 0; i < s.targets.size(); ++i) inner.set(s.targets[i], eval(*s.values[i], scope));
      return exec_body(s.body, inner, out);
    }
    case Stmt::Kind::kBlock:
      return exec_body(s.body, scope, out);
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

void Interpreter::assign(const std::vector<std::string>& targets, const Value& value, Scope& scope) {
  if (targets.size() == 1) {
    scope.set(targets[0], value);
    return;
  }
  const List parts = iterate(value);
  if (parts.size() != targets.size())
    value_error(parts.size() > targets.size()
                    ? "too many values to unpack (expected " + std::to_string(targets.size()) + ")"
                    : "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                          std::to_string(parts.size()) + ")");
  for (size_t i = 0; i < targets.size(); ++i) scope.set(targets[i], parts[i]);
}

void Interpreter::exec_for(const Stmt& s, Scope& scope, std::string& out) {
  List items = iterate(eval(*s.expr, scope));
  if (s.filter) {
    List kept;
    for (const Value& item : items) {
      step();
      Scope probe;
      probe.parent = &scope;
      assign(s.targets, item, probe);
      if (eval(*s.filter, probe).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    Scope inner;
    inner.parent = &scope;
    exec_body(s.else_body, inner, out);
    return;
  }
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    step();
    Scope inner;
    inner.parent = &scope;
    assign(s.targets, items[static_cast<size_t>(i)], inner);
    Dict loop;
    loop.entries.reserve(12);
    auto field = [&](const char* name, Value v) {
      loop.entries.emplace_back(Value::string(name), std::move(v));
    };
    field("index", Value::integer(i + 1));
    field("index0", Value::integer(i));
    field("revindex", Value::integer(n - i));
    field("revindex0", Value::integer(n - i - 1));
    field("first", Value::boolean(i == 0));
    field("last", Value::boolean(i == n - 1));
    field("length", Value::integer(n));
    field("depth", Value::integer(1));
    field("depth0", Value::integer(0));
    field("previtem", i > 0 ? items[static_cast<size_t>(i - 1)]
                            : Value::undefined("there is no previous item (loop.previtem at the first)"));
    field("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)]
                                : Value::undefined("there is no next item (loop.nextitem at the last)"));
    field("cycle", Value::callable(std::make_shared<CycleCallable>(i)));
    inner.set("loop", Value::dict(std::move(loop)));
    if (exec_body(s.body, inner, out) == Flow::kBreak) break;
  }
}

Value Interpreter::lookup(const std::string& name, Scope& scope) const {
  if (const Value* v = scope.find(name)) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

Value Interpreter::eval(const Expr& e, Scope& scope) {
  step();
  NestingGuard nesting(*this);
  try {
    return eval_inner(e, scope);
  } catch (const RenderError& err) {
    if (err.line() > 0) throw;
    throw RenderError(err.detail(), e.line, e.column);
  }
}

CallArgs Interpreter::eval_args(const Expr& e, Scope& scope) {
  CallArgs args;
  args.positional.reserve(e.args.size());
  for (const ExprPtr& a : e.args) args.positional.push_back(eval(*a, scope));
  for (const auto& [key, a] : e.kwargs) args.keyword.emplace_back(key, eval(*a, scope));
  return args;
}

Value Interpreter::eval_filter(const Expr& e, Scope& scope, const Value* input) {
  Value subject;
  if (e.object)
    subject =
        e.object->kind == Expr::Kind::kFilter ? eval_filter(*e.object, scope, input) : eval(*e.object, scope);
  else if (input)
    subject = *input;
  const CallArgs args = eval_args(e, scope);
  try {
    return apply_filter(*this, e.name, subject, args);
  } catch (const RenderError& err) {
    if (err.line() > 0) throw;
    throw RenderError(err.detail(), e.line, e.column);
  }
}

Value Interpreter::eval_compare(const Expr& e, Scope& scope) {
  Value left = eval(*e.object, scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i], scope);
    const std::string& op = e.ops[i];
    bool ok = false;
    if (op == "==")
      ok = equal(left, right);
    else if (op == "!=")
      ok = !equal(left, right);
    else if (op == "<")
      ok = less(left, right);
    else if (op == ">")
      ok = less(right, left);
    else if (op == "<=")
      ok = !less(right, left);
    else if (op == ">=")
      ok = !less(left, right);
    else if (op == "in")
      ok = contains(right, left);
    else
      ok = !contains(right, left);
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interpreter::eval_inner(const Expr& e, Scope& scope) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName:
      return lookup(e.name, scope);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      List items;
      items.reserve(e.items.size());
      for (const ExprPtr& item : e.items) items.push_back(eval(*item, scope));
      return e.kind == Expr::Kind::kTuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    case Expr::Kind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value key = eval(*e.items[i], scope);
        d.set(std::move(key), eval(*e.items[i + 1], scope));
      }
      return Value::dict(std::move(d));
    }
    case Expr::Kind::kAttr:
      return get_attr(eval(*e.object, scope), e.name);
    case Expr::Kind::kItem: {
      const Value object = eval(*e.object, scope);
      return get_item(object, eval(*e.items[0], scope));
    }
    case Expr::Kind::kSlice: {
      const Value object = eval(*e.object, scope);
      Value parts[3];
      for (size_t i = 0; i < 3; ++i)
        if (e.items[i]) parts[i] = eval(*e.items[i], scope);
      return slice(object, parts[0], parts[1], parts[2]);
    }
    case Expr::Kind::kCall: {
      const Value callee = eval(*e.object, scope);
      return call(callee, eval_args(e, scope));
    }
    case Expr::Kind::kFilter:
      return eval_filter(e, scope, nullptr);
    case Expr::Kind::kTest: {
      const Value subject = eval(*e.object, scope);
      const bool result = apply_test(*this, e.name, subject, eval_args(e, scope));
      return Value::boolean(result != e.negated);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos:
      return negate(eval(*e.object, scope), e.kind == Expr::Kind::kNeg);
    case Expr::Kind::kNot:
      return Value::boolean(!eval(*e.object, scope).truthy());
    case Expr::Kind::kBinary: {
      const Value left = eval(*e.object, scope);
      return binary_op(e.name, left, eval(*e.items[0], scope), limits());
    }
    case Expr::Kind::kConcat: {
      std::string out;
      for (const ExprPtr& item : e.items) {
        out += to_str(eval(*item, scope));
        if (out.size() > limits().max_string_bytes)
          throw RenderError("MemoryError: the template built a string past " +
                            std::to_string(limits().max_string_bytes) + " bytes");
      }
      return Value::string(std::move(out));
    }
    case Expr::Kind::kCompare:
      return eval_compare(e, scope);
    case Expr::Kind::kAnd: {
      Value left = eval(*e.object, scope);
      return left.truthy() ? eval(*e.items[0], scope) : left;
    }
    case Expr::Kind::kOr: {
      Value left = eval(*e.object, scope);
      return left.truthy() ? left : eval(*e.items[0], scope);
    }
    case Expr::Kind::kCond:
      if (eval(*e.items[0], scope).truthy()) return eval(*e.object, scope);
      return e.items[1] ? eval(*e.items[1], scope)
                        : Value::undefined("the condition was false and there is no else");
  }
  return Value();
}

Value Interpreter::call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) callee.fail_undefined();
  if (!callee.is_callable()) type_error("'" + callee.type_name() + "' object is not callable");
  step();
  return callee.as_callable().call(*this, args);
}

Value Interpreter::call_macro(const Stmt& macro, const CallArgs& args) {
  if (call_depth_ >= options_.max_call_depth)
    throw RenderError("RecursionError: macro calls nest deeper than " +
                      std::to_string(options_.max_call_depth) + " (in '" + macro.name + "')");
  struct DepthGuard {
    explicit DepthGuard(int& d) : depth(++d) {}
    ~DepthGuard() { --depth; }
    int& depth;
  } guard(call_depth_);
  Scope scope;
  scope.parent = root_;
  List extra;
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i < macro.params.size())
      scope.set(macro.params[i], args.positional[i]);
    else
      extra.push_back(args.positional[i]);
  }
  for (const auto& [key, value] : args.keyword) {
    auto it = std::find(macro.params.begin(), macro.params.end(), key);
    if (it == macro.params.end())
      type_error("macro '" + macro.name + "' takes no keyword argument '" + key + "'");
    if (static_cast<size_t>(it - macro.params.begin()) < args.positional.size())
      type_error("macro '" + macro.name + "' got multiple values for argument '" + key + "'");
    scope.set(key, value);
  }
  for (size_t i = 0; i < macro.params.size(); ++i) {
    bool given = i < args.positional.size();
    for (const auto& kw : args.keyword) given = given || kw.first == macro.params[i];
    if (given) continue;
    if (macro.values[i])
      scope.set(macro.params[i], eval(*macro.values[i], scope));
    else
      scope.set(macro.params[i], Value::undefined("'" + macro.params[i] + "' is undefined"));
  }
  scope.set("varargs", Value::list(std::move(extra)));
  std::string out;
  exec_body(macro.body, scope, out);
  return Value::string(std::move(out));
}

Template Template::parse(std::string_view source) {
  return Template(jinja::parse(tokenize(source)));
}

std::string Template::render(const Json& vars, const RenderOptions& options) const {
  if (!vars.is_object())
    throw RenderError("TypeError: template variables must be a JSON object, not " +
                      std::string(vars.type_name()));
  const Value values = Value::from_json(vars);
  Interpreter interpreter(options);
  return interpreter.render(*body_, values.as_dict());
}

}  // namespace tandem::server::jinja
