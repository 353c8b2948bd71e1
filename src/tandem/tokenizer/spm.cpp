#include "tandem/tokenizer/spm.h"

#include <algorithm>

#include "tandem/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  uint32_t size;  // bytes of left + right when the bigram was found
};

// Heap order: highest score first, then leftmost.
struct BigramAfter {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  }
};

bool spaces_only_lead(std::string_view token) {
  size_t lead = 0;
  while (token.substr(lead, kSpace.size()) == kSpace) lead += kSpace.size();
  return token.find(kSpace, lead) == std::string_view::npos;
}

}  // namespace

struct SpmModel::Scratch {
  WordCache cache;
  std::vector<uint32_t> start;  // (n_symbols) byte offset of the symbol in the chunk
  std::vector<uint32_t> len;    // (n_symbols) bytes; 0 once merged into its left neighbour
  std::vector<int32_t> prev;    // (n_symbols)
  std::vector<int32_t> next;    // (n_symbols)
  std::vector<Bigram> heap;
};

SpmModel::SpmModel(const Vocab& vocab) : vocab_(vocab) {
  split_at_spaces_ = true;
  for (int32_t id = 0; id < vocab.n_vocab() && split_at_spaces_; ++id)
    split_at_spaces_ = spaces_only_lead(vocab.text(id));
}

void SpmModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  Scratch s;
  if (!split_at_spaces_) {
    encode_chunk(text, s, out);
    return;
  }
  // Cut before every U+2581 character that follows something else, walking characters the way the symbols
  // are formed (lead-byte lengths, unvalidated).
  auto encode_cached = [&](std::string_view chunk) {
    if (s.cache.lookup(chunk, out)) return;
    size_t from = out.size();
    encode_chunk(chunk, s, out);
    s.cache.store(chunk, out, from);
  };
  size_t chunk_start = 0;
  bool prev_space = false;
  for (size_t i = 0; i < text.size();) {
    size_t n = std::min(utf8_lead_length(static_cast<unsigned char>(text[i])), text.size() - i);
    bool space = text.substr(i, n) == kSpace;
    if (space && !prev_space && i > chunk_start) {
      encode_cached(text.substr(chunk_start, i - chunk_start));
      chunk_start = i;
    }
    prev_space = space;
    i += n;
  }
  if (chunk_start < text.size()) encode_cached(text.substr(chunk_start));
}

void SpmModel::encode_chunk(std::string_view text, Scratch& s, std::vector<int32_t>& out) const {
  s.start.clear();
  s.len.clear();
  for (size_t i = 0; i < text.size();) {
    size_t n = std::min(utf8_lead_length(static_cast<unsigned char>(text[i])), text.size() - i);
    s.start.push_back(static_cast<uint32_t>(i));
    s.len.push_back(static_cast<uint32_t>(n));
    i += n;
  }
  const auto n_sym = static_cast<int32_t>(s.start.size());
  s.prev.resize(n_sym);
  s.next.resize(n_sym);
  for (int32_t i = 0; i < n_sym; ++i) {
    s.prev[i] = i - 1;
    s.next[i] = i + 1 < n_sym ? i + 1 : -1;
  }

  s.heap.clear();
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    uint32_t size = s.len[left] + s.len[right];
    int32_t id = vocab_.find(text.substr(s.start[left], size));
    if (id < 0) return;
    s.heap.push_back(Bigram{vocab_.scores[id], left, right, size});
    std::push_heap(s.heap.begin(), s.heap.end(), BigramAfter{});
  };
  for (int32_t i = 1; i < n_sym; ++i) consider(i - 1, i);

  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), BigramAfter{});
    Bigram b = s.heap.back();
    s.heap.pop_back();
    uint32_t& left_len = s.len[b.left];
    uint32_t& right_len = s.len[b.right];
    if (left_len == 0 || right_len == 0 || left_len + right_len != b.size) continue;  // stale
    left_len += right_len;
    right_len = 0;
    s.next[b.left] = s.next[b.right];
    if (s.next[b.right] >= 0) s.prev[s.next[b.right]] = b.left;
    consider(s.prev[b.left], b.left);
    consider(b.left, s.next[b.left]);
  }

  for (int32_t i = n_sym > 0 ? 0 : -1; i >= 0; i = s.next[i]) {
    std::string_view piece = text.substr(s.start[i], s.len[i]);
    int32_t id = vocab_.find(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char c : piece) {
      int32_t byte_id = vocab_.byte_token(c);
      if (byte_id < 0) byte_id = vocab_.unk;
      if (byte_id >= 0) out.push_back(byte_id);
    }
  }
}

}  // namespace tandem::tokenizer
