// One sequence on one model: its cache and the forward that extends it. Prompts are evaluated in chunks of
// the forward's row capacity; logits are produced only for the rows asked for. It lives in model/ (not in the
// engine that generates with it) because drafters and calibration in speculative/ run sequences too, and
// speculative/ sits below the engine. Several sequences in one forward go through model::Graph instead.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/cache/kv_cache.h"
#include "tandem/model/forward.h"

namespace tandem::model {

struct SessionOptions {
  int64_t n_ctx = 0;  // 0: the model's training context, capped at 4096
  cache::KvType kv_type = cache::KvType::kF16;
  int64_t batch = 256;  // rows per forward when evaluating a prompt
  // false: the caller never truncates the sequence except to 0 (plain decoding and prefill, no drafter); a
  // recurrent state then skips the work that keeps rollbacks within reach, and refuses any other truncate
  // (cache::KvStoreOptions::recurrent_rollback 0). Other layers are unaffected. Ignored with a shared store.
  bool rollback = true;
  // With rollback, the most rows of a verify window the caller runs (a drafter's depth + 1): a recurrent
  // state keeps each such row's state, one state per row and sequence, so accepting part of a window needs no
  // recomputation (cache::KvStoreOptions::recurrent_window). 0: as many as the rollback depth allows.
  int64_t verify_rows = 0;
};

class Session {
 public:
  Session(const Model& model, ThreadPool& pool, const SessionOptions& options);
  // A sequence in a shared KV store (options.kv_type is the store's): prefill() can then reuse prompt
  // prefixes that other sessions of the store evaluated. The store must outlive the session.
  Session(const Model& model, ThreadPool& pool, const SessionOptions& options, cache::KvStore& store);

  const Model& model() const { return forward_.model(); }
  int64_t length() const { return cache_.length(); }
  int64_t n_ctx() const { return cache_.capacity(); }
  int64_t n_vocab() const { return model().config().n_vocab; }
  cache::KvCache& cache() { return cache_; }
  Forward& forward() { return forward_; }

  // Appends tokens at the end of the sequence. Returns the logits of the last token [n_vocab], or with
  // all_logits the logits of every appended token [tokens.size(), n_vocab]. The span stays valid until the
  // next call. Throws tandem::Error when the context would overflow (the cache is left as it was). With a
  // capture, it receives every layer's hidden states of each forward (CaptureFn; rows in token order,
  // one call per layer per chunk of at most forward().max_rows() tokens).
  std::span<const float> eval(std::span<const int32_t> tokens, bool all_logits = false,
                              const CaptureFn* capture = nullptr);

  // Appends nodes of a token tree whose node i lies at position mask.base + i (cache::TreeMask): `tokens` are
  // the nodes from length() - mask.base on (an earlier call may have appended the ones before). Returns the
  // logits of every appended node [tokens.size(), n_vocab], valid until the next call. Keep a path with
  // cache().compact(). Throws tandem::Error as eval() does, and for a model with recurrent layers.
  std::span<const float> eval_tree(std::span<const int32_t> tokens, const cache::TreeMask& mask,
                                   const CaptureFn* capture = nullptr);

  // Rolls the sequence back to n tokens (n <= length()).
  void truncate(int64_t n) { cache_.truncate(n); }

  // Starts a new sequence with `prompt`: drops the current one, attaches the longest cached prefix of the
  // prompt (whole KV blocks registered by earlier prefills in the same store), evaluates the rest and
  // registers the prompt's full blocks for later reuse. Returns the last prompt token's logits [n_vocab].
  std::span<const float> prefill(std::span<const int32_t> prompt);
  // Prompt tokens the last prefill() evaluated and reused; evaluated + reused = the prompt's length.
  int64_t prompt_evaluated() const { return prompt_evaluated_; }
  int64_t prompt_reused() const { return prompt_reused_; }

 private:
  std::span<const float> append(std::span<const int32_t> tokens, bool all_logits, const CaptureFn* capture,
                                const TreeRows* tree);

  Forward forward_;
  cache::KvCache cache_;
  std::vector<Row> rows_;
  std::vector<float> logits_;
  int64_t prompt_evaluated_ = 0, prompt_reused_ = 0;
};

int64_t default_context(const Model& model, int64_t requested);

}  // namespace tandem::model
