// UTF-8 text as Python's str sees it: a sequence of code points. Templates index, slice and measure strings
// by code point, strip Unicode whitespace and split lines on Python's line boundaries.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::server::jinja::utf8 {

// Code points of `s`; a byte that does not start a valid sequence stands for itself (as U+0080..U+00FF
// would), so no input makes decoding fail.
std::vector<char32_t> decode(std::string_view s);
void append(std::string& out, char32_t cp);
std::string encode(const std::vector<char32_t>& cps, size_t begin, size_t end);
size_t length(std::string_view s);

// Python's str.isspace for one code point.
bool is_space(char32_t cp);
// Python's str.strip / lstrip / rstrip: whitespace when `chars` is null, else any code point in *chars.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
// Python's str.splitlines (without the line ends).
std::vector<std::string> split_lines(std::string_view s);
// ASCII case mapping of every byte; other code points are left as they are.
std::string lower(std::string_view s);
std::string upper(std::string_view s);

}  // namespace tandem::server::jinja::utf8
