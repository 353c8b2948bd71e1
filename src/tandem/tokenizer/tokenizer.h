// Text <-> token ids, built from a GGUF file's `tokenizer.ggml.*` metadata. Four models are supported:
// SentencePiece-style BPE (`llama`), byte-level BPE (`gpt2`, with the pre-tokenizer `tokenizer.ggml.pre`
// names), WordPiece (`bert`) and unigram (`t5`). Results follow the reference implementation (llama.cpp) id
// for id.
//
// A Tokenizer is immutable after from_gguf() and every method is safe to call from several threads at once.
// It copies what it needs from the file: the gguf::File may be closed afterwards.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/gguf/reader.h"

namespace tandem::tokenizer {

class Tokenizer {
 public:
  // Throws tandem::Error when the metadata has no usable tokenizer (missing vocabulary, unsupported model,
  // unknown tokenizer.ggml.pre, inconsistent special-token settings); the message names the offending value.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special: add BOS / EOS (and SEP for WordPiece) as tokenizer.ggml.add_bos_token / add_eos_token say,
  // with the reference's per-model defaults (SentencePiece and WordPiece add BOS, byte-level BPE only for
  // some pre-tokenizers such as llama3). parse_special: recognize control tokens written in the text (e.g.
  // "<|im_end|>"); user-defined tokens are recognized either way, as in the reference.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // Raw bytes of one token as it appears in decoded text: SentencePiece U+2581 -> space, <0xNN> -> that byte,
  // byte-level BPE stand-ins -> bytes; control and unknown tokens -> empty. May be an incomplete UTF-8
  // sequence. render_special = true gives control tokens their text instead. Throws tandem::Error for an id
  // outside the vocabulary.
  std::string token_to_piece(int32_t id) const { return token_to_piece(id, false); }
  std::string token_to_piece(int32_t id, bool render_special) const;

  // Full text of a sequence: the pieces concatenated, minus the space that SentencePiece-style tokenizers
  // (and WordPiece's word-start marker) put in front of the text, removed from the first non-empty piece even
  // when a BOS token comes first; invalid UTF-8 is replaced by U+FFFD (one per maximal invalid subsequence).
  // Unlike the reference, no "clean up tokenization spaces" pass is applied, so decode(encode(x)) == x
  // wherever the vocabulary can represent x.
  std::string decode(std::span<const int32_t> ids) const;

  int32_t n_vocab() const;
  int32_t bos_id() const;  // -1 when absent
  int32_t eos_id() const;  // -1 when absent
  int32_t eot_id() const;  // end of turn, -1 when absent
  bool add_bos() const;    // whether encode(..., add_special = true, ...) starts with BOS
  bool add_eos() const;

  // End of generation: EOS, EOT, EOM, and the tokens the reference treats as such by their text
  // (<|eot_id|>, <|im_end|>, <end_of_turn>, <|endoftext|>, ...).
  bool is_eog(int32_t id) const;
  bool is_control(int32_t id) const;  // control (or unknown) token: hidden in decoded text

  std::string_view token_text(int32_t id) const;  // the vocabulary entry as stored; throws for a bad id
  int32_t token_id(std::string_view text) const;  // exact vocabulary entry, -1 when absent

  std::string_view model_name() const;  // tokenizer.ggml.model
  std::string_view pre_name() const;    // tokenizer.ggml.pre ("default" when absent)

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;

  friend class StreamDecoder;
};

// Where a run of decoded ids stands in its text. The leading-space rule (see Tokenizer::decode) removes the
// space the encoder put in front of a text, so it belongs to the first piece of a text and to nothing else.
enum class TextPosition {
  kStart,         // the ids begin the text (a whole sequence, or a chat reply read as a message of its own)
  kContinuation,  // the ids follow a prompt of at least one token: every piece is kept whole
};

// Streaming detokenizer for one sequence: feed ids one by one; push() returns the bytes that now form
// complete UTF-8 (an incomplete multi-byte sequence at the end is held back until the next piece completes
// it), and flush() returns what is left, with invalid bytes replaced by U+FFFD. Borrows the tokenizer, which
// must outlive it; not thread safe.
//
// From kStart the concatenated output equals decode() of the same ids. From kContinuation it is the text the
// ids add after their prompt P: decode(P + ids) minus decode(P) whenever decode(P) is not empty and P's
// bytes do not end inside a multi-byte character. After a prompt that decodes to nothing (BOS alone: the
// empty prompt) a generated leading space is kept too, since the model wrote it, not the encoder; bytes that
// would complete a character the prompt left unfinished count as invalid on their own.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, TextPosition position = TextPosition::kStart);
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
  // No non-empty piece seen yet at the start of a text: the leading-space rule still applies.
  bool at_start_;
};

}  // namespace tandem::tokenizer
