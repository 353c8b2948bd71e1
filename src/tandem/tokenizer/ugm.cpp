#include "tandem/tokenizer/ugm.h"

#include <algorithm>
#include <cfloat>
#include <cstring>

#include "tandem/tokenizer/unicode.h"
#include "tandem/util/error.h"

namespace tandem::tokenizer {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
constexpr double kUnknownPenalty = 10.0;

// Length of the UTF-8 sequence at the start of `s` under the reference's lenient rules, 0 when malformed.
size_t lenient_char_length(std::string_view s) {
  auto c = static_cast<unsigned char>(s[0]);
  size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (len == 0 || len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k)
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) return 0;
  return len;
}

}  // namespace

void UgmModel::Trie::insert(std::string_view key, int32_t id) {
  int32_t node = 0;
  for (unsigned char c : key) {
    int32_t next = child(node, c);
    if (next < 0) {
      next = static_cast<int32_t>(value.size());
      value.push_back(-1);
      edges.insert(node, c, PairMap::Value{next, 0});
    }
    node = next;
  }
  if (value[node] < 0) value[node] = id;
}

UgmModel::UgmModel(const Vocab& vocab, const gguf::File& file) : vocab_(vocab) {
  float min_score = FLT_MAX;
  for (int32_t id = 0; id < vocab.n_vocab(); ++id) {
    const uint32_t attr = vocab.attrs[id];
    if (attr & kAttrNormal) min_score = std::min(min_score, vocab.scores[id]);
    if (attr & (kAttrNormal | kAttrUserDefined | kAttrUnused)) tokens_.insert(vocab.text(id), id);
    if (attr & kAttrUserDefined) user_defined_.insert(vocab.text(id), id);
  }
  unknown_score_ = static_cast<double>(min_score) - kUnknownPenalty;

  // Character map: a little-endian uint32 size, that many bytes of double array, then replacement strings.
  const gguf::Value* map = file.find("tokenizer.ggml.precompiled_charsmap");
  if (!map) return;
  if (map->type != gguf::ValueType::ARRAY ||
      (map->elem_type != gguf::ValueType::U8 && map->elem_type != gguf::ValueType::I8))
    throw Error("'" + file.path() + "': tokenizer.ggml.precompiled_charsmap must be a byte array");
  const uint8_t* bytes = map->elems;
  const size_t size = static_cast<size_t>(map->count);
  uint32_t blob = 0;
  if (size < 4) throw Error("'" + file.path() + "': tokenizer.ggml.precompiled_charsmap is too short");
  std::memcpy(&blob, bytes, 4);
  if (size_t(blob) + 4 >= size || blob % 4 != 0)
    throw Error("'" + file.path() + "': tokenizer.ggml.precompiled_charsmap has an inconsistent size");
  xcda_.resize(blob / 4);
  std::memcpy(xcda_.data(), bytes + 4, blob);
  replacements_.assign(bytes + 4 + blob, bytes + size);
}

uint32_t UgmModel::xcda(size_t index) const {
  if (index >= xcda_.size())
    throw Error("malformed tokenizer.ggml.precompiled_charsmap (index out of range)");
  return xcda_[index];
}

std::string_view UgmModel::normalize_prefix(std::string_view text, size_t offset, size_t* consumed) const {
  // A user-defined token passes through unchanged. As in the reference, the walk counts as long as the trie
  // has a path, even when it stops inside a token.
  size_t walked = 0;
  for (int32_t node = 0; offset + walked < text.size();) {
    node = user_defined_.child(node, static_cast<unsigned char>(text[offset + walked]));
    if (node < 0) break;
    ++walked;
  }
  if (walked > 0) {
    *consumed = walked;
    return text.substr(offset, walked);
  }

  size_t best_len = 0;
  uint32_t best_value = 0;
  if (!xcda_.empty()) {
    auto base = [&](uint32_t node) { return (node >> 10) << ((node & (1u << 9)) >> 6); };
    uint32_t index = base(xcda(0));
    for (size_t pos = offset; pos < text.size(); ++pos) {
      auto c = static_cast<unsigned char>(text[pos]);
      if (c == 0) break;
      index ^= c;
      uint32_t node = xcda(index);
      if ((node & ((1u << 31) | 0xFF)) != c) break;  // not a child of the previous node
      const bool leaf = (node >> 8) & 1;
      index ^= base(node);
      if (leaf) {
        best_len = pos - offset + 1;
        best_value = xcda(index) & ((1u << 31) - 1);
      }
    }
  }
  if (best_len > 0) {
    if (best_value >= replacements_.size())
      throw Error("malformed tokenizer.ggml.precompiled_charsmap (replacement out of range)");
    const char* repl = replacements_.data() + best_value;
    size_t max_len = replacements_.size() - best_value;
    size_t len = strnlen(repl, max_len);
    if (len == max_len)
      throw Error("malformed tokenizer.ggml.precompiled_charsmap (unterminated replacement)");
    *consumed = best_len;
    return std::string_view(repl, len);
  }
  size_t n = lenient_char_length(text.substr(offset));
  if (n == 0) {
    *consumed = 1;
    return kReplacement;
  }
  *consumed = n;
  return text.substr(offset, n);
}

void UgmModel::normalize(std::string_view text, std::string& out) const {
  out.clear();
  out.reserve(text.size() * 3);
  const bool prepend = vocab_.add_space_prefix;
  const bool merge = vocab_.remove_extra_whitespaces;
  bool prepended = false;
  bool in_word = false;
  for (size_t offset = 0; offset < text.size();) {
    size_t consumed = 0;
    std::string_view norm = normalize_prefix(text, offset, &consumed);
    for (char c : norm) {
      if (c != ' ') {
        if (!in_word) {
          in_word = true;
          if ((prepend && !prepended) || merge) {
            out += kSpace;
            prepended = true;
          }
        }
        out += c;
      } else {
        in_word = false;
        if (!merge) out += kSpace;
      }
    }
    offset += consumed;
  }
}

void UgmModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::string norm;
  normalize(text, norm);
  const size_t n = norm.size();
  if (n == 0) return;

  struct Best {
    int32_t token;
    size_t from;
    double score;
  };
  std::vector<Best> best(n + 1, Best{vocab_.unk, 0, -DBL_MAX});
  best[0] = Best{vocab_.unk, 0, 0.0};
  for (size_t offset = 0; offset < n;) {
    const size_t char_len = std::min(utf8_lead_length(static_cast<unsigned char>(norm[offset])), n - offset);
    const double base = best[offset].score;
    bool whole_char = false;
    int32_t node = 0;
    for (size_t end = offset; end < n;) {
      node = tokens_.child(node, static_cast<unsigned char>(norm[end]));
      if (node < 0) break;
      ++end;
      int32_t id = tokens_.value[node];
      if (id < 0) continue;
      if (end - offset == char_len) whole_char = true;
      double score = base + (vocab_.has_attr(id, kAttrUserDefined) ? 0.0 : double(vocab_.scores[id]));
      if (score > best[end].score) best[end] = Best{id, offset, score};
    }
    if (!whole_char) {
      double score = base + unknown_score_;
      if (score > best[offset + char_len].score) best[offset + char_len] = Best{vocab_.unk, offset, score};
    }
    offset += char_len;
  }

  // Walk back from the end; runs of unknown tokens collapse into one.
  const size_t mark = out.size();
  bool prev_unknown = false;
  for (size_t pos = n;;) {
    const Best& b = best[pos];
    const bool unknown = b.token == vocab_.unk;
    if (!(prev_unknown && unknown)) out.push_back(b.token);
    if (b.from == 0) break;
    prev_unknown = unknown;
    pos = b.from;
  }
  std::reverse(out.begin() + static_cast<ptrdiff_t>(mark), out.end());
}

}  // namespace tandem::tokenizer
