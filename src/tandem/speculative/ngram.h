// N-gram lookup ("prompt lookup") drafting: no model. The last n committed tokens are searched for earlier in
// the prompt and generated text, longest n first (n_max down to n_min); at the most recent earlier
// occurrence, the tokens that followed it are proposed. The proposal reads its own drafted tokens as it
// extends, so a repeating pattern is continued past the end of the text.
#pragma once

#include <vector>

#include "tandem/speculative/draft_source.h"

namespace tandem::speculative {

struct NgramOptions {
  int n_min = 2;  // shortest suffix looked up (>= 1)
  int n_max = 4;  // longest (>= n_min)
};

class NgramSource final : public DraftSource {
 public:
  explicit NgramSource(NgramOptions options = {});

  std::string_view kind() const override { return "ngram"; }
  void begin(std::span<const int32_t> prompt, const DraftSettings& settings) override;
  void propose(std::span<const int32_t> committed, int max_depth, Draft& out) override;
  void accept(std::span<const int32_t> committed, int n_accepted) override;
  // Several continuations merged into one tree: the occurrences of the longest suffix first, most recent
  // first, then those of shorter suffixes, up to tree_continuations of them; each continuation (the first is
  // propose()'s chain) follows the tree's nodes while they agree and branches where it differs, until
  // max_depth or the node budget runs out.
  void propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth, Draft& out) override;

  int tree_continuations = 8;

  // Start of the continuation of the most recent earlier occurrence of text's last n tokens, or -1.
  static int64_t find_continuation(std::span<const int32_t> text, int n);

 private:
  NgramOptions options_;
  std::vector<int64_t> starts_;  // propose_tree: continuation starts found so far
  std::vector<int32_t> path_;    // propose_tree: tokens of the node being extended, root first
};

}  // namespace tandem::speculative
