// One sequence on one model: its cache and the forward that extends it. Prompts are evaluated in chunks of
// the forward's row capacity; logits are produced only for the rows asked for.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/cache/kv_cache.h"
#include "tandem/model/forward.h"

namespace tandem::engine {

struct SessionOptions {
  int64_t n_ctx = 0;  // 0: the model's training context, capped at 4096
  cache::KvType kv_type = cache::KvType::kF16;
  int64_t batch = 256;  // rows per forward when evaluating a prompt
};

class Session {
 public:
  Session(const model::Model& model, ThreadPool& pool, const SessionOptions& options);

  const model::Model& model() const { return forward_.model(); }
  int64_t length() const { return cache_.length(); }
  int64_t n_ctx() const { return cache_.capacity(); }
  int64_t n_vocab() const { return model().config().n_vocab; }
  cache::KvCache& cache() { return cache_; }
  model::Forward& forward() { return forward_; }

  // Appends tokens at the end of the sequence. Returns the logits of the last token [n_vocab], or with
  // all_logits the logits of every appended token [tokens.size(), n_vocab]. The span stays valid until the
  // next call. Throws tandem::Error when the context would overflow (the cache is left as it was).
  std::span<const float> eval(std::span<const int32_t> tokens, bool all_logits = false);

  // Rolls the sequence back to n tokens (n <= length()).
  void truncate(int64_t n) { cache_.truncate(n); }

 private:
  model::Forward forward_;
  cache::KvCache cache_;
  std::vector<model::Row> rows_;
  std::vector<float> logits_;
};

int64_t default_context(const model::Model& model, int64_t requested);

}  // namespace tandem::engine
