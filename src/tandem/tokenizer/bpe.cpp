#include "tandem/tokenizer/bpe.h"

#include <algorithm>

#include "tandem/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

// A candidate merge of symbol `left` with the symbol after it; stale once either symbol changed.
struct Candidate {
  int32_t rank;
  int32_t left;
  int32_t left_id;
  int32_t right_id;
  int32_t result;
};

// Heap order: lowest rank first, then leftmost.
struct CandidateAfter {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};

}  // namespace

// Buffers reused across the words of one encode() call.
struct BpeModel::Scratch {
  WordCache cache;
  PreTokenized words;
  std::string encoded;        // byte stand-ins of a word, for whole-word lookups
  std::vector<int32_t> id;    // (n_symbols) symbol id, -1 when the text is unknown
  std::vector<int32_t> next;  // (n_symbols) next live symbol, -1 at the end
  std::vector<int32_t> prev;  // (n_symbols) previous live symbol, -1 at the start
  std::vector<uint32_t> end;  // (n_symbols) end of the symbol's bytes in the word
  std::vector<Candidate> heap;
};

BpeModel::BpeModel(const Vocab& vocab, std::span<const std::string_view> merges,
                   const std::vector<std::string>& regexes)
    : vocab_(vocab), pre_(regexes) {
  const ByteAlphabet& alphabet = byte_alphabet();
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    std::string_view m = merges[rank];
    size_t space = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    if (space == std::string_view::npos) continue;  // malformed: can never apply
    std::string_view left = m.substr(0, space), right = m.substr(space + 1);
    if (left.empty() || right.empty()) continue;
    int32_t l = symbol_id(left, true), r = symbol_id(right, true);
    std::string joined;
    joined.reserve(m.size() - 1);
    joined.append(left).append(right);
    int32_t result = symbol_id(joined, true);
    merges_.insert(l, r, PairMap::Value{static_cast<int32_t>(rank), result});  // the first rank wins
  }
  for (int b = 0; b < 256; ++b) byte_symbol_[b] = symbol_id(alphabet.byte_to_text[b], false);
}

int32_t BpeModel::symbol_id(std::string_view s, bool create) {
  int32_t id = vocab_.find(s);
  if (id >= 0) return id;
  auto it = extra_ids_.find(std::string(s));
  if (it != extra_ids_.end()) return it->second;
  if (!create) return -1;
  id = vocab_.n_vocab() + static_cast<int32_t>(extra_text_.size());
  extra_text_.emplace_back(s);
  extra_ids_.emplace(std::string(s), id);
  return id;
}

std::string_view BpeModel::symbol_text(int32_t id) const {
  return id < vocab_.n_vocab() ? vocab_.text(id) : std::string_view(extra_text_[id - vocab_.n_vocab()]);
}

void BpeModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  Scratch s;
  pre_.split(text, s.words);
  std::string_view all(s.words.text);
  uint32_t begin = 0;
  for (uint32_t end : s.words.ends) {
    std::string_view word = all.substr(begin, end - begin);
    begin = end;
    if (s.cache.lookup(word, out)) continue;
    size_t from = out.size();
    encode_word(word, s, out);
    s.cache.store(word, out, from);
  }
}

void BpeModel::encode_word(std::string_view word, Scratch& s, std::vector<int32_t>& out) const {
  const ByteAlphabet& alphabet = byte_alphabet();
  if (vocab_.ignore_merges) {
    s.encoded.clear();
    for (unsigned char c : word) s.encoded += alphabet.byte_to_text[c];
    int32_t whole = vocab_.find(s.encoded);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }

  // Symbols start as one per byte: each byte's stand-in is one character of the encoded word.
  const auto n = static_cast<int32_t>(word.size());
  s.id.resize(n);
  s.next.resize(n);
  s.prev.resize(n);
  s.end.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    s.id[i] = byte_symbol_[static_cast<unsigned char>(word[i])];
    s.prev[i] = i - 1;
    s.next[i] = i + 1 < n ? i + 1 : -1;
    s.end[i] = static_cast<uint32_t>(i + 1);
  }

  s.heap.clear();
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = s.next[left];
    if (right < 0 || s.id[left] < 0 || s.id[right] < 0) return;
    const PairMap::Value* m = merges_.find(s.id[left], s.id[right]);
    if (!m) return;
    s.heap.push_back(Candidate{m->a, left, s.id[left], s.id[right], m->b});
    std::push_heap(s.heap.begin(), s.heap.end(), CandidateAfter{});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), CandidateAfter{});
    Candidate c = s.heap.back();
    s.heap.pop_back();
    int32_t left = c.left;
    int32_t right = s.next[left];
    if (s.id[left] != c.left_id || right < 0 || s.id[right] != c.right_id) continue;  // stale
    s.id[left] = c.result;
    s.end[left] = s.end[right];
    s.next[left] = s.next[right];
    if (s.next[left] >= 0) s.prev[s.next[left]] = left;
    s.id[right] = -2;  // dead
    consider(s.prev[left]);
    consider(left);
  }

  uint32_t start = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = s.next[i]) {
    emit_symbol(s.id[i], word.substr(start, s.end[i] - start), out);
    start = s.end[i];
  }
}

void BpeModel::emit_symbol(int32_t id, std::string_view raw, std::vector<int32_t>& out) const {
  if (id >= 0 && id < vocab_.n_vocab()) {
    out.push_back(id);
    return;
  }
  // Not a token: like the reference, look up each byte of the encoded text as a one-byte token (only
  // printable ASCII can match) and drop the rest.
  std::string encoded;
  if (id >= vocab_.n_vocab()) {
    encoded = symbol_text(id);
  } else {
    for (unsigned char c : raw) encoded += byte_alphabet().byte_to_text[c];
  }
  for (char c : encoded) {
    int32_t t = vocab_.find(std::string_view(&c, 1));
    if (t >= 0) out.push_back(t);
  }
}

}  // namespace tandem::tokenizer
