// Token masks from a grammar: which tokens of a vocabulary may come next so that the output stays a prefix
// of some text the grammar matches.
//
// The vocabulary's token pieces (their decoded bytes, as the text continues a prompt: every piece whole)
// are laid out as a byte trie in preorder. A mask for a grammar state is one linear pass over the trie that
// advances the grammar's lazily built DFA (GrammarStates) one byte per trie edge and skips the whole subtree
// below an edge the grammar refuses; the token ids at each surviving node are allowed. Masks are cached per
// DFA state, so a state that comes back (inside a string, between properties) costs a 4 KB copy.
// End-of-generation tokens are allowed exactly when the text so far is a complete match; other tokens with
// no text (control tokens) never are.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tandem/sampling/grammar.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::sampling {

// One bit per token id: set = allowed.
class TokenMask {
 public:
  TokenMask() = default;
  explicit TokenMask(int32_t n_vocab) { reset(n_vocab); }

  // Resizes to n_vocab ids, all refused; reuses the storage when large enough.
  void reset(int32_t n_vocab);
  int32_t n_vocab() const { return n_vocab_; }
  bool test(int32_t id) const {
    return (words_[static_cast<size_t>(id) >> 6] >> (static_cast<uint32_t>(id) & 63)) & 1;
  }
  void set(int32_t id) {
    words_[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (static_cast<uint32_t>(id) & 63);
  }
  int32_t count() const;
  std::vector<int32_t> allowed_ids() const;
  std::span<uint64_t> words() { return words_; }
  std::span<const uint64_t> words() const { return words_; }

 private:
  std::vector<uint64_t> words_;  // (ceil(n_vocab / 64)) bit i of word w is id 64 w + i
  int32_t n_vocab_ = 0;
};

// logits[i] = -inf for every id the mask refuses. logits.size() must equal mask.n_vocab().
void apply_token_mask(std::span<float> logits, const TokenMask& mask);

// The pieces of a vocabulary as a byte trie in preorder. Immutable; safe to share between threads and
// between grammars.
class TokenTrie {
 public:
  static std::shared_ptr<const TokenTrie> build(const tokenizer::Tokenizer& tokenizer);
  // pieces[id]: the bytes of token id; eog[id]: whether it ends generation. Empty pieces are never allowed.
  static std::shared_ptr<const TokenTrie> build(const std::vector<std::string>& pieces,
                                                const std::vector<bool>& eog);

  struct Node {
    int32_t skip;          // index of the first node after this node's subtree
    int32_t tokens_begin;  // this node's token ids: tokens()[tokens_begin, tokens_end)
    int32_t tokens_end;
    uint16_t depth;  // bytes from the root: 1 for a piece's first byte
    uint8_t byte;    // the byte on the edge into this node
  };

  int32_t n_vocab() const { return static_cast<int32_t>(pieces_.size()); }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::span<const int32_t> tokens() const { return tokens_; }
  std::span<const int32_t> eog_tokens() const { return eog_tokens_; }
  bool is_eog(int32_t id) const { return is_eog_[static_cast<size_t>(id)] != 0; }
  std::string_view piece(int32_t id) const { return pieces_[static_cast<size_t>(id)]; }
  int max_depth() const { return max_depth_; }

 private:
  std::vector<Node> nodes_;          // preorder, without the root
  std::vector<int32_t> tokens_;      // token ids, grouped by node
  std::vector<int32_t> eog_tokens_;  // ascending
  std::vector<uint8_t> is_eog_;      // (n_vocab)
  std::vector<std::string> pieces_;  // (n_vocab)
  int max_depth_ = 0;
};

// The grammar state of one output, token by token, with the masks that keep it valid.
//
// A matcher and its clones share the grammar's DFA and mask cache (which grow as new states are reached),
// so they must all be used from one thread at a time; separate outputs on separate threads each construct
// their own matcher. The Grammar and TokenTrie are shared and never modified.
//
// Positions count accepted tokens: position() is 0 at the start and grows by one per accept_token() (or
// accept_text()). For speculative decoding, a draft is checked with accept_prefix() (which stops at the
// first token the grammar refuses), fill_mask() at each drafted position gives the mask verification
// applies to the target's distribution, and rollback_to() discards the rejected tail.
class GrammarMatcher {
 public:
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie);

  // A copy at the same position, sharing the cache (see the class comment).
  GrammarMatcher clone() const { return *this; }

  // The tokens allowed next; `mask` is resized to the vocabulary. After an end-of-generation token, none.
  void fill_mask(TokenMask& mask);
  // Whether `id` is allowed next (the same answer fill_mask() gives, without building a mask).
  bool can_accept(int32_t id);
  // Advances by `id` and returns true when it is allowed; otherwise returns false and changes nothing.
  // Throws tandem::Error for an id outside the vocabulary.
  bool accept_token(int32_t id);
  // accept_token() for each of `ids` in order until one is refused; returns how many were accepted.
  size_t accept_prefix(std::span<const int32_t> ids);
  // Advances by raw text (one position), e.g. a forced prefix; false (and no change) if the grammar refuses.
  bool accept_text(std::string_view text);

  size_t position() const { return history_.size() - 1; }
  // Goes back to an earlier position (<= position()).
  void rollback_to(size_t position);
  // Whether the text so far is a complete match (end of generation is allowed now).
  bool complete() const;
  // Whether an end-of-generation token has been accepted.
  bool terminated() const { return history_.back() == kTerminated; }
  // Whether the text so far is complete and no byte can extend it: only end of generation may follow, so a
  // driver can end the output here without asking the model.
  bool must_end();

  // Size of the shared DFA: states reached so far, and how many have a cached mask.
  size_t n_states() const { return shared_->states.n_states(); }
  size_t n_cached_masks() const { return shared_->mask_slots.size(); }

 private:
  static constexpr int32_t kTerminated = -3;

  struct Shared {
    Shared(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenTrie> t);
    std::shared_ptr<const Grammar> grammar;
    std::shared_ptr<const TokenTrie> trie;
    GrammarStates states;
    std::unordered_map<int32_t, size_t> mask_slots;  // DFA state -> index of its mask in masks
    std::vector<uint64_t> masks;                     // (n_cached, words per mask)
    std::vector<int32_t> walk_states;                // (max_depth + 1) DFA state per trie depth
    size_t words_per_mask;
  };

  // The cached mask's words for `state`, computed on first use.
  std::span<const uint64_t> mask_words(int32_t state);

  std::shared_ptr<Shared> shared_;
  std::vector<int32_t> history_;  // DFA state at each position; kTerminated after end of generation
};

}  // namespace tandem::sampling
