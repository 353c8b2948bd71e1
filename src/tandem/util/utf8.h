// UTF-8 validation and decoding helpers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF).
bool utf8_valid(std::string_view s);

// Length of the well-formed sequence starting at s[0], or 0 when it is malformed or incomplete.
size_t utf8_sequence_length(std::string_view s);

// Appends the UTF-8 encoding of a code point (U+FFFD for surrogates and values past U+10FFFF).
void utf8_append(std::string& out, uint32_t cp);

// As utf8_append, but encodes surrogates as their 3-byte form (what re-encoding leniently decoded text
// gives).
void utf8_append_raw(std::string& out, uint32_t cp);

}  // namespace tandem
