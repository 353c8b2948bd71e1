// Template source -> tokens, with Jinja2's whitespace control applied to the text between tags: "-" strips
// whitespace beside a tag, "+" keeps it, and the environment options the model hub renders with
// (trim_blocks: the newline after a block or comment tag goes; lstrip_blocks: spaces and tabs before a block
// or comment tag at the start of a line go). Newlines are normalised to "\n" and one trailing newline of the
// source is dropped, as Jinja2 does by default.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::server::jinja {

struct Token {
  enum class Type {
    kText,        // literal output
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // text holds the unescaped value
    kInt,
    kFloat,
    kOperator,
    kEnd,
  };
  Type type;
  std::string text;
  int line = 0, column = 0;  // 1-based, where the token starts in the source
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws SyntaxError (with line and column) for an unterminated tag, comment or string, or a character that
// starts no token.
std::vector<Token> tokenize(std::string_view source, const LexOptions& options = {});

}  // namespace tandem::server::jinja
