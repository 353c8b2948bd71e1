// SentencePiece-style BPE (tokenizer.ggml.model = llama): start from UTF-8 characters and repeatedly merge
// the adjacent pair whose concatenation is the highest-scoring token (leftmost first among equal scores);
// whatever is left that is not a token falls back to byte tokens (<0xNN>).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tandem/tokenizer/vocab.h"

namespace tandem::tokenizer {

class SpmModel {
 public:
  explicit SpmModel(const Vocab& vocab);  // the vocab must outlive the model

  // Appends the ids of `text`, whose spaces are already escaped as U+2581. Thread safe.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  struct Scratch;
  void encode_chunk(std::string_view chunk, Scratch& scratch, std::vector<int32_t>& out) const;

  const Vocab& vocab_;
  // True when no token has U+2581 after anything but a leading run of U+2581: then no merge can cross the
  // start of a space run, and the text can be encoded one word at a time with the same result.
  bool split_at_spaces_ = false;
};

}  // namespace tandem::tokenizer
