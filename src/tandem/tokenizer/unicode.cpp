#include "tandem/tokenizer/unicode.h"

#include <algorithm>

#include "tandem/util/utf8.h"

namespace tandem::tokenizer {
namespace {

constexpr uint32_t kMaxCp = 0x110000;
constexpr uint32_t kBlockBits = 8;
constexpr uint32_t kBlockSize = 1u << kBlockBits;

// Unicode White_Space code points.
constexpr uint32_t kWhitespace[] = {0x09,   0x0A,   0x0B,   0x0C,   0x0D,   0x20,   0x85,   0xA0,   0x1680,
                                    0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008,
                                    0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};

// Two-stage lookup table built once from the category runs: block index per 256 code points, then the
// deduplicated blocks of flag bytes.
struct FlagTable {
  std::vector<uint16_t> block_of;  // (kMaxCp / kBlockSize)
  std::vector<uint8_t> blocks;     // (n_unique_blocks * kBlockSize)

  FlagTable() {
    std::vector<uint8_t> flat(kMaxCp, 0);
    for (size_t i = 0; i < unicode_data::kCategoryRunCount; ++i) {
      uint32_t first = unicode_data::kCategoryRuns[i] >> 3;
      uint32_t end =
          i + 1 < unicode_data::kCategoryRunCount ? unicode_data::kCategoryRuns[i + 1] >> 3 : kMaxCp;
      auto cat = static_cast<uint8_t>(unicode_data::kCategoryRuns[i] & 7);
      std::fill(flat.begin() + first, flat.begin() + end, cat);
    }
    for (uint32_t cp : kWhitespace) flat[cp] |= CpFlags::kWhitespaceBit;
    block_of.resize(kMaxCp / kBlockSize);
    for (uint32_t b = 0; b < kMaxCp / kBlockSize; ++b) {
      const uint8_t* src = flat.data() + b * kBlockSize;
      size_t n_blocks = blocks.size() / kBlockSize;
      size_t found = n_blocks;
      for (size_t k = 0; k < n_blocks; ++k) {
        if (std::equal(src, src + kBlockSize, blocks.data() + k * kBlockSize)) {
          found = k;
          break;
        }
      }
      if (found == n_blocks) blocks.insert(blocks.end(), src, src + kBlockSize);
      block_of[b] = static_cast<uint16_t>(found);
    }
  }
};

const FlagTable& flag_table() {
  static const FlagTable table;
  return table;
}

}  // namespace

CpFlags cp_flags(uint32_t cp) {
  if (cp >= kMaxCp) return CpFlags{static_cast<uint8_t>(Category::kControl)};
  const FlagTable& t = flag_table();
  return CpFlags{t.blocks[size_t(t.block_of[cp >> kBlockBits]) * kBlockSize + (cp & (kBlockSize - 1))]};
}

uint32_t cp_to_lower(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  const auto* begin = unicode_data::kLowercaseRuns;
  const auto* end = begin + unicode_data::kLowercaseRunCount;
  const auto* it = std::upper_bound(
      begin, end, cp, [](uint32_t v, const unicode_data::LowercaseRun& r) { return v < r.first; });
  if (it == begin) return cp;
  --it;
  uint32_t offset = cp - it->first;
  if (offset % it->stride != 0 || offset / it->stride >= it->count) return cp;
  return static_cast<uint32_t>(static_cast<int64_t>(cp) + it->delta);
}

uint32_t cp_nfd_first(uint32_t cp) {
  if (cp < 0xC0) return cp;
  const auto* begin = unicode_data::kNfdRanges;
  const auto* end = begin + unicode_data::kNfdRangeCount;
  const auto* it = std::upper_bound(begin, end, cp,
                                    [](uint32_t v, const unicode_data::NfdRange& r) { return v < r.first; });
  if (it == begin) return cp;
  --it;
  return cp <= it->last ? it->nfd : cp;
}

bool cp_is_cjk_ideograph(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) ||
         (cp >= 0x2B920 && cp <= 0x2CEAF) ||  // the reference starts this range at 0x2B920, not 0x2B820
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

void decode_utf8_lenient(std::string_view text, std::vector<uint32_t>& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  out.reserve(out.size() + n);
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (ok) {
      out.push_back(cp);
      i += len;
    } else {
      out.push_back(0xFFFD);
      ++i;
    }
  }
}

void append_utf8_raw(std::string& out, uint32_t cp) {
  utf8_append_raw(out, cp);
}

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet = [] {
    ByteAlphabet a;
    a.cp_to_byte.fill(-1);
    // Printable Latin-1 bytes stand for themselves; the others take the code points from U+0100 on, in order.
    uint32_t next = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? b : next++;
      append_utf8_raw(a.byte_to_text[b], cp);
      a.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

}  // namespace tandem::tokenizer
