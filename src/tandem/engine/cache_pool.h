// Where the scheduler gets each sequence's KV cache and where it returns it: the one seam between scheduling
// and cache memory, so that the cache's allocation strategy can change without touching the scheduler.
//
// SlotCachePool keeps a fixed number of whole-context caches. A finished sequence leaves its cache with the
// token ids it holds; a new sequence takes the free slot sharing the longest prefix with its prompt and
// truncates it there, so a repeated system prompt or a continued conversation is not evaluated again.
// Because rows are batch-invariant, reused positions hold exactly the bits a fresh evaluation would write.
// A recurrent model's cache resumes only at a length its state reaches (cache/recurrent.h: within the
// rollback depth of its end, its end itself, or a snapshot taken every few hundred positions).
//
// Not thread safe: the scheduler thread is the only user.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tandem/cache/kv_cache.h"
#include "tandem/model/config.h"

namespace tandem::engine {

class CachePool {
 public:
  virtual ~CachePool() = default;

  struct Lease {
    std::unique_ptr<cache::KvCache> cache;
    int64_t reused = 0;  // leading prompt positions already present (< prompt.size())
  };

  // Positions one sequence may hold.
  virtual int64_t capacity() const = 0;
  // A cache for a sequence starting with `prompt` (non-empty). Throws tandem::Error when none is free: the
  // scheduler asks for at most max_sequences() at once.
  virtual Lease acquire(std::span<const int32_t> prompt) = 0;
  // Gives a sequence's cache back. tokens: the ids at positions [0, cache->length()) (or more).
  virtual void release(std::unique_ptr<cache::KvCache> cache, std::span<const int32_t> tokens) = 0;
  // Leading positions currently reusable for `prompt` (for tests and metrics; no side effects).
  virtual int64_t reusable(std::span<const int32_t> prompt) const = 0;
};

class SlotCachePool final : public CachePool {
 public:
  // n_slots caches of `capacity` positions each, created on first use. rollback false: the scheduler never
  // truncates a sequence (no speculation), so recurrent states keep no rollback base
  // (cache::KvStoreOptions::recurrent_rollback 0); prefixes still resume at snapshots. verify_rows: the most
  // rows of a sequence's verify window (cache::KvStoreOptions::recurrent_window; 0: as the rollback allows).
  SlotCachePool(const model::Config& config, int64_t capacity, cache::KvType type, int n_slots,
                bool rollback = true, int64_t verify_rows = 0);

  int64_t capacity() const override { return capacity_; }
  Lease acquire(std::span<const int32_t> prompt) override;
  void release(std::unique_ptr<cache::KvCache> cache, std::span<const int32_t> tokens) override;
  int64_t reusable(std::span<const int32_t> prompt) const override;

 private:
  struct Slot {
    std::unique_ptr<cache::KvCache> cache;  // null while leased or not yet created
    std::vector<int32_t> tokens;            // ids at positions [0, cache->length())
    uint64_t last_used = 0;
  };
  // The free slot to lease for `prompt` (-1 if none) and its reusable length.
  int best_slot(std::span<const int32_t> prompt, int64_t& reused) const;

  cache::Geometry geometry_;
  int64_t capacity_;
  cache::KvType type_;
  int64_t recurrent_rollback_, recurrent_window_;
  std::vector<Slot> free_;  // slots not leased
  int leased_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace tandem::engine
