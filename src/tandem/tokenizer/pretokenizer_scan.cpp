#include "tandem/tokenizer/pretokenizer_scan.h"

#include "tandem/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

constexpr uint32_t kNone = 0xFFFFFFFF;

// A cursor over one segment: reads past its end give kNone / empty flags, and emit() closes the current
// piece.
class Segment {
 public:
  Segment(const uint32_t* cps, const uint8_t* flags, size_t begin, size_t end, std::vector<uint32_t>& pieces)
      : cps_(cps), flags_(flags), end_(end), last_(begin), pieces_(pieces) {}

  uint32_t cp(size_t i) const { return i < end_ ? cps_[i] : kNone; }
  CpFlags flags(size_t i) const { return i < end_ ? CpFlags{flags_[i]} : CpFlags{}; }
  size_t end() const { return end_; }

  void emit(size_t to) {
    if (to > last_) pieces_.push_back(static_cast<uint32_t>(to - last_));
    last_ = to;
  }

  // Length of an English contraction ('s 't 'm 'd 're 've 'll) starting at `pos`, or 0.
  size_t contraction(size_t pos, bool ignore_case) const {
    if (cp(pos) != '\'' || pos + 1 >= end_) return 0;
    auto at = [&](size_t i) { return ignore_case ? cp_to_lower(cp(i)) : cp(i); };
    uint32_t c1 = at(pos + 1);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (pos + 2 >= end_) return 0;
    uint32_t c2 = at(pos + 2);
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    return 0;
  }

  // Whitespace handling shared by both regexes: \s+(?!\S) leaves the last blank of a run for the next word
  // unless the run ends the segment; \s+ takes the rest. Returns the new position.
  size_t whitespace(size_t pos) {
    size_t n = 0;
    while (flags(pos + n).is_whitespace()) ++n;
    if (n > 1 && pos + n < end_) {
      pos += n - 1;
    } else {
      pos += n > 0 ? n : 1;  // no rule matched: the character stands alone
    }
    emit(pos);
    return pos;
  }

 private:
  const uint32_t* cps_;
  const uint8_t* flags_;
  size_t end_;
  size_t last_;
  std::vector<uint32_t>& pieces_;
};

bool is_word_char(CpFlags f) {
  return f.is_whitespace() || f.is_letter() || f.is_number();
}

}  // namespace

void scan_gpt2(const uint32_t* cps, const uint8_t* flags, size_t begin, size_t end,
               std::vector<uint32_t>& pieces) {
  Segment s(cps, flags, begin, end, pieces);
  size_t pos = begin;
  while (pos < end) {
    if (size_t n = s.contraction(pos, false)) {
      pos += n;
      s.emit(pos);
      continue;
    }
    const uint32_t c = s.cp(pos);
    // An optional leading space, then a run of one class.
    const CpFlags next = c == ' ' ? s.flags(pos + 1) : s.flags(pos);
    if (next.is_letter() || next.is_number()) {
      const bool letters = next.is_letter();
      pos += c == ' ';
      while (letters ? s.flags(pos).is_letter() : s.flags(pos).is_number()) ++pos;
      s.emit(pos);
      continue;
    }
    if (next.defined() && !is_word_char(next)) {
      pos += c == ' ';
      while (s.flags(pos).defined() && !is_word_char(s.flags(pos))) ++pos;
      s.emit(pos);
      continue;
    }
    pos = s.whitespace(pos);
  }
}

void scan_llama3(const uint32_t* cps, const uint8_t* flags, size_t begin, size_t end,
                 std::vector<uint32_t>& pieces) {
  Segment s(cps, flags, begin, end, pieces);
  size_t pos = begin;
  while (pos < end) {
    if (size_t n = s.contraction(pos, true)) {
      pos += n;
      s.emit(pos);
      continue;
    }
    const uint32_t c = s.cp(pos);
    const CpFlags f = s.flags(pos);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c != '\r' && c != '\n' && !f.is_number() && (f.is_letter() || s.flags(pos + 1).is_letter())) {
      ++pos;
      while (s.flags(pos).is_letter()) ++pos;
      s.emit(pos);
      continue;
    }
    // \p{N}{1,3}
    if (f.is_number()) {
      size_t group_start = pos;
      while (s.flags(pos).is_number()) {
        if (++pos - group_start >= 3) {
          s.emit(pos);
          group_start = pos;
        }
      }
      s.emit(pos);
      continue;
    }
    // " ?[^\s\p{L}\p{N}]+[\r\n]*"; as in the reference, a lone trailing space also lands here.
    CpFlags run = c == ' ' ? s.flags(pos + 1) : f;
    if (!is_word_char(run)) {
      pos += c == ' ';
      while (run.defined() && !is_word_char(run)) run = s.flags(++pos);
      while (s.cp(pos) == '\r' || s.cp(pos) == '\n') ++pos;
      s.emit(pos);
      continue;
    }
    // \s*[\r\n]+ takes a whitespace run up to its last line break.
    size_t n = 0, after_break = 0;
    while (s.flags(pos + n).is_whitespace()) {
      uint32_t w = s.cp(pos + n);
      ++n;
      if (w == '\r' || w == '\n') after_break = pos + n;
    }
    if (after_break > 0) {
      pos = after_break;
      s.emit(pos);
      continue;
    }
    pos = s.whitespace(pos);
  }
}

}  // namespace tandem::tokenizer
