#include "tandem/sampling/token_mask.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include "tandem/util/error.h"

namespace tandem::sampling {

void TokenMask::reset(int32_t n_vocab) {
  n_vocab_ = n_vocab;
  words_.assign((static_cast<size_t>(n_vocab) + 63) / 64, 0);
}

int32_t TokenMask::count() const {
  int32_t n = 0;
  for (uint64_t w : words_) n += std::popcount(w);
  return n;
}

std::vector<int32_t> TokenMask::allowed_ids() const {
  std::vector<int32_t> ids;
  for (size_t w = 0; w < words_.size(); ++w)
    for (uint64_t bits = words_[w]; bits != 0; bits &= bits - 1)
      ids.push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(std::countr_zero(bits))));
  return ids;
}

void apply_token_mask(std::span<float> logits, const TokenMask& mask) {
  TANDEM_CHECK(logits.size() == static_cast<size_t>(mask.n_vocab()), "token mask and logits differ in size");
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const auto words = mask.words();
  for (size_t w = 0; w < words.size(); ++w) {
    const uint64_t refused = ~words[w];
    if (refused == 0) continue;
    const size_t end = std::min(logits.size(), (w + 1) * 64);
    if (refused == ~uint64_t{0}) {
      std::fill(logits.begin() + static_cast<ptrdiff_t>(w * 64), logits.begin() + static_cast<ptrdiff_t>(end),
                kNegInf);
      continue;
    }
    for (size_t i = w * 64; i < end; ++i)
      if ((refused >> (i & 63)) & 1) logits[i] = kNegInf;
  }
}

std::shared_ptr<const TokenTrie> TokenTrie::build(const tokenizer::Tokenizer& tokenizer) {
  const int32_t n = tokenizer.n_vocab();
  std::vector<std::string> pieces(static_cast<size_t>(n));
  std::vector<bool> eog(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    eog[static_cast<size_t>(id)] = tokenizer.is_eog(id);
    // Control tokens have no text here: they can only end generation (EOG) or are never allowed.
    if (!tokenizer.is_control(id)) pieces[static_cast<size_t>(id)] = tokenizer.token_to_piece(id);
  }
  return build(pieces, eog);
}

std::shared_ptr<const TokenTrie> TokenTrie::build(const std::vector<std::string>& pieces,
                                                  const std::vector<bool>& eog) {
  TANDEM_CHECK(pieces.size() == eog.size(), "token pieces and end-of-generation flags differ in count");
  TANDEM_CHECK(pieces.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
               "vocabulary too large");
  auto trie = std::make_shared<TokenTrie>();
  const auto n = static_cast<int32_t>(pieces.size());
  trie->pieces_ = pieces;
  trie->is_eog_.assign(pieces.size(), 0);
  std::vector<int32_t> order;
  // Node depths are 16-bit: a longer piece (none exists in practice) is dropped, so never allowed.
  constexpr size_t kMaxPiece = std::numeric_limits<uint16_t>::max();
  for (int32_t id = 0; id < n; ++id) {
    if (trie->pieces_[static_cast<size_t>(id)].size() > kMaxPiece)
      trie->pieces_[static_cast<size_t>(id)].clear();
    if (eog[static_cast<size_t>(id)]) {
      trie->is_eog_[static_cast<size_t>(id)] = 1;
      trie->eog_tokens_.push_back(id);
    } else if (!trie->pieces_[static_cast<size_t>(id)].empty()) {
      order.push_back(id);
    }
  }
  // Sorted pieces give the preorder directly: each piece adds nodes below its common prefix with the one
  // before it.
  const std::vector<std::string>& kept = trie->pieces_;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return kept[static_cast<size_t>(a)] < kept[static_cast<size_t>(b)];
  });
  std::string_view previous;
  std::vector<int32_t> node_at_depth(1, -1);  // [d]: last node created at depth d on the current path
  for (int32_t id : order) {
    const std::string_view piece = kept[static_cast<size_t>(id)];
    size_t common = 0;
    while (common < previous.size() && common < piece.size() && previous[common] == piece[common]) ++common;
    if (node_at_depth.size() < piece.size() + 1) node_at_depth.resize(piece.size() + 1, -1);
    for (size_t d = common + 1; d <= piece.size(); ++d) {
      Node node{};
      node.depth = static_cast<uint16_t>(d);
      node.byte = static_cast<uint8_t>(piece[d - 1]);
      node.tokens_begin = node.tokens_end = static_cast<int32_t>(trie->tokens_.size());
      node_at_depth[d] = static_cast<int32_t>(trie->nodes_.size());
      trie->nodes_.push_back(node);
    }
    // Tokens are appended in node order: this piece's node is the last one created (or, for a duplicate
    // piece, the same last node).
    Node& last = trie->nodes_[static_cast<size_t>(node_at_depth[piece.size()])];
    trie->tokens_.push_back(id);
    last.tokens_end = static_cast<int32_t>(trie->tokens_.size());
    trie->max_depth_ = std::max(trie->max_depth_, static_cast<int>(piece.size()));
    previous = piece;
  }
  // skip: the next node at the same or a smaller depth.
  std::vector<int32_t> open;
  for (int32_t i = 0; i < static_cast<int32_t>(trie->nodes_.size()); ++i) {
    const uint16_t depth = trie->nodes_[static_cast<size_t>(i)].depth;
    while (!open.empty() && trie->nodes_[static_cast<size_t>(open.back())].depth >= depth) {
      trie->nodes_[static_cast<size_t>(open.back())].skip = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  for (int32_t i : open)
    trie->nodes_[static_cast<size_t>(i)].skip = static_cast<int32_t>(trie->nodes_.size());
  return trie;
}

GrammarMatcher::Shared::Shared(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenTrie> t)
    : grammar(std::move(g)),
      trie(std::move(t)),
      states(*grammar),
      walk_states(static_cast<size_t>(trie->max_depth()) + 1),
      words_per_mask((static_cast<size_t>(trie->n_vocab()) + 63) / 64) {}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar,
                               std::shared_ptr<const TokenTrie> trie) {
  TANDEM_CHECK(grammar != nullptr && trie != nullptr, "a grammar matcher needs a grammar and a token trie");
  shared_ = std::make_shared<Shared>(std::move(grammar), std::move(trie));
  history_.push_back(shared_->states.initial());
}

std::span<const uint64_t> GrammarMatcher::mask_words(int32_t state) {
  Shared& s = *shared_;
  const size_t words = s.words_per_mask;
  // find() before inserting: emplace() would allocate a node even on a hit, the common case.
  auto it = s.mask_slots.find(state);
  if (it == s.mask_slots.end()) {
    it = s.mask_slots.emplace(state, s.mask_slots.size()).first;
    s.masks.resize(s.masks.size() + words, 0);
    uint64_t* bits = s.masks.data() + it->second * words;
    const TokenTrie& trie = *s.trie;
    const auto& nodes = trie.nodes();
    const int32_t* tokens = trie.tokens().data();
    int32_t* walk = s.walk_states.data();
    walk[0] = state;
    const auto n_nodes = static_cast<int32_t>(nodes.size());
    for (int32_t i = 0; i < n_nodes;) {
      const TokenTrie::Node& node = nodes[static_cast<size_t>(i)];
      const int32_t next = s.states.next(walk[node.depth - 1], node.byte);
      if (next == GrammarStates::kDead) {
        i = node.skip;
        continue;
      }
      walk[node.depth] = next;
      for (int32_t t = node.tokens_begin; t < node.tokens_end; ++t) {
        const auto id = static_cast<uint32_t>(tokens[t]);
        bits[id >> 6] |= uint64_t{1} << (id & 63);
      }
      ++i;
    }
    if (s.states.accepting(state))
      for (int32_t id : trie.eog_tokens())
        bits[static_cast<uint32_t>(id) >> 6] |= uint64_t{1} << (static_cast<uint32_t>(id) & 63);
  }
  return {s.masks.data() + it->second * words, words};
}

void GrammarMatcher::fill_mask(TokenMask& mask) {
  mask.reset(shared_->trie->n_vocab());
  if (terminated()) return;
  const auto words = mask_words(history_.back());
  std::memcpy(mask.words().data(), words.data(), words.size() * sizeof(uint64_t));
}

bool GrammarMatcher::can_accept(int32_t id) {
  const TokenTrie& trie = *shared_->trie;
  if (id < 0 || id >= trie.n_vocab())
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary (" +
                std::to_string(trie.n_vocab()) + " tokens)");
  const int32_t state = history_.back();
  if (state == kTerminated) return false;
  if (trie.is_eog(id)) return shared_->states.accepting(state);
  const std::string_view piece = trie.piece(id);
  return !piece.empty() && shared_->states.advance(state, piece) != GrammarStates::kDead;
}

bool GrammarMatcher::accept_token(int32_t id) {
  if (!can_accept(id)) return false;
  const TokenTrie& trie = *shared_->trie;
  history_.push_back(trie.is_eog(id) ? kTerminated
                                     : shared_->states.advance(history_.back(), trie.piece(id)));
  return true;
}

size_t GrammarMatcher::accept_prefix(std::span<const int32_t> ids) {
  size_t n = 0;
  while (n < ids.size() && accept_token(ids[n])) ++n;
  return n;
}

bool GrammarMatcher::accept_text(std::string_view text) {
  if (terminated()) return false;
  const int32_t next = shared_->states.advance(history_.back(), text);
  if (next == GrammarStates::kDead) return false;
  history_.push_back(next);
  return true;
}

void GrammarMatcher::rollback_to(size_t position) {
  TANDEM_CHECK(position <= this->position(), "cannot roll a grammar matcher forward");
  history_.resize(position + 1);
}

bool GrammarMatcher::complete() const {
  const int32_t state = history_.back();
  return state != kTerminated && shared_->states.accepting(state);
}

bool GrammarMatcher::must_end() {
  if (!complete()) return false;
  const int32_t state = history_.back();
  for (int byte = 0; byte < 256; ++byte)
    if (shared_->states.next(state, static_cast<uint8_t>(byte)) != GrammarStates::kDead) return false;
  return true;
}

}  // namespace tandem::sampling
