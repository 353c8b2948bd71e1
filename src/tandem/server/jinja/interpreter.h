// Walks a parsed template and writes its output. One Interpreter renders once; it holds the scopes, the step
// count and the call depth of that render.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tandem/server/jinja/ast.h"
#include "tandem/server/jinja/template.h"

namespace tandem::server::jinja {

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options) : options_(options) {}

  std::string render(const Body& body, const Dict& vars);

  // Counts one step of work; throws a RenderError once the render passes options().max_steps.
  void step() {
    if (++steps_ > options_.max_steps) fail_step_limit();
  }
  const RenderOptions& options() const { return options_; }
  const SizeLimits& limits() const { return options_.limits; }

  // Calls a template callable (a macro, builtin function or bound method).
  Value call(const Value& callee, const CallArgs& args);
  Value call_macro(const Stmt& macro, const CallArgs& args);

 private:
  // Variables bound by one level of the template: the render's variables, a loop iteration, a macro call.
  struct Scope {
    Scope* parent = nullptr;
    std::vector<std::pair<std::string, Value>> vars;
    const Value* find(const std::string& name) const;
    void set(const std::string& name, Value value);
  };
  enum class Flow { kNormal, kBreak, kContinue };

  [[noreturn]] void fail_step_limit() const;
  // Counts one level of evaluation for as long as it lives.
  struct NestingGuard {
    explicit NestingGuard(Interpreter& in);
    ~NestingGuard() { --in.nesting_; }
    Interpreter& in;
  };
  Flow exec_body(const Body& body, Scope& scope, std::string& out);
  Flow exec(const Stmt& s, Scope& scope, std::string& out);
  Flow exec_inner(const Stmt& s, Scope& scope, std::string& out);
  void exec_for(const Stmt& s, Scope& scope, std::string& out);
  void assign(const std::vector<std::string>& targets, const Value& value, Scope& scope);
  void append(std::string& out, std::string_view text) const;

  Value eval(const Expr& e, Scope& scope);
  Value eval_inner(const Expr& e, Scope& scope);
  Value eval_filter(const Expr& e, Scope& scope, const Value* input);
  Value eval_compare(const Expr& e, Scope& scope);
  CallArgs eval_args(const Expr& e, Scope& scope);
  Value lookup(const std::string& name, Scope& scope) const;

  const RenderOptions& options_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int nesting_ = 0;  // statements and expressions being evaluated, one inside another
  Scope globals_;
  Scope* root_ = nullptr;
};

}  // namespace tandem::server::jinja
