#include "tandem/speculative/ngram.h"

#include <algorithm>

#include "tandem/util/error.h"

namespace tandem::speculative {

NgramSource::NgramSource(NgramOptions options) : options_(options) {
  if (options_.n_min < 1 || options_.n_max < options_.n_min)
    throw Error("n-gram drafting needs 1 <= n_min <= n_max (got " + std::to_string(options_.n_min) + ".." +
                std::to_string(options_.n_max) + ")");
}

void NgramSource::begin(std::span<const int32_t>, const DraftSettings&) {}

int64_t NgramSource::find_continuation(std::span<const int32_t> text, int n) {
  const auto len = static_cast<int64_t>(text.size());
  if (n < 1 || len <= n) return -1;
  const int32_t* key = text.data() + (len - n);
  // Occurrences start at j <= len - n - 1 (strictly before the suffix itself); scan from the most recent.
  for (int64_t j = len - n - 1; j >= 0; --j) {
    if (text[static_cast<size_t>(j)] != key[0]) continue;
    if (std::equal(key, key + n, text.data() + j)) return j + n;
  }
  return -1;
}

void NgramSource::propose(std::span<const int32_t> committed, int max_depth, Draft& out) {
  out.clear();
  for (int n = options_.n_max; n >= options_.n_min; --n) {
    int64_t next = find_continuation(committed, n);
    if (next < 0) continue;
    const auto len = static_cast<int64_t>(committed.size());
    // next < len, and each step appends one token while advancing next by one, so next always stays inside
    // committed + proposal.
    while (static_cast<int>(out.tokens.size()) < max_depth) {
      const int32_t t =
          next < len ? committed[static_cast<size_t>(next)] : out.tokens[static_cast<size_t>(next - len)];
      out.tokens.push_back(t);
      ++next;
    }
    return;
  }
}

void NgramSource::propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth, Draft& out) {
  out.clear();
  const auto len = static_cast<int64_t>(committed.size());
  starts_.clear();
  for (int n = options_.n_max; n >= options_.n_min; --n) {
    if (n < 1 || len <= n) continue;
    const int32_t* key = committed.data() + (len - n);
    for (int64_t j = len - n - 1; j >= 0 && static_cast<int>(starts_.size()) < tree_continuations; --j) {
      if (!std::equal(key, key + n, committed.data() + j)) continue;
      if (std::find(starts_.begin(), starts_.end(), j + n) == starts_.end()) starts_.push_back(j + n);
    }
  }
  for (const int64_t start : starts_) {
    int32_t at = -1;  // the node this continuation has reached (-1: the committed text)
    path_.clear();
    for (int64_t next = start; static_cast<int>(path_.size()) < max_depth; ++next) {
      // Past the end of the text, the continuation reads its own tokens, as propose() does.
      const int32_t t =
          next < len ? committed[static_cast<size_t>(next)] : path_[static_cast<size_t>(next - len)];
      int32_t child = -1;
      for (size_t i = 0; i < out.tokens.size() && child < 0; ++i)
        if (out.tree.parent[i] == at && out.tokens[i] == t) child = static_cast<int32_t>(i);
      if (child < 0) {
        if (static_cast<int>(out.tokens.size()) >= max_nodes) break;
        child = out.tree.add(at);
        out.tokens.push_back(t);
      }
      path_.push_back(t);
      at = child;
    }
    if (static_cast<int>(out.tokens.size()) >= max_nodes) break;
  }
}

void NgramSource::accept(std::span<const int32_t>, int) {}

}  // namespace tandem::speculative
