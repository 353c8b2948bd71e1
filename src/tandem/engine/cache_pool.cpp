#include "tandem/engine/cache_pool.h"

#include <algorithm>

#include "tandem/util/error.h"

namespace tandem::engine {
namespace {

int64_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}

}  // namespace

SlotCachePool::SlotCachePool(const model::Config& config, int64_t capacity, cache::KvType type, int n_slots,
                             bool rollback, int64_t verify_rows)
    : geometry_(config.kv_geometry()),
      capacity_(capacity),
      type_(type),
      recurrent_rollback_(rollback ? cache::kDefaultRecurrentRollback : 0),
      recurrent_window_(verify_rows) {
  TANDEM_CHECK(capacity > 0 && n_slots > 0, "a cache pool needs a positive capacity and slot count");
  free_.resize(static_cast<size_t>(n_slots));
}

int SlotCachePool::best_slot(std::span<const int32_t> prompt, int64_t& reused) const {
  int best = -1;
  reused = 0;
  for (size_t i = 0; i < free_.size(); ++i) {
    const Slot& s = free_[i];
    // The last prompt token is always evaluated: its logits start the generation.
    int64_t r =
        s.cache ? std::min<int64_t>(common_prefix(s.tokens, prompt), static_cast<int64_t>(prompt.size()) - 1)
                : 0;
    // A recurrent state resumes only where a rollback reaches: within its depth, or at a snapshot.
    if (r > 0 && s.cache->recurrent()) r = s.cache->recurrent()->reachable(r);
    // Prefer the longest reuse; among equals, a slot never used, then the least recently used one, so
    // that cached prefixes survive as long as possible.
    auto rank = [&](const Slot& x) { return x.cache ? x.last_used + 1 : 0; };
    if (best < 0 || r > reused || (r == reused && rank(s) < rank(free_[static_cast<size_t>(best)]))) {
      best = static_cast<int>(i);
      reused = r;
    }
  }
  return best;
}

CachePool::Lease SlotCachePool::acquire(std::span<const int32_t> prompt) {
  TANDEM_CHECK(!prompt.empty(), "a sequence needs a prompt");
  int64_t reused = 0;
  const int i = best_slot(prompt, reused);
  if (i < 0) throw Error("every cache slot is in use");
  Slot slot = std::move(free_[static_cast<size_t>(i)]);
  free_.erase(free_.begin() + i);
  ++leased_;
  Lease lease;
  if (slot.cache) {
    try {
      slot.cache->truncate(reused);
      lease.cache = std::move(slot.cache);
      lease.reused = reused;
    } catch (const Error&) {
      lease.cache.reset();  // a cache that cannot roll back that far is replaced by a fresh one
    }
  }
  if (!lease.cache) {
    lease.cache = std::make_unique<cache::KvCache>(geometry_, capacity_, type_, 256, recurrent_rollback_,
                                                   recurrent_window_);
    lease.reused = 0;
  }
  return lease;
}

void SlotCachePool::release(std::unique_ptr<cache::KvCache> cache, std::span<const int32_t> tokens) {
  TANDEM_CHECK(cache != nullptr && leased_ > 0, "released a cache that was not leased");
  --leased_;
  Slot slot;
  auto n = static_cast<size_t>(std::min<int64_t>(cache->length(), static_cast<int64_t>(tokens.size())));
  // A recurrent state keeps only the lengths it reaches (its end, when it was set up without rollback).
  if (cache->recurrent() && static_cast<int64_t>(n) < cache->length())
    n = static_cast<size_t>(cache->recurrent()->reachable(static_cast<int64_t>(n)));
  if (static_cast<int64_t>(n) < cache->length()) cache->truncate(static_cast<int64_t>(n));
  slot.tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
  slot.cache = std::move(cache);
  slot.last_used = ++clock_;
  free_.push_back(std::move(slot));
}

int64_t SlotCachePool::reusable(std::span<const int32_t> prompt) const {
  int64_t reused = 0;
  (void)best_slot(prompt, reused);
  return reused;
}

}  // namespace tandem::engine
