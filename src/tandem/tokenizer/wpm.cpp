#include "tandem/tokenizer/wpm.h"

#include <algorithm>
#include <string>

#include "tandem/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

constexpr std::string_view kWordStart = "\xE2\x96\x81";  // U+2581
constexpr size_t kMaxWordChars = 100;                    // longer words are unknown in BERT

}  // namespace

WpmModel::WpmModel(const Vocab& vocab) : vocab_(vocab) {
  size_t hashed = 0, marked = 0;
  for (int32_t id = 0; id < vocab.n_vocab(); ++id) {
    std::string_view t = vocab.text(id);
    if (t.size() > 2 && t.substr(0, 2) == "##") ++hashed;
    if (t.substr(0, kWordStart.size()) == kWordStart) ++marked;
  }
  hash_continuations_ = hashed > marked;
}

void WpmModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<uint32_t> cps;
  decode_utf8_lenient(text, cps);
  std::string word;
  auto finish = [&] {
    if (!word.empty()) encode_word(word, out);
    word.clear();
  };
  for (uint32_t cp : cps) {
    if (vocab_.strip_accents) cp = cp_nfd_first(cp);
    CpFlags f = cp_flags(cp);
    if (f.is_whitespace()) {
      finish();
      continue;
    }
    if (cp == 0 || cp == 0xFFFD || f.is_control()) continue;
    if (vocab_.strip_accents && f.is_accent_mark()) continue;
    uint32_t c = vocab_.lowercase ? cp_to_lower(cp) : cp;
    if (f.is_punctuation() || (cp < 0x7F && f.is_symbol()) || cp_is_cjk_ideograph(cp)) {
      finish();
      append_utf8_raw(word, c);
      finish();
    } else {
      append_utf8_raw(word, c);
    }
  }
  finish();
}

void WpmModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  const size_t mark = out.size();
  if (!hash_continuations_) {
    // Greedy longest match over "▁word", byte positions, any token.
    std::string marked(kWordStart);
    marked += word;
    const size_t n = marked.size();
    for (size_t i = 0; i < n;) {
      size_t j = std::min(n, i + vocab_.max_token_len);
      int32_t id = -1;
      for (; j > i; --j) {
        id = vocab_.find(std::string_view(marked).substr(i, j - i));
        if (id >= 0) break;
      }
      if (id < 0) {
        out.resize(mark);
        break;
      }
      out.push_back(id);
      i = j;
    }
  } else {
    size_t chars = 0;
    for (unsigned char c : word) chars += (c & 0xC0) != 0x80;
    std::string piece;
    for (size_t i = 0; chars <= kMaxWordChars && i < word.size();) {
      int32_t id = -1;
      size_t j = word.size();
      for (; j > i; --j) {
        if (j < word.size() && (static_cast<unsigned char>(word[j]) & 0xC0) == 0x80)
          continue;  // mid-character
        piece.assign(i > 0 ? "##" : "");
        piece.append(word.substr(i, j - i));
        id = vocab_.find(piece);
        if (id >= 0) break;
      }
      if (id < 0) {
        out.resize(mark);
        break;
      }
      out.push_back(id);
      i = j;
    }
    if (chars > kMaxWordChars) out.resize(mark);
  }
  if (out.size() == mark && vocab_.unk >= 0) out.push_back(vocab_.unk);
}

}  // namespace tandem::tokenizer
