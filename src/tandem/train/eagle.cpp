#include "tandem/train/eagle.h"

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

// Copies columns [col, col + width) of each of `rows` rows (stride `stride`) out of / into a packed buffer.
void copy_columns(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                  int64_t width) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * dst_stride, src + r * src_stride, static_cast<size_t>(width) * sizeof(float));
}

}  // namespace

EagleDrafter::EagleDrafter(const EagleConfig& config, int64_t max_rows, bool target_weights)
    : cfg_(config),
      max_rows_(max_rows),
      att_{config.n_head, config.n_kv_head, config.head_dim,
           1.0f / std::sqrt(static_cast<float>(config.head_dim))},
      rope_{config.head_dim, config.rope_theta, config.rope_layout},
      fc_("fc.weight", config.d, config.n_taps * config.d, true, true),
      emb_(target_weight("token_embd.weight", config.vocab, config.d, target_weights)),
      emb_norm_("blk.0.emb_norm.weight", config.d, 1, true, false),
      hidden_norm_("blk.0.hidden_norm.weight", config.d, 1, true, false),
      wq_("blk.0.attn_q.weight", config.n_head * config.head_dim, 2 * config.d, true, true),
      wk_("blk.0.attn_k.weight", config.n_kv_head * config.head_dim, 2 * config.d, true, true),
      wv_("blk.0.attn_v.weight", config.n_kv_head * config.head_dim, 2 * config.d, true, true),
      wo_("blk.0.attn_output.weight", config.d, config.n_head * config.head_dim, true, true),
      ffn_norm_("blk.0.ffn_norm.weight", config.d, 1, true, false),
      w_gate_("blk.0.ffn_gate.weight", config.ffn, config.d, true, true),
      w_up_("blk.0.ffn_up.weight", config.ffn, config.d, true, true),
      w_down_("blk.0.ffn_down.weight", config.d, config.ffn, true, true),
      out_norm_("output_norm.weight", config.d, 1, true, false),
      head_(config.train_head
                ? Param("output.weight", config.head_rows(), config.d, true, true)
                : target_weight("output.weight", config.head_rows(), config.d, target_weights)) {
  if (cfg_.d <= 0 || cfg_.n_head <= 0 || cfg_.n_kv_head <= 0 || cfg_.n_head % cfg_.n_kv_head != 0 ||
      cfg_.head_dim <= 0 || cfg_.head_dim % 2 != 0 || cfg_.ffn <= 0 || cfg_.vocab <= 0 || cfg_.n_taps <= 0 ||
      cfg_.n_layer < 1 || cfg_.head_rows() > cfg_.vocab)
    throw Error(
        "EAGLE drafter shape: widths must be positive, the head size even and n_head a multiple of "
        "n_kv_head");
  const int64_t R = max_rows, d = cfg_.d, qw = cfg_.n_head * cfg_.head_dim,
                kw = cfg_.n_kv_head * cfg_.head_dim;
  for (auto* b : {&g_, &e_, &ne_, &ng_, &h1_, &n2_, &h2_, &f_, &df_, &dh1_, &dh2_, &dn2_, &dg_, &dne_, &dng_})
    *b = buffer(R, d);
  for (auto* b : {&u_, &du_}) *b = buffer(R, 2 * d);
  for (auto* b : {&q_, &att_out_, &datt_, &dq_}) *b = buffer(R, qw);
  for (auto* b : {&k_, &v_, &dk_, &dv_}) *b = buffer(R, kw);
  for (auto* b : {&gate_, &up_, &act_, &dgate_, &dup_, &dact_}) *b = buffer(R, cfg_.ffn);
  for (auto* b : {&inv_e_, &inv_g_, &inv_h1_, &inv_h2_}) *b = buffer(R, 1);
  for (int64_t l = 1; l < cfg_.n_layer; ++l) layers_.push_back(std::make_unique<Layer>(l, cfg_, R));
  if (!layers_.empty()) dnx_ = dx_ = buffer(R, d);
}

EagleDrafter::Layer::Layer(int64_t index, const EagleConfig& c, int64_t max_rows)
    : attn_norm("blk." + std::to_string(index) + ".attn_norm.weight", c.d, 1, true, false),
      wq("blk." + std::to_string(index) + ".attn_q.weight", c.n_head * c.head_dim, c.d, true, true),
      wk("blk." + std::to_string(index) + ".attn_k.weight", c.n_kv_head * c.head_dim, c.d, true, true),
      wv("blk." + std::to_string(index) + ".attn_v.weight", c.n_kv_head * c.head_dim, c.d, true, true),
      wo("blk." + std::to_string(index) + ".attn_output.weight", c.d, c.n_head * c.head_dim, true, true),
      ffn_norm("blk." + std::to_string(index) + ".ffn_norm.weight", c.d, 1, true, false),
      w_gate("blk." + std::to_string(index) + ".ffn_gate.weight", c.ffn, c.d, true, true),
      w_up("blk." + std::to_string(index) + ".ffn_up.weight", c.ffn, c.d, true, true),
      w_down("blk." + std::to_string(index) + ".ffn_down.weight", c.d, c.ffn, true, true) {
  const int64_t qw = c.n_head * c.head_dim, kw = c.n_kv_head * c.head_dim;
  for (auto* b : {&nx, &h1, &n2, &out}) *b = buffer(max_rows, c.d);
  for (auto* b : {&q, &att_out}) *b = buffer(max_rows, qw);
  for (auto* b : {&k, &v}) *b = buffer(max_rows, kw);
  for (auto* b : {&gate, &up, &act}) *b = buffer(max_rows, c.ffn);
  for (auto* b : {&inv_x, &inv_h1}) *b = buffer(max_rows, 1);
}

std::vector<Param*> EagleDrafter::params() {
  std::vector<Param*> all = {&fc_, &emb_, &emb_norm_, &hidden_norm_, &wq_,   &wk_,
                             &wv_, &wo_,  &ffn_norm_, &w_gate_,      &w_up_, &w_down_};
  for (const auto& l : layers_)
    all.insert(all.end(), {&l->attn_norm, &l->wq, &l->wk, &l->wv, &l->wo, &l->ffn_norm, &l->w_gate, &l->w_up,
                           &l->w_down});
  all.insert(all.end(), {&out_norm_, &head_});
  return all;
}

void EagleDrafter::layer_forward(Layer& l, const float* x, const EagleBatch& b, Compute& c) {
  const int64_t R = b.rows, d = cfg_.d;
  const float eps = cfg_.norm_eps;
  const size_t n_probs = static_cast<size_t>(cfg_.n_head * b.mask->n_scores());
  if (l.probs.size() < n_probs) l.probs.resize(n_probs);
  rmsnorm_forward(l.attn_norm, eps, x, R, l.nx.data(), l.inv_x.data(), c);
  linear_forward(l.wq, nullptr, l.nx.data(), R, l.q.data(), c);
  linear_forward(l.wk, nullptr, l.nx.data(), R, l.k.data(), c);
  linear_forward(l.wv, nullptr, l.nx.data(), R, l.v.data(), c);
  rope_forward(rope_, l.q.data(), R, cfg_.n_head, b.pos, c);
  rope_forward(rope_, l.k.data(), R, cfg_.n_kv_head, b.pos, c);
  attention_forward(att_, *b.mask, l.q.data(), l.k.data(), l.v.data(), l.att_out.data(), l.probs.data(), c);
  linear_forward(l.wo, nullptr, l.att_out.data(), R, l.h1.data(), c);
  add_into(l.h1.data(), x, R * d, c);
  rmsnorm_forward(l.ffn_norm, eps, l.h1.data(), R, l.n2.data(), l.inv_h1.data(), c);
  linear_forward(l.w_gate, nullptr, l.n2.data(), R, l.gate.data(), c);
  linear_forward(l.w_up, nullptr, l.n2.data(), R, l.up.data(), c);
  swiglu_forward(l.gate.data(), l.up.data(), R * cfg_.ffn, l.act.data(), c);
  linear_forward(l.w_down, nullptr, l.act.data(), R, l.out.data(), c);
  add_into(l.out.data(), l.h1.data(), R * d, c);
}

void EagleDrafter::layer_backward(Layer& l, const float* x, const EagleBatch& b, float* dy, float* dx,
                                  Compute& c) {
  const int64_t R = b.rows, d = cfg_.d;
  linear_backward(l.w_down, nullptr, l.act.data(), dy, R, dact_.data(), false, c);
  swiglu_backward(l.gate.data(), l.up.data(), dact_.data(), R * cfg_.ffn, dgate_.data(), dup_.data(), c);
  linear_backward(l.w_gate, nullptr, l.n2.data(), dgate_.data(), R, dn2_.data(), false, c);
  linear_backward(l.w_up, nullptr, l.n2.data(), dup_.data(), R, dn2_.data(), true, c);
  // h1 feeds the FFN's norm and the residual: dh1 = dy + norm backward, built in dy.
  rmsnorm_backward(l.ffn_norm, l.h1.data(), l.inv_h1.data(), dn2_.data(), R, dy, true, c);
  linear_backward(l.wo, nullptr, l.att_out.data(), dy, R, datt_.data(), false, c);
  attention_backward(att_, *b.mask, l.q.data(), l.k.data(), l.v.data(), l.probs.data(), datt_.data(),
                     dq_.data(), dk_.data(), dv_.data(), c);
  rope_backward(rope_, dq_.data(), R, cfg_.n_head, b.pos, c);
  rope_backward(rope_, dk_.data(), R, cfg_.n_kv_head, b.pos, c);
  linear_backward(l.wq, nullptr, l.nx.data(), dq_.data(), R, dnx_.data(), false, c);
  linear_backward(l.wk, nullptr, l.nx.data(), dk_.data(), R, dnx_.data(), true, c);
  linear_backward(l.wv, nullptr, l.nx.data(), dv_.data(), R, dnx_.data(), true, c);
  std::memcpy(dx, dy, static_cast<size_t>(R * d) * sizeof(float));
  rmsnorm_backward(l.attn_norm, x, l.inv_x.data(), dnx_.data(), R, dx, true, c);
}

void EagleDrafter::init(uint64_t seed) {
  uint64_t state = seed;
  for (Param* p : params()) {
    if (!p->trainable()) continue;
    p->zero_grad();
    if (p->cols == 1) {
      std::fill(p->value.begin(), p->value.end(), 1.0f);
      continue;
    }
    const double a = std::sqrt(3.0 / static_cast<double>(p->cols));
    for (float& w : p->value) w = static_cast<float>(a * uniform_pm1(state));
  }
}

void EagleDrafter::zero_grad() {
  for (Param* p : params())
    if (p->trainable()) p->zero_grad();
}

LossStats EagleDrafter::forward_backward(const EagleBatch& b, Compute& c, bool backward) {
  const int64_t R = b.rows, d = cfg_.d, F = cfg_.ffn, H = cfg_.n_head, Hkv = cfg_.n_kv_head;
  if (R <= 0 || R > max_rows_)
    throw Error("an EAGLE batch holds 1 to " + std::to_string(max_rows_) + " rows (got " + std::to_string(R) +
                ")");
  if (b.mask == nullptr || b.mask->n_queries() != R || b.mask->n_keys() != R)
    throw Error("an EAGLE batch needs a " + std::to_string(R) + " x " + std::to_string(R) +
                " attention mask");
  if (b.targets.rows != R)
    throw Error("an EAGLE batch needs targets for each of its " + std::to_string(R) + " rows");
  if (emb_.value.empty() || head_.value.empty())
    throw Error(
        "this EAGLE drafter holds no copies of the target's embedding and head: it drafts but cannot train; "
        "build it with target_weights and copy them in (copy_target_weights)");
  const int64_t T = b.tap_rows < 0 ? R : b.tap_rows;
  if (T > R || (T < R && b.given_g == nullptr))
    throw Error("an EAGLE batch's rows past tap_rows (" + std::to_string(T) + " of " + std::to_string(R) +
                ") need given_g");
  const float eps = cfg_.norm_eps;
  const size_t n_probs = static_cast<size_t>(H * b.mask->n_scores());
  if (probs_.size() < n_probs) probs_.resize(n_probs);

  // Forward.
  if (T > 0) linear_forward(fc_, nullptr, b.taps, T, g_.data(), c);
  if (T < R) std::memcpy(g_.data() + T * d, b.given_g, static_cast<size_t>((R - T) * d) * sizeof(float));
  embedding_forward(emb_, b.next_ids, R, e_.data());
  rmsnorm_forward(emb_norm_, eps, e_.data(), R, ne_.data(), inv_e_.data(), c);
  rmsnorm_forward(hidden_norm_, eps, g_.data(), R, ng_.data(), inv_g_.data(), c);
  copy_columns(ne_.data(), d, u_.data(), 2 * d, R, d);
  copy_columns(ng_.data(), d, u_.data() + d, 2 * d, R, d);
  linear_forward(wq_, nullptr, u_.data(), R, q_.data(), c);
  linear_forward(wk_, nullptr, u_.data(), R, k_.data(), c);
  linear_forward(wv_, nullptr, u_.data(), R, v_.data(), c);
  rope_forward(rope_, q_.data(), R, H, b.pos, c);
  rope_forward(rope_, k_.data(), R, Hkv, b.pos, c);
  attention_forward(att_, *b.mask, q_.data(), k_.data(), v_.data(), att_out_.data(), probs_.data(), c);
  linear_forward(wo_, nullptr, att_out_.data(), R, h1_.data(), c);
  add_into(h1_.data(), g_.data(), R * d, c);
  rmsnorm_forward(ffn_norm_, eps, h1_.data(), R, n2_.data(), inv_h1_.data(), c);
  linear_forward(w_gate_, nullptr, n2_.data(), R, gate_.data(), c);
  linear_forward(w_up_, nullptr, n2_.data(), R, up_.data(), c);
  swiglu_forward(gate_.data(), up_.data(), R * F, act_.data(), c);
  linear_forward(w_down_, nullptr, act_.data(), R, h2_.data(), c);
  add_into(h2_.data(), h1_.data(), R * d, c);
  const float* x = h2_.data();
  for (const auto& l : layers_) {
    layer_forward(*l, x, b, c);
    x = l->out.data();
  }
  rmsnorm_forward(out_norm_, eps, x, R, f_.data(), inv_h2_.data(), c);
  const LossStats stats =
      head_soft_cross_entropy(head_, f_.data(), b.targets, backward ? df_.data() : nullptr, c);
  if (!backward) return stats;

  // Backward, in reverse. The plain layers pass the gradient of their input down to dh2 (the first
  // layer's output), alternating between dx_ and dg_ (free until the first layer's pass).
  float* dout = layers_.empty() ? dh2_.data() : dx_.data();
  rmsnorm_backward(out_norm_, x, inv_h2_.data(), df_.data(), R, dout, false, c);
  for (size_t i = layers_.size(); i-- > 0;) {
    const float* input = i == 0 ? h2_.data() : layers_[i - 1]->out.data();
    float* din = i == 0 ? dh2_.data() : (dout == dx_.data() ? dg_.data() : dx_.data());
    layer_backward(*layers_[i], input, b, dout, din, c);
    dout = din;
  }
  linear_backward(w_down_, nullptr, act_.data(), dh2_.data(), R, dact_.data(), false, c);
  swiglu_backward(gate_.data(), up_.data(), dact_.data(), R * F, dgate_.data(), dup_.data(), c);
  linear_backward(w_gate_, nullptr, n2_.data(), dgate_.data(), R, dn2_.data(), false, c);
  linear_backward(w_up_, nullptr, n2_.data(), dup_.data(), R, dn2_.data(), true, c);
  std::memcpy(dh1_.data(), dh2_.data(), static_cast<size_t>(R * d) * sizeof(float));
  rmsnorm_backward(ffn_norm_, h1_.data(), inv_h1_.data(), dn2_.data(), R, dh1_.data(), true, c);
  linear_backward(wo_, nullptr, att_out_.data(), dh1_.data(), R, datt_.data(), false, c);
  attention_backward(att_, *b.mask, q_.data(), k_.data(), v_.data(), probs_.data(), datt_.data(), dq_.data(),
                     dk_.data(), dv_.data(), c);
  rope_backward(rope_, dq_.data(), R, H, b.pos, c);
  rope_backward(rope_, dk_.data(), R, Hkv, b.pos, c);
  linear_backward(wq_, nullptr, u_.data(), dq_.data(), R, du_.data(), false, c);
  linear_backward(wk_, nullptr, u_.data(), dk_.data(), R, du_.data(), true, c);
  linear_backward(wv_, nullptr, u_.data(), dv_.data(), R, du_.data(), true, c);
  copy_columns(du_.data(), 2 * d, dne_.data(), d, R, d);
  copy_columns(du_.data() + d, 2 * d, dng_.data(), d, R, d);
  // g feeds the hidden norm and the residual: dg = norm backward + dh1.
  std::memcpy(dg_.data(), dh1_.data(), static_cast<size_t>(R * d) * sizeof(float));
  rmsnorm_backward(hidden_norm_, g_.data(), inv_g_.data(), dng_.data(), R, dg_.data(), true, c);
  float* de = ne_.data();  // the normalized embedding is spent: its buffer takes the embedding's gradient
  rmsnorm_backward(emb_norm_, e_.data(), inv_e_.data(), dne_.data(), R, de, false, c);
  embedding_backward(emb_, b.next_ids, de, R);
  if (T > 0) linear_backward(fc_, nullptr, b.taps, dg_.data(), T, nullptr, false, c);
  return stats;
}

}  // namespace tandem::train
