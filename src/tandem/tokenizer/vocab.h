// The vocabulary a tokenizer is built from: token texts, scores and attributes, the special ids and flags,
// all read from a GGUF file's `tokenizer.ggml.*` metadata with the reference implementation's defaults.
// Immutable after loading; safe to share between threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/tokenizer/flat_map.h"

namespace tandem::tokenizer {

enum class VocabKind { kSpm, kBpe, kWpm, kUgm };

// Token attributes (a bit set: the reference adds the control bit to tokens it recognizes as end-of-turn).
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrLstrip = 1u << 7,  // a matched special token swallows the whitespace before it
  kAttrRstrip = 1u << 8,  // ... and after it
};

// GGUF `tokenizer.ggml.token_type` values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

struct Vocab {
  VocabKind kind = VocabKind::kSpm;
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre ("default" when absent)

  // Token texts live in one arena; text(id) is a view into it. (A vector, so that moving the Vocab keeps the
  // views in text_to_id valid.)
  std::vector<char> arena;
  std::vector<uint32_t> text_offset;  // (n_vocab + 1)
  std::vector<float> scores;          // (n_vocab)
  std::vector<uint32_t> attrs;        // (n_vocab) TokenAttr bits
  StringIndex text_to_id;
  size_t max_token_len = 0;

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1, mask = -1;
  int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_sep = false;
  bool add_space_prefix = false;
  bool remove_extra_whitespaces = false;  // unigram normalizer
  bool ignore_merges = false;
  bool lowercase = true;      // WordPiece normalizer
  bool strip_accents = true;  // WordPiece normalizer

  std::vector<int32_t> eog_ids;         // sorted
  std::vector<int32_t> special_tokens;  // control / user-defined / unknown ids, longest text first

  int32_t n_vocab() const { return static_cast<int32_t>(scores.size()); }
  bool valid(int32_t id) const { return id >= 0 && id < n_vocab(); }
  std::string_view text(int32_t id) const {
    return std::string_view(arena.data() + text_offset[id], text_offset[id + 1] - text_offset[id]);
  }
  int32_t find(std::string_view s) const { return text_to_id.find(s); }
  bool has_attr(int32_t id, uint32_t attr) const { return (attrs[id] & attr) != 0; }
  bool is_eog(int32_t id) const;
  // Id of the byte token for `b`: "<0xNN>" (SentencePiece style), else the one-character token.
  int32_t byte_token(uint8_t b) const;
};

// Reads the vocabulary part of the metadata. Pre-tokenizer specific defaults (add_bos for llama3, ...) are
// applied by the caller through `apply_pre_defaults` before the metadata flags are read, as in the reference.
struct PreDefaults {
  bool add_bos = false;
  bool ignore_merges = false;
  bool clear_bos = false;  // the reference drops the default BOS id for some pre-tokenizers
  bool add_sep = false;
};
Vocab load_vocab(const gguf::File& file, const PreDefaults& pre_defaults);

// Parses `tokenizer.ggml.model` into a kind; throws tandem::Error naming the value when unsupported.
VocabKind parse_vocab_kind(const gguf::File& file);

}  // namespace tandem::tokenizer
