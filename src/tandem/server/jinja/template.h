// A Jinja template, as chat templates are written for the model hub's renderer: Jinja2 3.1 in a sandboxed,
// immutable environment with trim_blocks, lstrip_blocks and loop controls, the `tojson` filter of Python's
// json.dumps (non-ASCII kept, ", " and ": " separators), and the globals raise_exception(message) and
// strftime_now(format). See docs/chat-templates.md for the supported subset.
//
//   auto t = jinja::Template::parse(source);             // throws SyntaxError naming line and column
//   std::string prompt = t.render(vars, options);        // throws RenderError
//
// Rendering is sandboxed: a template reads only the variables passed to it, its own values and the methods
// and filters listed in the docs; attributes starting with "_" are refused; a step limit stops runaway loops;
// strings and lists it builds are bounded in size.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tandem/server/jinja/ast.h"
#include "tandem/server/jinja/error.h"
#include "tandem/server/jinja/operators.h"
#include "tandem/server/jinja/value.h"

namespace tandem::server::jinja {

struct RenderOptions {
  // The time strftime_now formats (in local time); the current time when not set.
  std::optional<std::chrono::system_clock::time_point> now;
  // Evaluation steps (expressions, statements, loop iterations) a render may take before it is stopped.
  int64_t max_steps = 2'000'000;
  // Calls (macros inside macros) deeper than this are refused.
  int max_call_depth = 64;
  SizeLimits limits;
};

class Template {
 public:
  static Template parse(std::string_view source);

  // Renders with `vars` (a JSON object: each member becomes a template variable, as it stands).
  std::string render(const Json& vars, const RenderOptions& options = {}) const;

 private:
  explicit Template(Body body) : body_(std::make_shared<const Body>(std::move(body))) {}
  std::shared_ptr<const Body> body_;
};

}  // namespace tandem::server::jinja
