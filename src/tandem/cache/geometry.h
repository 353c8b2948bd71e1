// The shape of the keys and values a cache holds: what a KvStore sizes its blocks and codecs by. The cache
// knows no architecture; model::Config::kv_geometry() fills this from a checkpoint's configuration.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::cache {

struct Geometry {
  int64_t n_layer = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;        // key width per KV head
  int64_t head_dim_v = 0;      // value width per KV head
  int64_t sliding_window = 0;  // positions a sliding layer keeps visible (pos - key_pos < window); 0: none
  std::vector<uint8_t> layer_sliding;  // [n_layer] or empty: 1 when the layer uses the sliding window

  // Whether `layer` keeps only the window (its blocks live in the sliding pool).
  bool sliding(int64_t layer) const {
    return sliding_window > 0 && !layer_sliding.empty() && layer_sliding[static_cast<size_t>(layer)] != 0;
  }
};

}  // namespace tandem::cache
