// The shape the drafters that read the target share (train::EagleConfig, train::DflashConfig): the target's
// width, attention heads, head size, FFN width and vocabulary, its RoPE and norm epsilon, and the tap count,
// as a drafter takes it from its target and as a checkpoint's metadata (train::DrafterInfo) records it. Each
// drafter's own fields (layers, block size, head) are set by its kind.
#pragma once

#include <cstdint>

#include "tandem/model/model.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/layers.h"

namespace tandem::speculative {

template <typename Config>
void shape_from_target(const model::Model& target, int64_t n_taps, Config& e) {
  const model::Config& c = target.config();
  e.d = c.n_embd;
  e.n_head = c.n_head;
  e.n_kv_head = c.n_head_kv;
  e.head_dim = c.head_dim;
  e.ffn = c.n_ff;
  e.vocab = c.n_vocab;
  e.draft_vocab.clear();
  e.n_taps = n_taps;
  e.rope_theta = c.rope_base;
  e.norm_eps = c.norm_eps;
}

template <typename Config>
void shape_from_info(const train::DrafterInfo& info, Config& e) {
  e.d = info.d;
  e.n_head = info.n_head;
  e.n_kv_head = info.n_kv_head;
  e.head_dim = info.head_dim;
  e.ffn = info.ffn;
  e.vocab = info.vocab;
  e.draft_vocab = info.draft_vocab;
  e.n_taps = static_cast<int64_t>(info.tap_layers.size());
  e.rope_theta = info.rope_theta;
  e.rope_layout = info.rope_layout == "halves" ? train::RopeLayout::kHalves : train::RopeLayout::kInterleaved;
  e.norm_eps = info.norm_eps;
}

template <typename Config>
void shape_to_info(const Config& e, train::DrafterInfo& info) {
  info.d = e.d;
  info.n_head = e.n_head;
  info.n_kv_head = e.n_kv_head;
  info.head_dim = e.head_dim;
  info.ffn = e.ffn;
  info.vocab = e.vocab;
  info.draft_vocab = e.draft_vocab;
  info.rope_theta = e.rope_theta;
  info.rope_layout = e.rope_layout == train::RopeLayout::kHalves ? "halves" : "interleaved";
  info.norm_eps = e.norm_eps;
}

}  // namespace tandem::speculative
