// Byte-level BPE (tokenizer.ggml.model = gpt2): pre-tokenize, map every byte of a word to its printable
// stand-in, then apply merges lowest rank first (leftmost first among equal ranks).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tandem/tokenizer/flat_map.h"
#include "tandem/tokenizer/pretokenizer.h"
#include "tandem/tokenizer/vocab.h"

namespace tandem::tokenizer {

class BpeModel {
 public:
  // `merges` are "left right" strings in rank order (tokenizer.ggml.merges). The vocab must outlive the
  // model.
  BpeModel(const Vocab& vocab, std::span<const std::string_view> merges,
           const std::vector<std::string>& regexes);

  // Appends the ids of one piece of raw text (no special tokens in it). Thread safe.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  struct Scratch;

  // Symbol ids extend the vocabulary's ids with strings that appear only in merges (id >= n_vocab).
  int32_t symbol_id(std::string_view s, bool create);
  std::string_view symbol_text(int32_t id) const;
  void encode_word(std::string_view word, Scratch& scratch, std::vector<int32_t>& out) const;
  void emit_symbol(int32_t id, std::string_view raw, std::vector<int32_t>& out) const;

  const Vocab& vocab_;
  PreTokenizer pre_;
  std::vector<std::string> extra_text_;                 // symbol id - n_vocab -> text
  std::unordered_map<std::string, int32_t> extra_ids_;  // text -> symbol id (>= n_vocab)
  PairMap merges_;                                      // (left id, right id) -> {rank, merged id}
  std::array<int32_t, 256> byte_symbol_{};              // symbol id of each byte's stand-in, or -1
};

}  // namespace tandem::tokenizer
