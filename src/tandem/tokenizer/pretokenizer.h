// Byte-level BPE pre-tokenization: splits text into words with the list of regexes a `tokenizer.ggml.pre`
// name stands for, the way the reference implementation applies them. Each regex of the list splits every
// current piece further: its matches and the text between them both become pieces, and lookarounds and `$`
// see only the current piece. The reference's regexes are matched with PCRE2 on the reference's "collapsed"
// text (one byte per code point: ASCII as is, other code points as one byte per general category), or, for
// regexes without Unicode categories, on the code points themselves; the two most common regexes (GPT-2's and
// LLaMA-3's) use hand-written scanners instead, as the reference does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/tokenizer/vocab.h"

namespace tandem::tokenizer {

struct PreTokenizerSpec {
  std::vector<std::string> regexes;
  PreDefaults defaults;
  bool add_sep = false;
};

// The spec a `tokenizer.ggml.pre` value names ("default" for an empty name). Throws tandem::Error naming an
// unknown value.
PreTokenizerSpec pre_tokenizer_spec(std::string_view name);

// Words of one piece of text. `text` is the input re-encoded from its leniently decoded code points (invalid
// bytes became U+FFFD, as in the reference); word k is text[ends[k-1], ends[k]).
struct PreTokenized {
  std::string text;
  std::vector<uint32_t> ends;
};

class PreTokenizer {
 public:
  explicit PreTokenizer(const std::vector<std::string>& regexes);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Thread safe: all state of a call lives in `out` and in locals.
  void split(std::string_view text, PreTokenized& out) const;

 private:
  struct Op;
  std::vector<std::unique_ptr<Op>> ops_;
  bool need_collapsed_ = false;
  bool need_wide_ = false;
};

}  // namespace tandem::tokenizer
