// Splits text around the special tokens written in it, before any model-specific tokenization.
//
// As in the reference, special tokens are taken longest text first: each one splits every remaining piece of
// plain text at all its occurrences, left to right. User-defined tokens are always recognized; control and
// unknown tokens only when parsing special tokens was asked for. Tokens with the lstrip / rstrip attribute
// swallow the whitespace before / after them.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tandem/tokenizer/vocab.h"

namespace tandem::tokenizer {

// A special token (token >= 0) or the plain text [offset, offset + length) of the input.
struct Fragment {
  int32_t token = -1;
  uint32_t offset = 0;
  uint32_t length = 0;
};

class SpecialTokenSplitter {
 public:
  explicit SpecialTokenSplitter(const Vocab& vocab);  // the vocab must outlive the splitter

  // Thread safe. An empty text gives no fragments.
  void split(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;

 private:
  // Which special tokens occur in `text` at all (one pass over the text with a trie), as indices into
  // vocab.special_tokens.
  void find_candidates(std::string_view text, std::vector<uint8_t>& present) const;

  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t special_index = -1;                         // index into vocab.special_tokens
  };

  const Vocab& vocab_;
  std::vector<Node> nodes_;        // trie; node 0 is the root
  std::array<int32_t, 256> root_;  // root children by byte, -1 when none
};

}  // namespace tandem::tokenizer
