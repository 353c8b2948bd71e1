#include "tandem/cache/block_pool.h"

#include <cstring>
#include <string>

#include "tandem/util/error.h"

namespace tandem::cache {

BlockPool::BlockPool(std::vector<int64_t> layers, int64_t n_layer, int64_t n_head_kv, size_t key_row,
                     size_t value_row, int64_t block_size, int64_t n_blocks, size_t anchor_bytes)
    : layers_(std::move(layers)),
      slot_(static_cast<size_t>(n_layer), -1),
      n_head_kv_(n_head_kv),
      block_size_(block_size),
      n_blocks_(n_blocks),
      key_row_(key_row),
      value_row_(value_row),
      anchor_bytes_(anchor_bytes) {
  TANDEM_CHECK(block_size > 0 && n_blocks > 0 && n_head_kv > 0, "bad block pool shape");
  TANDEM_CHECK(n_blocks < INT32_MAX, "too many KV blocks");
  for (size_t i = 0; i < layers_.size(); ++i) {
    TANDEM_CHECK(layers_[i] >= 0 && layers_[i] < n_layer, "block pool layer out of range");
    slot_[static_cast<size_t>(layers_[i])] = static_cast<int32_t>(i);
  }
  key_run_ = static_cast<size_t>(block_size) * key_row;
  value_run_ = static_cast<size_t>(block_size) * value_row;
  values_at_ = layers_.size() * static_cast<size_t>(n_head_kv) * key_run_;
  anchors_at_ = values_at_ + layers_.size() * static_cast<size_t>(n_head_kv) * value_run_;
  block_bytes_ = anchors_at_ + layers_.size() * static_cast<size_t>(n_head_kv) * anchor_bytes;
  const size_t total = block_bytes_ * static_cast<size_t>(n_blocks);
  try {
    data_ = ZeroedMemory(total);
  } catch (const std::bad_alloc&) {
    throw Error("cannot allocate " + std::to_string(total >> 20) + " MiB for the KV cache; use a smaller -c");
  }
  refs_.assign(static_cast<size_t>(n_blocks), 0);
  free_.reserve(static_cast<size_t>(n_blocks));
  // Handed out lowest id first.
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int32_t BlockPool::try_allocate() {
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockPool::retain(int32_t block) {
  TANDEM_CHECK(block >= 0 && block < n_blocks_ && refs_[static_cast<size_t>(block)] > 0,
               "retain of a free block");
  ++refs_[static_cast<size_t>(block)];
}

void BlockPool::release(int32_t block) {
  TANDEM_CHECK(block >= 0 && block < n_blocks_ && refs_[static_cast<size_t>(block)] > 0,
               "release of a free block");
  if (--refs_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

void BlockPool::copy(int32_t src, int32_t dst) {
  std::memcpy(data_.data() + static_cast<size_t>(dst) * block_bytes_,
              data_.data() + static_cast<size_t>(src) * block_bytes_, block_bytes_);
}

}  // namespace tandem::cache
