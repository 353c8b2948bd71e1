#include "tandem/server/jinja/lexer.h"

#include <algorithm>
#include <charconv>
#include <cstdint>

#include "tandem/server/jinja/error.h"
#include "tandem/server/jinja/utf8.h"

namespace tandem::server::jinja {
namespace {

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // Jinja2's keep_trailing_newline=False
  return out;
}

bool is_ascii_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (char32_t cp : utf8::decode(s))
    if (!utf8::is_space(cp)) return false;
  return true;
}

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || (c >= '0' && c <= '9');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexOptions& options)
      : src_(normalize_newlines(source)), options_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos < n) {
      size_t tag = pos;
      while (tag + 1 < n &&
             !(src_[tag] == '{' && (src_[tag + 1] == '{' || src_[tag + 1] == '%' || src_[tag + 1] == '#')))
        ++tag;
      if (tag + 1 >= n) {
        emit_text(pos, src_.substr(pos));
        break;
      }
      const char kind = src_[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < n && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      emit_text(pos, strip_before_tag(std::string_view(src_).substr(pos, tag - pos), sign, kind != '{',
                                      line_starting));
      size_t end = 0;
      if (kind == '#')
        end = comment(tag, after);
      else if (kind == '%' && raw_begins(after, end))
        end = raw(tag, end);
      else
        end = tag_tokens(tag, after, kind == '%');
      line_starting = end > 0 && src_[end - 1] == '\n';
      pos = end;
    }
    tokens_.push_back(Token{Token::Type::kEnd, "", line_of(n), column_of(n)});
    return std::move(tokens_);
  }

 private:
  int line_of(size_t offset) const {
    return static_cast<int>(std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) -
                            line_starts_.begin());
  }
  // Code points from the start of the line to `offset`, plus one. Tokens are placed in source order, so the
  // count resumes from the last one placed on the same line (a long one-line template stays linear).
  int column_of(size_t offset) const {
    const size_t start = line_starts_[static_cast<size_t>(line_of(offset) - 1)];
    size_t from = start;
    int col = 1;
    if (column_offset_ >= start && column_offset_ <= offset) {
      from = column_offset_;
      col = column_;
    }
    for (size_t i = from; i < offset && i < src_.size(); ++i)
      if ((static_cast<unsigned char>(src_[i]) & 0xc0) != 0x80) ++col;
    column_offset_ = offset;
    column_ = col;
    return col;
  }
  [[noreturn]] void fail(const std::string& what, size_t offset) const {
    throw SyntaxError(what, line_of(offset), column_of(offset));
  }

  void emit(Token::Type type, std::string text, size_t offset) {
    tokens_.push_back(Token{type, std::move(text), line_of(offset), column_of(offset)});
  }
  void emit_text(size_t offset, std::string_view text) {
    if (!text.empty()) emit(Token::Type::kText, std::string(text), offset);
  }

  // The text before a tag, less what the tag's whitespace control removes.
  std::string_view strip_before_tag(std::string_view text, char sign, bool block_or_comment,
                                    bool line_starting) const {
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0) {
        if (is_ascii_space(text[e - 1])) {
          --e;
          continue;
        }
        size_t b = e - 1;  // the start of the last code point, for Unicode whitespace (Python's rstrip)
        while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xc0) == 0x80 && e - b < 4) --b;
        const std::vector<char32_t> last = utf8::decode(text.substr(b, e - b));
        if (last.size() != 1 || last[0] < 0x80 || !utf8::is_space(last[0])) break;
        e = b;
      }
      return text.substr(0, e);
    }
    if (sign != '+' && block_or_comment && options_.lstrip_blocks) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && all_space(text.substr(l_pos))) return text.substr(0, l_pos);
    }
    return text;
  }

  // Where the text after a tag end resumes: past all whitespace after "-", past one newline when trimming.
  size_t after_tag_end(size_t end, char sign, bool trim_newline) const {
    if (sign == '-') {
      while (end < src_.size() && is_ascii_space(src_[end])) ++end;
    } else if (sign != '+' && trim_newline && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    return end;
  }

  size_t comment(size_t tag, size_t after) {
    const size_t close = src_.find("#}", after);
    if (close == std::string::npos) fail("the comment opened here is never closed with '#}'", tag);
    const char sign =
        close > after && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : 0;
    return after_tag_end(close + 2, sign, options_.trim_blocks);
  }

  // {% raw %} (with optional whitespace control); sets `body` to where the raw text starts.
  bool raw_begins(size_t after, size_t& body) const {
    size_t p = after;
    while (p < src_.size() && is_ascii_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) return false;
    p += 3;
    while (p < src_.size() && is_ascii_space(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      body = after_tag_end(p + 3, '-', false);
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      body = p + 2;
      return true;
    }
    return false;
  }

  size_t raw(size_t tag, size_t body) {
    for (size_t p = src_.find("{%", body); p != std::string::npos; p = src_.find("{%", p + 2)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < src_.size() && is_ascii_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_ascii_space(src_[q])) ++q;
      char end_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      emit_text(body, strip_before_tag(std::string_view(src_).substr(body, p - body), sign, true, false));
      return after_tag_end(q + 2, end_sign, options_.trim_blocks);
    }
    fail("the raw block opened here is never closed with '{% endraw %}'", tag);
  }

  // The tokens of a {{ ... }} or {% ... %} tag; returns where the text after it starts.
  size_t tag_tokens(size_t tag, size_t after, bool block) {
    emit(block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, block ? "{%" : "{{", tag);
    std::vector<char> closers;
    size_t p = after;
    const size_t n = src_.size();
    for (;;) {
      while (p < n && is_ascii_space(src_[p])) ++p;
      if (p >= n)
        fail(std::string("the tag opened here is never closed with '") + (block ? "%}" : "}}") + "'", tag);
      if (closers.empty()) {
        const std::string_view rest = std::string_view(src_).substr(p);
        const char* close = block ? "%}" : "}}";
        for (char sign : {'-', '+', '\0'}) {
          if (sign == '+' && !block) continue;
          const std::string marker = sign ? std::string(1, sign) + close : std::string(close);
          if (rest.substr(0, marker.size()) == marker) {
            emit(block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, close, p);
            return after_tag_end(p + marker.size(), sign, block && options_.trim_blocks);
          }
        }
      }
      const char c = src_[p];
      if (is_name_start(c)) {
        size_t e = p;
        while (e < n && is_name_char(src_[e])) ++e;
        emit(Token::Type::kName, src_.substr(p, e - p), p);
        p = e;
      } else if (is_digit(c)) {
        p = number(p);
      } else if (c == '\'' || c == '"') {
        p = string_literal(p);
      } else {
        p = op(p, closers);
      }
    }
  }

  size_t number(size_t p) {
    const size_t start = p;
    std::string digits;
    auto run = [&] {
      while (p < src_.size() && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() &&
                                                       is_digit(src_[p + 1]) && p > start)))
        if (src_[p++] != '_') digits += src_[p - 1];
    };
    run();
    bool is_float = false;
    const bool after_dot =
        !tokens_.empty() && tokens_.back().type == Token::Type::kOperator && tokens_.back().text == ".";
    if (!after_dot && p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
      is_float = true;
      digits += src_[p++];
      run();
    }
    if (!after_dot && p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        is_float = true;
        digits += 'e';
        digits.append(src_, p + 1, q - p - 1);
        p = q;
        run();
      }
    }
    int64_t parsed = 0;
    if (!is_float && std::from_chars(digits.data(), digits.data() + digits.size(), parsed).ec != std::errc())
      fail("integer literal " + digits + " is too large (the limit is 2^63-1)", start);
    emit(is_float ? Token::Type::kFloat : Token::Type::kInt, digits, start);
    return p;
  }

  size_t string_literal(size_t start) {
    const char quote = src_[start];
    std::string value;
    size_t p = start + 1;
    for (;;) {
      if (p >= src_.size()) fail("the string opened here is never closed", start);
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) fail("the string opened here is never closed", start);
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
        case '\'':
        case '"':
          value += e;
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'n':
          value += '\n';
          break;
        case 'r':
          value += '\r';
          break;
        case 't':
          value += '\t';
          break;
        case 'v':
          value += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < width; ++k) {
            const int h = p + k < src_.size() ? hex_value(src_[p + k]) : -1;
            if (h < 0) fail(std::string("truncated \\") + e + " escape in a string", p - 2);
            cp = cp * 16 + static_cast<uint32_t>(h);
          }
          if (cp > 0x10ffff) fail("escape names a code point past U+10FFFF", p - 2);
          p += width;
          utf8::append(value, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k)
              cp = cp * 8 + static_cast<uint32_t>(src_[p++] - '0');
            utf8::append(value, cp);
          } else {
            value += '\\';  // Python keeps an unknown escape as written
            value += e;
          }
      }
    }
    emit(Token::Type::kString, std::move(value), start);
    return p + 1;
  }

  size_t op(size_t p, std::vector<char>& closers) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view two : kTwo)
      if (std::string_view(src_).substr(p, 2) == two) {
        emit(Token::Type::kOperator, std::string(two), p);
        return p + 2;
      }
    const char c = src_[p];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      std::string shown;
      utf8::append(shown, utf8::decode(std::string_view(src_).substr(p, 4)).front());
      fail("unexpected character '" + shown + "' in a tag", p);
    }
    if (c == '(' || c == '[' || c == '{') closers.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (closers.empty()) fail(std::string("unexpected '") + c + "'", p);
      if (closers.back() != c)
        fail(std::string("unexpected '") + c + "', expected '" + closers.back() + "'", p);
      closers.pop_back();
    }
    emit(Token::Type::kOperator, std::string(1, c), p);
    return p + 1;
  }

  std::string src_;
  LexOptions options_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  mutable size_t column_offset_ = 0;  // the last offset column_of() measured, and its column
  mutable int column_ = 1;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace tandem::server::jinja
