// Unicode helpers for the tokenizers: per-code-point category flags, simple lowercase, the first code point
// of a canonical decomposition, the lenient UTF-8 decoding the reference tokenizers apply to their input, and
// the GPT-2 byte <-> printable-code-point table. Tables are static const data (see gen_unicode_tables.py);
// every function here is thread safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tokenizer {

// One general category per code point (the major class of its Unicode general category).
enum class Category : uint8_t {
  kUndefined = 0,
  kNumber = 1,       // \p{N}
  kLetter = 2,       // \p{L}
  kSeparator = 3,    // \p{Z}
  kAccentMark = 4,   // \p{M}
  kPunctuation = 5,  // \p{P}
  kSymbol = 6,       // \p{S}
  kControl = 7,      // \p{C} (also unassigned, private use and surrogates)
};

// Category in the low 3 bits; kWhitespaceBit when the code point is Unicode White_Space.
struct CpFlags {
  static constexpr uint8_t kWhitespaceBit = 0x08;
  uint8_t bits = 0;  // 0 only for "no code point" (past the end of a segment)

  Category category() const { return static_cast<Category>(bits & 7); }
  bool is_letter() const { return (bits & 7) == uint8_t(Category::kLetter); }
  bool is_number() const { return (bits & 7) == uint8_t(Category::kNumber); }
  bool is_punctuation() const { return (bits & 7) == uint8_t(Category::kPunctuation); }
  bool is_symbol() const { return (bits & 7) == uint8_t(Category::kSymbol); }
  bool is_accent_mark() const { return (bits & 7) == uint8_t(Category::kAccentMark); }
  bool is_control() const { return (bits & 7) == uint8_t(Category::kControl); }
  bool is_whitespace() const { return (bits & kWhitespaceBit) != 0; }
  bool defined() const { return bits != 0; }
};

// Flags of a code point; code points past U+10FFFF get the control category.
CpFlags cp_flags(uint32_t cp);

// Simple (one code point) lowercase mapping; the code point itself when it has none.
uint32_t cp_to_lower(uint32_t cp);

// First code point of the canonical decomposition (NFD); the code point itself when it does not decompose.
uint32_t cp_nfd_first(uint32_t cp);

// CJK ideograph ranges as BERT's basic tokenizer defines them.
bool cp_is_cjk_ideograph(uint32_t cp);

// Length of the UTF-8 sequence a lead byte announces (1 for continuation and invalid bytes), the way the
// reference splits text into symbols without validating it.
inline size_t utf8_lead_length(unsigned char c) {
  static constexpr std::array<uint8_t, 16> kLengths = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[c >> 4];
}

// Decodes UTF-8 leniently, as the reference tokenizers do: overlong forms and surrogates are accepted, and
// each byte that does not start a complete sequence becomes U+FFFD. Appends to `out`.
void decode_utf8_lenient(std::string_view text, std::vector<uint32_t>& out);

// Appends the UTF-8 form of a code point; U+FFFD for values past U+10FFFF. Surrogates are encoded as 3 bytes,
// which is what the reference produces when it re-encodes leniently decoded text.
void append_utf8_raw(std::string& out, uint32_t cp);

// GPT-2 byte-level BPE alphabet: every byte maps to one printable code point, stored as its UTF-8 form.
struct ByteAlphabet {
  std::array<std::string, 256> byte_to_text;
  // Code point -> byte for the 256 code points used (-1 elsewhere); code points are all below 0x144.
  std::array<int16_t, 0x144> cp_to_byte;
};
const ByteAlphabet& byte_alphabet();

namespace unicode_data {
struct LowercaseRun {
  uint32_t first;
  uint16_t count;
  uint8_t stride;
  int32_t delta;
};
struct NfdRange {
  uint32_t first;
  uint32_t last;
  uint32_t nfd;
};
extern const uint32_t kCategoryRuns[];
extern const size_t kCategoryRunCount;
extern const LowercaseRun kLowercaseRuns[];
extern const size_t kLowercaseRunCount;
extern const NfdRange kNfdRanges[];
extern const size_t kNfdRangeCount;
}  // namespace unicode_data

}  // namespace tandem::tokenizer
