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
  // Recurrent (state-space) layers keep no keys and values but a state per sequence (cache/recurrent.h).
  std::vector<uint8_t> layer_recurrent;  // [n_layer] or empty: 1 when the layer is recurrent
  int64_t ssm_d_inner = 0;               // channels of a recurrent layer
  int64_t ssm_d_state = 0;               // state size per channel
  int64_t ssm_d_conv = 0;                // causal convolution width (the state keeps d_conv - 1 inputs)
  // Latent attention caches (model/mla.h): a position's value is the first head_dim_v elements of its key
  // (the latent both are expanded from), so no value rows are stored and attention reads the values from
  // the key rows, anchor included.
  bool values_in_keys = false;

  // Whether `layer` keeps only the window (its blocks live in the sliding pool).
  bool sliding(int64_t layer) const {
    return sliding_window > 0 && !layer_sliding.empty() && layer_sliding[static_cast<size_t>(layer)] != 0;
  }
  bool recurrent(int64_t layer) const {
    return !layer_recurrent.empty() && layer_recurrent[static_cast<size_t>(layer)] != 0;
  }
  bool has_recurrent() const {
    for (uint8_t r : layer_recurrent)
      if (r != 0) return true;
    return false;
  }
};

}  // namespace tandem::cache
