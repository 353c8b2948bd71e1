// Prefix reuse: full blocks of token ids mapped to the KV blocks that hold them, so a later sequence that
// starts with the same tokens (a shared system prompt) references those blocks instead of evaluating them
// again.
//
// An entry is one block of `block_size` tokens that follows a parent entry (or the start of a sequence). It
// is found by a hash of (parent serial, tokens), then verified by comparing the parent serial and every
// token, so a hash collision cannot hand one sequence another's keys and values. Serials are never reused, so
// an entry that outlives its evicted parent can never be matched under a new parent. An entry holds one
// reference to its full-attention block and, when the model has sliding-window layers, to its sliding block
// while it still has one (a sequence drops sliding blocks that fall out of the window; the index keeps what
// it was given).
//
// Entries are evicted least recently used first, leaves before their parents, when a pool runs out of blocks.
// Not thread safe.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "tandem/cache/block_pool.h"

namespace tandem::cache {

class PrefixIndex {
 public:
  struct Match {
    uint64_t serial;  // the entry's serial (parent of the next block)
    int32_t full;     // block in the full-attention pool
    int32_t sliding;  // block in the sliding pool, or -1
  };

  // sliding may be null (no sliding-window layers).
  PrefixIndex(BlockPool& full, BlockPool* sliding);

  int64_t block_size() const { return full_.block_size(); }
  int64_t size() const { return static_cast<int64_t>(by_serial_.size()); }

  // The chain of entries matching the full blocks of tokens, from the first block on (out is cleared first).
  // Marks them as recently used. Does not retain blocks.
  void match(std::span<const int32_t> tokens, std::vector<Match>& out);

  // Registers tokens [block_size] as the block after `parent` (0: the start of a sequence), held in `full`
  // and `sliding` (-1: none). A new entry retains them; an existing one keeps its blocks (and adopts
  // `sliding` if it had none). Returns the entry's serial.
  uint64_t insert(uint64_t parent, std::span<const int32_t> tokens, int32_t full, int32_t sliding);

  // Drops one index reference so that a block of the given pool can become free: the least recently used
  // entry whose block there only the index holds (for the full pool, only leaf entries). Returns false if
  // none.
  bool evict_for(bool sliding_pool);

 private:
  struct Entry {
    uint64_t serial = 0, parent = 0, key = 0, stamp = 0;
    int32_t full = -1, sliding = -1;
    int32_t children = 0;
    std::vector<int32_t> tokens;
  };
  uint64_t key_of(uint64_t parent, std::span<const int32_t> tokens) const;
  int32_t find(uint64_t parent, std::span<const int32_t> tokens) const;  // slot or -1
  void remove(int32_t slot);

  BlockPool& full_;
  BlockPool* sliding_;
  std::vector<Entry> entries_;  // slots; serial 0 marks a free slot
  std::vector<int32_t> free_slots_;
  std::unordered_multimap<uint64_t, int32_t> by_key_;  // hash -> slot
  std::unordered_map<uint64_t, int32_t> by_serial_;    // serial -> slot
  uint64_t next_serial_ = 1, clock_ = 0;
};

}  // namespace tandem::cache
