// Fixed-size KV blocks shared by sequences. A block holds `block_size` consecutive positions of one group of
// layers (the full-attention layers, or the sliding-window layers), every KV head, keys and values, already
// encoded by the codecs. All blocks are allocated once; a free list hands them out and reference counts say
// when one returns to it (a block may be referenced by several sequences and by the prefix index).
//
// Layout of one block: keys [layer slot][kv head][position in block][key row bytes], then values likewise, so
// one head's keys for a run of positions are consecutive rows, as KvCodec::dots() reads them; then, when the
// key cache is anchored (see kv_cache.h), one key anchor per [layer slot][kv head]. The anchors live inside
// the block, so copy-on-write, prefix sharing and release treat them with the rows they belong to.
//
// Not thread safe: allocation and reference counting happen on the thread that drives the forward; attention
// only reads block contents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tandem/util/zeroed_memory.h"

namespace tandem::cache {

class BlockPool {
 public:
  // layers: the model's layer indices this pool stores (in any order); key_row / value_row: encoded bytes of
  // one head vector; anchor_bytes: bytes of one key anchor (0: none).
  BlockPool(std::vector<int64_t> layers, int64_t n_layer, int64_t n_head_kv, size_t key_row, size_t value_row,
            int64_t block_size, int64_t n_blocks, size_t anchor_bytes = 0);

  int64_t block_size() const { return block_size_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_layers() const { return static_cast<int64_t>(layers_.size()); }
  size_t block_bytes() const { return block_bytes_; }
  // Whether a model layer lives in this pool.
  bool has_layer(int64_t layer) const { return slot_[static_cast<size_t>(layer)] >= 0; }

  // A free block with one reference, or -1 when none is free.
  int32_t try_allocate();
  void retain(int32_t block);
  // Drops one reference; the block returns to the free list at zero.
  void release(int32_t block);
  int32_t refs(int32_t block) const { return refs_[static_cast<size_t>(block)]; }
  // Copies every row of src into dst (copy-on-write).
  void copy(int32_t src, int32_t dst);

  // block_size() encoded rows of one (layer, kv head), laid out as the codec's encode_in_block puts them
  // (one after another, or dimension-major for f16 keys).
  uint8_t* keys(int32_t block, int64_t layer, int64_t head) {
    return data_.data() + key_offset(block, layer, head);
  }
  const uint8_t* keys(int32_t block, int64_t layer, int64_t head) const {
    return data_.data() + key_offset(block, layer, head);
  }
  uint8_t* values(int32_t block, int64_t layer, int64_t head) {
    return data_.data() + value_offset(block, layer, head);
  }
  const uint8_t* values(int32_t block, int64_t layer, int64_t head) const {
    return data_.data() + value_offset(block, layer, head);
  }
  // The key anchor of one (layer, kv head) in a block: anchor_bytes() bytes.
  uint8_t* anchor(int32_t block, int64_t layer, int64_t head) {
    return data_.data() + anchor_offset(block, layer, head);
  }
  const uint8_t* anchor(int32_t block, int64_t layer, int64_t head) const {
    return data_.data() + anchor_offset(block, layer, head);
  }
  size_t key_row() const { return key_row_; }
  size_t value_row() const { return value_row_; }
  size_t anchor_bytes() const { return anchor_bytes_; }

 private:
  size_t key_offset(int32_t block, int64_t layer, int64_t head) const {
    const auto slot = static_cast<size_t>(slot_[static_cast<size_t>(layer)]);
    return static_cast<size_t>(block) * block_bytes_ +
           (slot * static_cast<size_t>(n_head_kv_) + static_cast<size_t>(head)) * key_run_;
  }
  size_t value_offset(int32_t block, int64_t layer, int64_t head) const {
    const auto slot = static_cast<size_t>(slot_[static_cast<size_t>(layer)]);
    return static_cast<size_t>(block) * block_bytes_ + values_at_ +
           (slot * static_cast<size_t>(n_head_kv_) + static_cast<size_t>(head)) * value_run_;
  }

  size_t anchor_offset(int32_t block, int64_t layer, int64_t head) const {
    const auto slot = static_cast<size_t>(slot_[static_cast<size_t>(layer)]);
    return static_cast<size_t>(block) * block_bytes_ + anchors_at_ +
           (slot * static_cast<size_t>(n_head_kv_) + static_cast<size_t>(head)) * anchor_bytes_;
  }

  std::vector<int64_t> layers_;
  std::vector<int32_t> slot_;  // [n_layer] -> slot in a block, -1 when not stored here
  int64_t n_head_kv_, block_size_, n_blocks_;
  size_t key_row_, value_row_, anchor_bytes_;
  size_t key_run_, value_run_;  // bytes of block_size rows
  size_t values_at_;            // offset of the values within a block
  size_t anchors_at_;           // offset of the key anchors within a block
  size_t block_bytes_;
  ZeroedMemory data_;          // [n_blocks, block_bytes], pages supplied as they are first written
  std::vector<int32_t> refs_;  // [n_blocks]
  std::vector<int32_t> free_;  // stack of free block ids
};

}  // namespace tandem::cache
