// Embedding requests from many threads, batched: one worker thread owns a model::Embedder and, each round,
// takes every request waiting (up to a row budget) and embeds all their sequences in one Embedder::embed
// call, so an encoder packs the rows of many short sequences from different requests into the same matrix
// products. The worker is a thread of its own beside the generation scheduler: embedding never waits for a
// generation step and generation never waits for an embedding batch (the two must then use different
// thread pools: ThreadPool is not reentrant).
//
// A sequence's embedding does not depend on what it was batched with (Encoder's contract), so the answers
// are the same as embedding each request alone.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tandem/model/encoder.h"

namespace tandem::engine {

struct EmbeddingBatcherOptions {
  // Rows (tokens, all sequences together) one round takes from the queue; a request larger than this runs
  // in a round of its own (the Embedder splits it into forwards of its own row capacity).
  int64_t max_rows = 2048;
  int max_waiting = 64;  // requests queued; past it submit() answers kQueueFull
};

// Counters since construction.
struct EmbeddingStats {
  uint64_t requests = 0;  // embedded, not refused
  uint64_t inputs = 0;    // sequences embedded
  uint64_t tokens = 0;    // their tokens
  uint64_t rounds = 0;    // Embedder::embed calls (each takes one or more requests)
  int64_t waiting = 0;    // gauge: requests queued now
};

class EmbeddingBatcher {
 public:
  enum class Admit { kOk, kQueueFull, kDraining };
  // Makes the Embedder, on the worker thread when the first request comes (a decoder's needs a KV cache of
  // its own, which a server that never embeds should not pay for).
  using EmbedderFactory = std::function<std::unique_ptr<model::Embedder>()>;

  // dim: the embedder's width; max_tokens: the longest sequence it takes (both known before it is made, so
  // that requests are checked without it).
  EmbeddingBatcher(EmbedderFactory factory, int64_t dim, int64_t max_tokens,
                   const EmbeddingBatcherOptions& options);
  ~EmbeddingBatcher();
  EmbeddingBatcher(const EmbeddingBatcher&) = delete;
  EmbeddingBatcher& operator=(const EmbeddingBatcher&) = delete;

  int64_t dim() const { return dim_; }
  int64_t max_tokens() const { return max_tokens_; }

  // Embeds seqs (each non-empty, at most max_tokens() tokens, ids inside the vocabulary: the caller checks)
  // with the model's pooling and L2 normalisation into out [seqs.size(), dim()], blocking until done. Any
  // thread. Returns kOk when out was filled; kQueueFull or kDraining when the request was refused and nothing
  // was computed. Throws tandem::Error when the embedder failed.
  Admit embed(std::vector<std::vector<int32_t>> seqs, std::vector<float>& out);

  // Refuses new requests (kDraining) and those still queued; the round in progress completes. Irreversible.
  void drain();
  // No request queued or being embedded.
  bool idle() const;
  // An embed() now would answer kQueueFull: max_waiting requests are queued (the round being embedded
  // holds none of them).
  bool saturated() const;
  const EmbeddingBatcherOptions& options() const { return options_; }
  // drain(), then joins the worker (the destructor calls it).
  void stop();

  EmbeddingStats stats() const;

 private:
  struct Job;
  void loop();
  void run_round(std::vector<Job*>& round);

  EmbedderFactory factory_;
  int64_t dim_, max_tokens_;
  EmbeddingBatcherOptions options_;

  mutable std::mutex mutex_;      // guards queue_, busy_, draining_, stop_ and stats_
  std::condition_variable wake_;  // the worker: a request came, or stop
  std::condition_variable done_;  // the callers: a round finished, or their requests were refused
  std::deque<Job*> queue_;        // owned by the threads waiting in embed()
  bool busy_ = false, draining_ = false, stop_ = false;
  EmbeddingStats stats_;

  // Worker thread only.
  std::unique_ptr<model::Embedder> embedder_;
  std::vector<std::span<const int32_t>> spans_;
  std::vector<float> out_;
  std::thread thread_;
};

}  // namespace tandem::engine
