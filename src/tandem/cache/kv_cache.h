// Paged key/value caches. A KvStore owns the memory: the codecs, a BlockPool for the full-attention layers, a
// second one for the sliding-window layers (when the model has any) and the prefix index. A KvCache is one
// sequence's view: a block table per pool and a length. Sequences in one store share blocks by reference
// count (prefix reuse); a sequence that writes into a shared block first copies it (copy-on-write).
//
// Rollback after a rejected draft is truncate(length): it drops the tail's block references, moving no data.
//
// Sliding-window layers are paged too, in their own pool, but a sequence releases their blocks once they fall
// more than `window + rollback` positions behind the end: a sliding layer keeps between window + rollback and
// window + rollback + block_size (+ the rows of the current forward) positions, and truncate() may go back at
// most `rollback` positions past the furthest length reached (it throws tandem::Error when the window it
// would need is gone). rollback defaults to 32, enough for any verify window the engine uses.
//
// Quantized key caches (q8_0, q4, q4r) are anchored (KeyAnchor in kv_codec.h): every block keeps, per layer
// and KV head, an f16 anchor equal to the key of the block's first position, written when that position is
// stored; each key of the block is stored as k - anchor. The anchor is a pure function of the sequence's
// tokens up to the block's first position, so it needs no state outside the block: sequences sharing a block
// share its anchor, copy-on-write copies it, rollback into a block keeps it (the first row stays), and a
// rollback to the block's start releases the block, so a re-prefill writes the same anchor again. Being per
// block, it also follows the slow drift of the low-frequency RoPE channels over a long context, and it
// survives the release of old sliding-window blocks. Positions of a sequence are stored in increasing order
// (the forward does), so the first position of a block is stored before the others.
//
// Not thread safe: one thread appends, truncates and shares; attention may read concurrently with itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tandem/cache/block_pool.h"
#include "tandem/cache/geometry.h"
#include "tandem/cache/kv_codec.h"
#include "tandem/cache/prefix_index.h"
#include "tandem/cache/recurrent.h"

namespace tandem::cache {

// The deepest truncate a recurrent state supports unless told otherwise (enough for any verify window).
constexpr int64_t kDefaultRecurrentRollback = 16;

struct KvStoreOptions {
  KvType type = KvType::kF16;
  int64_t block_size = 16;  // positions per block
  int64_t n_blocks = 0;     // full-attention blocks (> 0): positions of all sequences together / block_size
  int64_t n_sliding_blocks = 0;  // sliding-window blocks; 0: as many as n_blocks
  int64_t rollback = 32;         // deepest truncate the sliding-window layers support
  // Deepest truncate the recurrent layers support (RecurrentState). 0 for sequences that are never rolled
  // back (plain decoding): their state keeps no rollback base, and a truncate other than to 0 (or to a
  // snapshot's length) throws.
  int64_t recurrent_rollback = kDefaultRecurrentRollback;
  // The most rows of a verify window a recurrent state keeps each row's state for (a drafter's depth + 1);
  // 0: recurrent_rollback + 1. Each row costs a state per sequence (RecurrentState).
  int64_t recurrent_window = 0;
  bool prefix_reuse = true;               // keep a PrefixIndex
  uint64_t seed = 0x7A4D3C1B2E5F6A09ull;  // q4r rotations
};

class KvStore {
 public:
  KvStore(const Geometry& geometry, const KvStoreOptions& options);
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  const KvStoreOptions& options() const { return options_; }
  KvType type() const { return options_.type; }
  int64_t block_size() const { return options_.block_size; }
  int64_t n_layer() const { return n_layer_; }
  int64_t n_head_kv() const { return n_head_kv_; }
  int64_t window() const { return window_; }  // 0 when no layer slides
  bool sliding(int64_t layer) const { return sliding_ && sliding_->has_layer(layer); }
  // Encoded bytes of one position over every layer (keys and values, plus the key anchors' share, rounded
  // up).
  size_t bytes_per_token() const;

  const KvCodec& key_codec() const { return *key_codec_; }
  // The codec of the value rows; a store whose geometry has values_in_keys has none (has_values() false).
  const KvCodec& value_codec() const { return *value_codec_; }
  bool has_values() const { return value_codec_ != nullptr; }
  // Elements of a value vector.
  int64_t value_dim() const { return geometry_.head_dim_v; }
  // The key anchor of an anchored store; nullptr when keys are stored as they are (f32, f16).
  const KeyAnchor* key_anchor() const { return key_anchor_.get(); }
  BlockPool& pool(bool sliding) { return sliding ? *sliding_ : *full_; }
  const BlockPool& pool(bool sliding) const { return sliding ? *sliding_ : *full_; }
  bool has_sliding() const { return sliding_ != nullptr; }
  PrefixIndex* index() { return index_.get(); }
  // Each sequence of the store keeps a RecurrentState of this shape when the geometry has recurrent layers
  // (their keys and values take no blocks).
  const Geometry& geometry() const { return geometry_; }

  // A block with one reference, evicting prefix entries that only the index holds when the pool is full.
  // Throws tandem::Error when nothing can be freed.
  int32_t allocate(bool sliding);

 private:
  KvStoreOptions options_;
  Geometry geometry_;
  int64_t n_layer_, n_head_kv_, window_ = 0;
  std::unique_ptr<KvCodec> key_codec_, value_codec_;
  std::unique_ptr<KeyAnchor> key_anchor_;
  std::unique_ptr<BlockPool> full_, sliding_;
  std::unique_ptr<PrefixIndex> index_;
};

class KvCache {
 public:
  // A sequence with a store of its own, sized for `capacity` positions; max_batch: the most rows of this
  // sequence one forward appends (sizes the sliding-window pool); recurrent_rollback and recurrent_window: as
  // KvStoreOptions'.
  KvCache(const Geometry& geometry, int64_t capacity, KvType type, int64_t max_batch = 256,
          int64_t recurrent_rollback = kDefaultRecurrentRollback, int64_t recurrent_window = 0);
  // A sequence of at most `capacity` positions in a shared store, which must outlive it.
  KvCache(KvStore& store, int64_t capacity);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  KvType type() const { return store_->type(); }
  size_t bytes_per_token() const { return store_->bytes_per_token(); }
  KvStore& store() { return *store_; }
  const KvStore& store() const { return *store_; }
  // The recurrent layers' state; nullptr when the model has none. truncate() rolls it back too.
  RecurrentState* recurrent() { return recurrent_.get(); }
  const RecurrentState* recurrent() const { return recurrent_.get(); }

  // Drops every position >= n (n <= length()), releasing whole blocks no longer used. Throws tandem::Error
  // (changing nothing) when a sliding-window layer no longer holds the window position n would attend to, or
  // the recurrent state cannot go back to n (past its rollback depth; without rollback, any n but 0,
  // length() or a snapshot's length).
  void truncate(int64_t n);

  // Keeps a path of a token tree evaluated at positions [base, length()) (model::Forward's TreeWindow): the
  // rows at base + nodes[k] move to base + k, bit for bit (nothing is recomputed), and the sequence is
  // truncated to base + nodes.size(). nodes must be strictly increasing with nodes[k] >= k, inside the
  // cache. Throws tandem::Error, changing nothing, for a store whose rows cannot move exactly: anchored key
  // caches (each key is stored against its block's anchor) and recurrent layers (their state is not per
  // position).
  void compact(int64_t base, std::span<const int32_t> nodes);

  // Makes positions [first, end) writable (first <= length(), end <= capacity()): truncates to `first`,
  // allocates blocks, copies shared blocks about to be written, releases sliding blocks out of reach, and
  // sets the length to `end`. The forward calls it once per sequence before storing a batch's rows.
  void prepare_append(int64_t first, int64_t end);

  // Encodes one position's keys [n_head_kv * head_dim] and values [n_head_kv * head_dim_v] for a layer (v is
  // not read when the geometry has values_in_keys).
  // The position must be inside the range of the last prepare_append().
  void store(int64_t layer, int64_t pos, const float* k, const float* v);

  // Block storage for attention: the pool of a layer and the block holding a position (-1 if released).
  const BlockPool& pool_of(int64_t layer) const { return store_->pool(store_->sliding(layer)); }
  int32_t block_of(int64_t layer, int64_t pos) const {
    return table(store_->sliding(layer))[static_cast<size_t>(pos / store_->block_size())];
  }

  // Prefix reuse, on an empty sequence: attaches the longest run of cached blocks that starts `tokens` (at
  // most tokens.size() - 1 positions, so the last token is always evaluated) and returns its length; 0
  // without an index or a match.
  int64_t reuse_prefix(std::span<const int32_t> tokens);
  // Registers this sequence's full blocks in the prefix index. tokens: the ids at positions [0, length()) (or
  // more); blocks already registered since the last truncate before them are skipped.
  void publish(std::span<const int32_t> tokens);

 private:
  std::vector<int32_t>& table(bool sliding) { return sliding ? sliding_table_ : full_table_; }
  const std::vector<int32_t>& table(bool sliding) const { return sliding ? sliding_table_ : full_table_; }
  void make_writable(bool sliding, int64_t b);
  void release_from(bool sliding, int64_t b);  // blocks with index >= b

  std::unique_ptr<KvStore> owned_;
  KvStore* store_;
  std::unique_ptr<RecurrentState> recurrent_;
  int64_t capacity_;
  int64_t length_ = 0;
  std::vector<int32_t> full_table_, sliding_table_;  // [ceil(capacity / block_size)] block ids, -1: none
  int64_t sliding_low_ = 0;                          // sliding blocks below this index are released
  int64_t used_blocks_ = 0;                          // table entries at or past this index hold no block
  int64_t published_ = 0;                            // leading full blocks registered in the prefix index
  std::vector<uint64_t> serials_;                    // [blocks] prefix-index serial of each registered block
  std::vector<PrefixIndex::Match> matches_;
};

}  // namespace tandem::cache
