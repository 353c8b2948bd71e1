// Internals of Tokenizer shared by tokenizer.cpp (loading, encoding) and decode.cpp (pieces, decoding).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tandem/tokenizer/bpe.h"
#include "tandem/tokenizer/special_tokens.h"
#include "tandem/tokenizer/spm.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/tokenizer/ugm.h"
#include "tandem/tokenizer/vocab.h"
#include "tandem/tokenizer/wpm.h"

namespace tandem::tokenizer {

struct Tokenizer::Impl {
  Vocab vocab;
  std::unique_ptr<SpmModel> spm;  // exactly one of the four models is set
  std::unique_ptr<BpeModel> bpe;
  std::unique_ptr<WpmModel> wpm;
  std::unique_ptr<UgmModel> ugm;
  std::unique_ptr<SpecialTokenSplitter> specials;
  std::vector<std::string> pieces;   // (n_vocab) decoded bytes of each token, control tokens empty
  bool strip_leading_space = false;  // decode drops the space the encoder puts in front of the text

  void check_id(int32_t id) const;
  void build_pieces();
};

// Replaces every maximal invalid UTF-8 subsequence with U+FFFD. With `keep_incomplete_tail`, a trailing
// sequence that is valid so far but incomplete is not replaced: its length is returned in *tail and it is
// left out of the result.
std::string repair_utf8(std::string_view bytes, bool keep_incomplete_tail = false, size_t* tail = nullptr);

}  // namespace tandem::tokenizer
