#include "tandem/train/dflash.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "tandem/train/random.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

std::vector<float> buffer(int64_t rows, int64_t width) {
  return std::vector<float>(static_cast<size_t>(rows * width), 0.0f);
}

void copy_rows(float* dst, const float* src, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace

DflashDrafter::DflashDrafter(const DflashConfig& config, int64_t max_context, int64_t max_rows,
                             bool target_weights)
    : cfg_(config),
      max_context_(max_context),
      max_rows_(max_rows),
      att_{config.n_head, config.n_kv_head, config.head_dim,
           1.0f / std::sqrt(static_cast<float>(config.head_dim))},
      rope_{config.head_dim, config.rope_theta, config.rope_layout},
      fc_("fc.weight", config.d, config.n_taps * config.d, true, true),
      ctx_norm_("context_norm.weight", config.d, 1, true, false),
      mask_emb_("mask_embd.weight", 1, config.d, true, false),
      emb_(target_weight("token_embd.weight", config.vocab, config.d, target_weights)),
      out_norm_("output_norm.weight", config.d, 1, true, false),
      head_(target_weight("output.weight", config.head_rows(), config.d, target_weights)) {
  if (cfg_.d <= 0 || cfg_.n_head <= 0 || cfg_.n_kv_head <= 0 || cfg_.n_head % cfg_.n_kv_head != 0 ||
      cfg_.head_dim <= 0 || cfg_.head_dim % 2 != 0 || cfg_.ffn <= 0 || cfg_.vocab <= 0 || cfg_.n_taps <= 0 ||
      cfg_.n_layers <= 0 || cfg_.block <= 0 || cfg_.head_rows() > cfg_.vocab)
    throw Error(
        "DFlash drafter shape: widths, layer count and block size must be positive, the head size even and "
        "n_head a multiple of n_kv_head");
  if (max_context < 0 || max_rows < cfg_.block)
    throw Error("a DFlash drafter needs room for at least one block of " + std::to_string(cfg_.block) +
                " rows");
  const int64_t d = cfg_.d, qw = cfg_.n_head * cfg_.head_dim, kw = cfg_.n_kv_head * cfg_.head_dim;
  const int64_t F = cfg_.ffn, R = max_rows, C = max_context;
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    layers_.push_back(
        {Param(p + "attn_norm.weight", d, 1, true, false), Param(p + "attn_q.weight", qw, d, true, true),
         Param(p + "attn_k.weight", kw, d, true, true), Param(p + "attn_v.weight", kw, d, true, true),
         Param(p + "attn_output.weight", d, qw, true, true), Param(p + "ffn_norm.weight", d, 1, true, false),
         Param(p + "ffn_gate.weight", F, d, true, true), Param(p + "ffn_up.weight", F, d, true, true),
         Param(p + "ffn_down.weight", d, F, true, true)});
    Saved s;
    for (auto* b : {&s.x, &s.xn, &s.h, &s.hn}) *b = buffer(R, d);
    for (auto* b : {&s.q, &s.att}) *b = buffer(R, qw);
    for (auto* b : {&s.k, &s.v}) *b = buffer(C + R, kw);
    for (auto* b : {&s.gate, &s.up, &s.act}) *b = buffer(R, F);
    for (auto* b : {&s.inv_x, &s.inv_h}) *b = buffer(R, 1);
    saved_.push_back(std::move(s));
  }
  for (auto* b : {&g_, &ctx_, &dctx_, &dg_}) *b = buffer(C, d);
  inv_ctx_ = buffer(C, 1);
  for (auto* b : {&out_, &f_, &dx_, &dh_, &dhn_, &dxn_, &df_}) *b = buffer(R, d);
  inv_out_ = buffer(R, 1);
  for (auto* b : {&datt_, &dq_}) *b = buffer(R, qw);
  for (auto* b : {&dk_, &dv_}) *b = buffer(C + R, kw);
  for (auto* b : {&dgate_, &dup_, &dact_}) *b = buffer(R, F);
}

std::vector<Param*> DflashDrafter::params() {
  std::vector<Param*> ps = {&fc_, &ctx_norm_, &mask_emb_, &emb_};
  for (Layer& l : layers_)
    for (Param* p : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
      ps.push_back(p);
  ps.push_back(&out_norm_);
  ps.push_back(&head_);
  return ps;
}

void DflashDrafter::init(uint64_t seed) {
  uint64_t state = seed;
  for (Param* p : params()) {
    if (!p->trainable()) continue;
    p->zero_grad();
    if (p == &mask_emb_) {
      for (float& w : p->value) w = static_cast<float>(uniform_pm1(state));
    } else if (p->cols == 1) {
      std::fill(p->value.begin(), p->value.end(), 1.0f);
    } else {
      const double a = std::sqrt(3.0 / static_cast<double>(p->cols));
      for (float& w : p->value) w = static_cast<float>(a * uniform_pm1(state));
    }
  }
}

void DflashDrafter::release_target_weights() {
  for (Param* p : {&emb_, &head_}) std::vector<float>().swap(p->value);
}

void DflashDrafter::zero_grad() {
  for (Param* p : params())
    if (p->trainable()) p->zero_grad();
}

LossStats DflashDrafter::forward_backward(const DflashBatch& b, Compute& c, bool backward) {
  const int64_t C = b.context_rows, R = b.rows, B = cfg_.block, d = cfg_.d, F = cfg_.ffn;
  const int64_t H = cfg_.n_head, Hkv = cfg_.n_kv_head, kw = Hkv * cfg_.head_dim;
  if (C < 0 || C > max_context_)
    throw Error("a DFlash batch holds 0 to " + std::to_string(max_context_) + " context rows (got " +
                std::to_string(C) + ")");
  if (R <= 0 || R > max_rows_ || R % B != 0)
    throw Error("a DFlash batch holds whole blocks of " + std::to_string(B) + " rows, at most " +
                std::to_string(max_rows_) + " (got " + std::to_string(R) + ")");
  if (b.targets.rows != R)
    throw Error("a DFlash batch needs targets for each of its " + std::to_string(R) + " rows");
  if (emb_.value.empty() || head_.value.empty())
    throw Error(
        "this DFlash drafter holds no copies of the target's embedding and head: it drafts but cannot "
        "train; build it with target_weights and copy them in (copy_target_weights)");
  const AttentionMask mask =
      AttentionMask::context_blocks(C, {b.context_visible, static_cast<size_t>(R / B)}, R, B);
  const float eps = cfg_.norm_eps;
  const auto n_probs = static_cast<size_t>(H * mask.n_scores());

  // Forward. The context rows first: their keys and values lead each layer's key rows.
  if (C > 0) {
    linear_forward(fc_, nullptr, b.taps, C, g_.data(), c);
    rmsnorm_forward(ctx_norm_, eps, g_.data(), C, ctx_.data(), inv_ctx_.data(), c);
  }
  float* x0 = saved_[0].x.data();
  for (int64_t r = 0; r < R; ++r) {
    if (r % B != 0) {
      copy_rows(x0 + r * d, mask_emb_.value.data(), d);
      continue;
    }
    const int32_t id = b.block_ids[r];
    if (id < 0 || id >= cfg_.vocab)
      throw Error("DFlash block row " + std::to_string(r) + " holds token id " + std::to_string(id) +
                  ", outside the vocabulary of " + std::to_string(cfg_.vocab));
    copy_rows(x0 + r * d, emb_.value.data() + static_cast<int64_t>(id) * d, d);
  }
  for (int64_t li = 0; li < cfg_.n_layers; ++li) {
    const Layer& L = layers_[static_cast<size_t>(li)];
    Saved& s = saved_[static_cast<size_t>(li)];
    float* out = li + 1 < cfg_.n_layers ? saved_[static_cast<size_t>(li + 1)].x.data() : out_.data();
    if (s.probs.size() < n_probs) s.probs.resize(n_probs);
    rmsnorm_forward(L.attn_norm, eps, s.x.data(), R, s.xn.data(), s.inv_x.data(), c);
    linear_forward(L.wq, nullptr, s.xn.data(), R, s.q.data(), c);
    rope_forward(rope_, s.q.data(), R, H, b.block_pos, c);
    if (C > 0) {
      linear_forward(L.wk, nullptr, ctx_.data(), C, s.k.data(), c);
      linear_forward(L.wv, nullptr, ctx_.data(), C, s.v.data(), c);
      rope_forward(rope_, s.k.data(), C, Hkv, b.context_pos, c);
    }
    linear_forward(L.wk, nullptr, s.xn.data(), R, s.k.data() + C * kw, c);
    linear_forward(L.wv, nullptr, s.xn.data(), R, s.v.data() + C * kw, c);
    rope_forward(rope_, s.k.data() + C * kw, R, Hkv, b.block_pos, c);
    attention_forward(att_, mask, s.q.data(), s.k.data(), s.v.data(), s.att.data(), s.probs.data(), c);
    linear_forward(L.wo, nullptr, s.att.data(), R, s.h.data(), c);
    add_into(s.h.data(), s.x.data(), R * d, c);
    rmsnorm_forward(L.ffn_norm, eps, s.h.data(), R, s.hn.data(), s.inv_h.data(), c);
    linear_forward(L.w_gate, nullptr, s.hn.data(), R, s.gate.data(), c);
    linear_forward(L.w_up, nullptr, s.hn.data(), R, s.up.data(), c);
    swiglu_forward(s.gate.data(), s.up.data(), R * F, s.act.data(), c);
    linear_forward(L.w_down, nullptr, s.act.data(), R, out, c);
    add_into(out, s.h.data(), R * d, c);
  }
  rmsnorm_forward(out_norm_, eps, out_.data(), R, f_.data(), inv_out_.data(), c);
  const LossStats stats =
      head_soft_cross_entropy(head_, f_.data(), b.targets, backward ? df_.data() : nullptr, c);
  if (!backward) return stats;

  // Backward, in reverse. dx_ carries the gradient of the current layer's output, then of its input.
  rmsnorm_backward(out_norm_, out_.data(), inv_out_.data(), df_.data(), R, dx_.data(), false, c);
  std::fill(dctx_.begin(), dctx_.begin() + C * d, 0.0f);
  for (int64_t li = cfg_.n_layers - 1; li >= 0; --li) {
    Layer& L = layers_[static_cast<size_t>(li)];
    const Saved& s = saved_[static_cast<size_t>(li)];
    linear_backward(L.w_down, nullptr, s.act.data(), dx_.data(), R, dact_.data(), false, c);
    swiglu_backward(s.gate.data(), s.up.data(), dact_.data(), R * F, dgate_.data(), dup_.data(), c);
    linear_backward(L.w_gate, nullptr, s.hn.data(), dgate_.data(), R, dhn_.data(), false, c);
    linear_backward(L.w_up, nullptr, s.hn.data(), dup_.data(), R, dhn_.data(), true, c);
    copy_rows(dh_.data(), dx_.data(), R * d);
    rmsnorm_backward(L.ffn_norm, s.h.data(), s.inv_h.data(), dhn_.data(), R, dh_.data(), true, c);
    linear_backward(L.wo, nullptr, s.att.data(), dh_.data(), R, datt_.data(), false, c);
    attention_backward(att_, mask, s.q.data(), s.k.data(), s.v.data(), s.probs.data(), datt_.data(),
                       dq_.data(), dk_.data(), dv_.data(), c);
    rope_backward(rope_, dq_.data(), R, H, b.block_pos, c);
    rope_backward(rope_, dk_.data() + C * kw, R, Hkv, b.block_pos, c);
    linear_backward(L.wq, nullptr, s.xn.data(), dq_.data(), R, dxn_.data(), false, c);
    linear_backward(L.wk, nullptr, s.xn.data(), dk_.data() + C * kw, R, dxn_.data(), true, c);
    linear_backward(L.wv, nullptr, s.xn.data(), dv_.data() + C * kw, R, dxn_.data(), true, c);
    if (C > 0) {
      rope_backward(rope_, dk_.data(), C, Hkv, b.context_pos, c);
      linear_backward(L.wk, nullptr, ctx_.data(), dk_.data(), C, dctx_.data(), true, c);
      linear_backward(L.wv, nullptr, ctx_.data(), dv_.data(), C, dctx_.data(), true, c);
    }
    // The input feeds the attention norm and the residual.
    copy_rows(dx_.data(), dh_.data(), R * d);
    rmsnorm_backward(L.attn_norm, s.x.data(), s.inv_x.data(), dxn_.data(), R, dx_.data(), true, c);
  }
  // Every block row past the first reads the mask embedding.
  for (int64_t r = 0; r < R; ++r)
    if (r % B != 0)
      for (int64_t i = 0; i < d; ++i)
        mask_emb_.grad[static_cast<size_t>(i)] += dx_[static_cast<size_t>(r * d + i)];
  if (C > 0) {
    rmsnorm_backward(ctx_norm_, g_.data(), inv_ctx_.data(), dctx_.data(), C, dg_.data(), false, c);
    linear_backward(fc_, nullptr, b.taps, dg_.data(), C, nullptr, false, c);
  }
  return stats;
}

}  // namespace tandem::train
