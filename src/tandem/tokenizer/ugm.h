// Unigram language model (tokenizer.ggml.model = t5; T5, XLM-RoBERTa style vocabularies): normalize with the
// SentencePiece precompiled character map, then pick the segmentation with the highest total score (Viterbi
// over the text's prefixes), characters no token covers becoming the unknown token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/tokenizer/flat_map.h"
#include "tandem/tokenizer/vocab.h"

namespace tandem::tokenizer {

class UgmModel {
 public:
  // Reads tokenizer.ggml.precompiled_charsmap; throws tandem::Error when it is malformed. The vocab must
  // outlive the model.
  UgmModel(const Vocab& vocab, const gguf::File& file);

  // Appends the ids of one piece of raw text. Thread safe.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  // A byte trie: node 0 is the root; edges live in a hash map keyed by (node, byte).
  struct Trie {
    PairMap edges;               // (node, byte) -> {child, -}
    std::vector<int32_t> value;  // (n_nodes) token id ending here, -1 when none
    Trie() : value(1, -1) {}
    void insert(std::string_view key, int32_t id);
    int32_t child(int32_t node, unsigned char c) const {
      const PairMap::Value* v = edges.find(node, c);
      return v ? v->a : -1;
    }
  };

  void normalize(std::string_view text, std::string& out) const;
  // Normalized form of the longest prefix of text[offset:] the character map (or a user-defined token)
  // covers.
  std::string_view normalize_prefix(std::string_view text, size_t offset, size_t* consumed) const;
  uint32_t xcda(size_t index) const;

  const Vocab& vocab_;
  Trie tokens_;        // normal, user-defined and unused tokens
  Trie user_defined_;  // user-defined tokens: copied through normalization untouched
  double unknown_score_ = 0;
  std::vector<uint32_t> xcda_;      // the character map's double array
  std::vector<char> replacements_;  // NUL-terminated replacement strings
};

}  // namespace tandem::tokenizer
