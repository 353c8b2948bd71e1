// Errors of the template interpreter. Both are tandem::Error, so the CLI and the server report them as bad
// input; both name where in the template the problem is.
#pragma once

#include <string>

#include "tandem/util/error.h"

namespace tandem::server::jinja {

// The template source does not parse: "syntax error at line L, column C: what was expected".
class SyntaxError : public Error {
 public:
  SyntaxError(const std::string& what, int line, int column)
      : Error("template syntax error at line " + std::to_string(line) + ", column " + std::to_string(column) +
              ": " + what),
        line_(line),
        column_(column) {}
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  int line_, column_;
};

// Rendering failed: the template raised (raise_exception), used a value in a way Python would refuse
// ("TypeError: can only concatenate str (not \"dict\") to str"), touched something the sandbox forbids, or
// ran past its step limit. `detail` starts with the error's kind, as Jinja2 names it; line 0 means not yet
// placed.
class RenderError : public Error {
 public:
  explicit RenderError(const std::string& detail, int line = 0, int column = 0)
      : Error(line > 0 ? detail + " (template line " + std::to_string(line) + ", column " +
                             std::to_string(column) + ")"
                       : detail),
        detail_(detail),
        line_(line),
        column_(column) {}
  const std::string& detail() const { return detail_; }
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  std::string detail_;
  int line_, column_;
};

// Shorthands for the kinds of error Jinja2 raises.
[[noreturn]] inline void type_error(const std::string& what) {
  throw RenderError("TypeError: " + what);
}
[[noreturn]] inline void value_error(const std::string& what) {
  throw RenderError("ValueError: " + what);
}

}  // namespace tandem::server::jinja
