// The key/value cache of one sequence over all layers. Positions are appended by the forward; rollback after a
// rejected draft is `truncate(length)`, O(1): later appends overwrite the dropped positions.
//
// Layout per layer: K [n_head_kv][capacity][head_dim], V [n_head_kv][capacity][head_dim_v], so one head's keys
// are contiguous for attention. Elements are f32 or f16 (round to nearest even).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/model/config.h"

namespace tandem::cache {

enum class KvType { kF32, kF16 };

KvType kv_type_from_name(std::string_view name);  // "f32" | "f16"; throws tandem::Error otherwise
std::string_view kv_type_name(KvType t);

class KvCache {
 public:
  KvCache(const model::Config& config, int64_t capacity, KvType type);

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  KvType type() const { return type_; }
  size_t bytes_per_token() const;

  // Drops every position >= n (n <= length()). O(1).
  void truncate(int64_t n);
  // Marks positions < n as written (the forward calls it after appending).
  void set_length(int64_t n);

  // Stores one position's keys [n_head_kv * head_dim] and values [n_head_kv * head_dim_v] for a layer.
  void store(int64_t layer, int64_t pos, const float* k, const float* v);

  // One head's keys or values: `length()`-or-more rows of `dim` elements of type(), row j at base + j * dim.
  const void* keys(int64_t layer, int64_t head) const;
  const void* values(int64_t layer, int64_t head) const;

 private:
  size_t elem_size() const { return type_ == KvType::kF16 ? 2 : 4; }
  int64_t n_head_kv_, head_dim_, head_dim_v_, capacity_;
  KvType type_;
  int64_t length_ = 0;
  std::vector<std::vector<uint8_t>> k_, v_;  // [layer] -> bytes
};

}  // namespace tandem::cache
