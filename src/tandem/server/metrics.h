// Server metrics in the Prometheus text exposition format: requests by endpoint and status (counted here),
// and the scheduler's and the embedding batcher's counters and gauges (read from their stats when rendering),
// the expert residency's among the scheduler's. Thread safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "tandem/engine/embed_batcher.h"
#include "tandem/engine/scheduler.h"

namespace tandem::server {

class Metrics {
 public:
  // Counts one answered request.
  void request(const std::string& endpoint, int status);
  // Time from a request's arrival to its first token.
  void first_token(double seconds);
  std::string render(const engine::SchedulerStats& stats,
                     const engine::EmbeddingStats& embeddings = {}) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  static constexpr int kTtftBuckets = 8;
  static constexpr double kTtftLe[kTtftBuckets] = {0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10};
  uint64_t ttft_le_[kTtftBuckets] = {};
  uint64_t ttft_count_ = 0;
  double ttft_sum_ = 0;
};

}  // namespace tandem::server
