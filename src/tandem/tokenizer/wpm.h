// WordPiece (tokenizer.ggml.model = bert), for embedding models: BERT's basic normalization (optional
// lowercasing and accent stripping, control characters dropped, punctuation and CJK ideographs split off),
// then greedy longest-match pieces per word; a word that cannot be covered becomes the unknown token.
//
// Two vocabulary spellings are handled: GGUF conversions mark word starts with U+2581 and store continuation
// pieces bare (the reference's form), while original BERT vocabularies store continuations as "##piece".
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tandem/tokenizer/vocab.h"

namespace tandem::tokenizer {

class WpmModel {
 public:
  explicit WpmModel(const Vocab& vocab);  // the vocab must outlive the model

  // Appends the ids of one piece of raw text. Thread safe.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

  bool hash_continuations() const { return hash_continuations_; }

 private:
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  const Vocab& vocab_;
  bool hash_continuations_ = false;  // "##piece" spelling
};

}  // namespace tandem::tokenizer
