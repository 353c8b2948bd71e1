// Tokens -> statement tree, following Jinja2's grammar and operator precedence (filters and tests bind to the
// operand before them; ~ binds tighter than + and -). Unknown tags, filters and tests are syntax errors, as
// Jinja2 reports them when it compiles a template.
#pragma once

#include <vector>

#include "tandem/server/jinja/ast.h"
#include "tandem/server/jinja/lexer.h"

namespace tandem::server::jinja {

// Throws SyntaxError naming the line and column of the offending token.
Body parse(const std::vector<Token>& tokens);

}  // namespace tandem::server::jinja
