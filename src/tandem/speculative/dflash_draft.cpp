#include "tandem/speculative/dflash_draft.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/speculative/eagle_draft.h"
#include "tandem/tensor/quant.h"
#include "tandem/train/layers.h"
#include "tandem/util/error.h"

namespace tandem::speculative {
namespace {

constexpr int64_t kChunk = 64;  // context rows per forward when catching up with the target
constexpr int64_t kQuantizeEntries = int64_t{1} << 20;
enum LayerMatrix { kWq, kWk, kWv, kWo, kGate, kUp, kDown, kLayerMatrices };

}  // namespace

train::DflashConfig dflash_config_for(const model::Model& target, int64_t n_taps, int64_t n_layers,
                                      int64_t block) {
  const model::Config& c = target.config();
  train::DflashConfig e;
  e.d = c.n_embd;
  e.n_head = c.n_head;
  e.n_kv_head = c.n_head_kv;
  e.head_dim = c.head_dim;
  e.ffn = c.n_ff;
  e.vocab = c.n_vocab;
  e.n_taps = n_taps;
  e.n_layers = n_layers;
  e.block = block;
  e.rope_theta = c.rope_base;
  e.norm_eps = c.norm_eps;
  return e;
}

train::DflashConfig dflash_config_of(const train::DrafterInfo& info) {
  if (info.kind != kDflashKind)
    throw Error("the drafter is of kind '" + info.kind + "', not '" + kDflashKind + "'");
  train::DflashConfig e;
  e.d = info.d;
  e.n_head = info.n_head;
  e.n_kv_head = info.n_kv_head;
  e.head_dim = info.head_dim;
  e.ffn = info.ffn;
  e.vocab = info.vocab;
  e.n_taps = static_cast<int64_t>(info.tap_layers.size());
  e.n_layers = info.layer_count;
  e.block = info.block_size;
  e.rope_theta = info.rope_theta;
  e.rope_layout = info.rope_layout == "halves" ? train::RopeLayout::kHalves : train::RopeLayout::kInterleaved;
  e.norm_eps = info.norm_eps;
  return e;
}

void set_dflash_shape(train::DrafterInfo& info, const train::DflashConfig& e) {
  info.kind = kDflashKind;
  info.block_size = e.block;
  info.layer_count = e.n_layers;
  info.d = e.d;
  info.n_head = e.n_head;
  info.n_kv_head = e.n_kv_head;
  info.head_dim = e.head_dim;
  info.ffn = e.ffn;
  info.vocab = e.vocab;
  info.rope_theta = e.rope_theta;
  info.rope_layout = e.rope_layout == train::RopeLayout::kHalves ? "halves" : "interleaved";
  info.norm_eps = e.norm_eps;
  info.own_head = false;
}

void copy_target_weights(const model::Model& target, train::DflashDrafter& drafter) {
  copy_target_matrix(target, "token_embd.weight", drafter.embedding());
  copy_target_matrix(target, "output.weight", drafter.head());
}

DflashDraftSource::Matrix DflashDraftSource::make_matrix(const train::Param& p) {
  Matrix m;
  m.view.rows = p.rows;
  m.view.cols = p.cols;
  if (p.cols % 32 != 0 || p.size() < kQuantizeEntries) {
    m.view.type = DType::F32;
    m.view.row_bytes = static_cast<size_t>(p.cols) * sizeof(float);
    m.view.data = reinterpret_cast<const uint8_t*>(p.value.data());
    return m;
  }
  m.view.type = DType::Q8_0;
  m.view.row_bytes = row_bytes(DType::Q8_0, p.cols);
  m.q8.resize(m.view.row_bytes * static_cast<size_t>(p.rows));
  for (int64_t r = 0; r < p.rows; ++r)
    quantize_row(DType::Q8_0, p.value.data() + r * p.cols,
                 m.q8.data() + static_cast<size_t>(r) * m.view.row_bytes, p.cols);
  m.view.data = m.q8.data();
  return m;
}

void DflashDraftSource::matmul(const MatrixView& w, const float* x, int64_t rows, float* y) {
  kernels::matmul(w, x, rows, y, compute_.pool, mm_scratch_);
}

DflashDraftSource::DflashDraftSource(std::unique_ptr<train::DflashDrafter> drafter, std::vector<int32_t> taps,
                                     ThreadPool& pool, int64_t n_ctx, const MatrixView* target_head)
    : drafter_(std::move(drafter)),
      cfg_(drafter_->config()),
      taps_layers_(std::move(taps)),
      layers_(taps_layers_.begin(), taps_layers_.end()),
      compute_(pool),
      n_ctx_(n_ctx),
      kv_width_(cfg_.n_kv_head * cfg_.head_dim) {
  if (static_cast<int64_t>(taps_layers_.size()) != cfg_.n_taps)
    throw Error("the DFlash drafter reads " + std::to_string(cfg_.n_taps) + " tap layers, but " +
                std::to_string(taps_layers_.size()) + " were named");
  if (n_ctx_ < 1) throw Error("the DFlash drafter needs a context of at least one position");
  const int64_t d = cfg_.d, B = cfg_.block, qw = cfg_.n_head * cfg_.head_dim;
  const auto sized = [](int64_t rows, int64_t width) {
    return std::vector<float>(static_cast<size_t>(rows * width), 0.0f);
  };
  taps_ = sized(n_ctx_, cfg_.n_taps * d);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    k_.push_back(sized(n_ctx_ + B, kv_width_));
    v_.push_back(sized(n_ctx_ + B, kv_width_));
  }
  const int64_t rows = std::max(kChunk, B);
  pos_.assign(static_cast<size_t>(rows), 0);
  for (auto* b : {&g_, &ctx_, &x_, &xn_, &h_, &hn_, &f_}) *b = sized(rows, d);
  for (auto* b : {&q_, &att_}) *b = sized(B, qw);
  for (auto* b : {&gate_, &up_, &act_}) *b = sized(B, cfg_.ffn);
  inv_ = sized(rows, 1);
  scores_ = sized(pool.size(), n_ctx_ + B);
  logits_ = sized(B, cfg_.vocab);

  const train::DflashDrafter& m = *drafter_;
  fc_ = make_matrix(m.fc());
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const train::DflashDrafter::Layer& L = m.layer(l);
    for (const train::Param* p : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      layer_mats_.push_back(make_matrix(*p));
  }
  if (target_head != nullptr) {
    head_ = *target_head;
  } else {
    head_.type = DType::F32;
    head_.rows = m.head().rows;
    head_.cols = m.head().cols;
    head_.row_bytes = static_cast<size_t>(head_.cols) * sizeof(float);
    head_.data = reinterpret_cast<const uint8_t*>(m.head().value.data());
  }
  if (head_.rows != cfg_.vocab || head_.cols != d)
    throw Error("the target's output head is [" + std::to_string(head_.rows) + ", " +
                std::to_string(head_.cols) + "], the DFlash drafter needs [" + std::to_string(cfg_.vocab) +
                ", " + std::to_string(d) + "]");
  const int64_t max_cols = std::max({cfg_.n_taps * d, qw, cfg_.ffn, d});
  mm_scratch_ = kernels::MatmulScratch(pool.size(), max_cols, rows);
}

std::unique_ptr<DflashDraftSource> DflashDraftSource::load(const std::string& path,
                                                           const model::Model& target,
                                                           const std::string& target_file_hash,
                                                           ThreadPool& pool, int64_t n_ctx) {
  // The metadata first (no parameters), to build a drafter of the recorded shape.
  train::DrafterInfo info = train::load_drafter(path, {});
  const train::DflashConfig cfg = dflash_config_of(info);
  check_eagle_target(info, target, target_file_hash);
  auto drafter = std::make_unique<train::DflashDrafter>(cfg, 0, cfg.block);
  std::vector<train::Param*> params = drafter->params();
  info = train::load_drafter(path, params);
  copy_target_weights(target, *drafter);
  return std::make_unique<DflashDraftSource>(std::move(drafter), info.tap_layers, pool, n_ctx,
                                             &target.weights().output);
}

void DflashDraftSource::begin(std::span<const int32_t> /*prompt*/, const DraftSettings& settings) {
  sampler_ = sampling::Sampler(settings.sampling);
  sequence_ = settings.sequence_id;
  len_ = 0;
  ctx_len_ = 0;
}

void DflashDraftSource::on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                                         int64_t first_pos) {
  const int64_t d = cfg_.d, width = cfg_.n_taps * d;
  for (int64_t t = 0; t < cfg_.n_taps; ++t) {
    if (taps_layers_[static_cast<size_t>(t)] != layer) continue;
    for (int64_t r = 0; r < n_rows && first_pos + r < n_ctx_; ++r)
      std::memcpy(taps_.data() + (first_pos + r) * width + t * d, hidden.data() + r * d,
                  static_cast<size_t>(d) * sizeof(float));
  }
}

void DflashDraftSource::set_taps(int64_t first_pos, std::span<const float> rows) {
  const int64_t width = cfg_.n_taps * cfg_.d;
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(rows.size()) / width, n_ctx_ - first_pos);
  if (n > 0)
    std::memcpy(taps_.data() + first_pos * width, rows.data(),
                static_cast<size_t>(n * width) * sizeof(float));
}

void DflashDraftSource::extend_context(int64_t n) {
  const train::DflashDrafter& m = *drafter_;
  const train::Rope rope{cfg_.head_dim, cfg_.rope_theta, cfg_.rope_layout};
  train::Compute& c = compute_;
  for (int64_t i = 0; i < n; ++i) pos_[static_cast<size_t>(i)] = static_cast<int32_t>(ctx_len_ + i);
  matmul(fc_.view, taps_.data() + ctx_len_ * cfg_.n_taps * cfg_.d, n, g_.data());
  train::rmsnorm_forward(m.context_norm(), cfg_.norm_eps, g_.data(), n, ctx_.data(), inv_.data(), c);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    float* k = k_[static_cast<size_t>(l)].data() + ctx_len_ * kv_width_;
    float* v = v_[static_cast<size_t>(l)].data() + ctx_len_ * kv_width_;
    const Matrix* mats = layer_mats_.data() + l * kLayerMatrices;
    matmul(mats[kWk].view, ctx_.data(), n, k);
    matmul(mats[kWv].view, ctx_.data(), n, v);
    train::rope_forward(rope, k, n, cfg_.n_kv_head, pos_.data(), c);
  }
  ctx_len_ += n;
}

void DflashDraftSource::run_block(int32_t anchor, int64_t first_pos, int64_t rows) {
  const train::DflashDrafter& m = *drafter_;
  const int64_t d = cfg_.d, B = cfg_.block, H = cfg_.n_head, Hkv = cfg_.n_kv_head, hd = cfg_.head_dim;
  const int64_t qw = H * hd, group = H / Hkv, keys = ctx_len_ + B, F = cfg_.ffn;
  const float eps = cfg_.norm_eps, scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const train::Rope rope{hd, cfg_.rope_theta, cfg_.rope_layout};
  train::Compute& c = compute_;
  if (anchor < 0 || anchor >= cfg_.vocab)
    throw Error("token id " + std::to_string(anchor) + " is outside the drafter's vocabulary of " +
                std::to_string(cfg_.vocab));
  for (int64_t i = 0; i < B; ++i) {
    pos_[static_cast<size_t>(i)] = static_cast<int32_t>(first_pos + i);
    const float* src = i == 0 ? m.embedding().value.data() + static_cast<int64_t>(anchor) * d
                              : m.mask_embedding().value.data();
    std::memcpy(x_.data() + i * d, src, static_cast<size_t>(d) * sizeof(float));
  }
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const train::DflashDrafter::Layer& L = m.layer(l);
    const float* kc = k_[static_cast<size_t>(l)].data();
    const float* vc = v_[static_cast<size_t>(l)].data();
    float* kb = k_[static_cast<size_t>(l)].data() + ctx_len_ * kv_width_;
    float* vb = v_[static_cast<size_t>(l)].data() + ctx_len_ * kv_width_;
    train::rmsnorm_forward(L.attn_norm, eps, x_.data(), B, xn_.data(), inv_.data(), c);
    const Matrix* mats = layer_mats_.data() + l * kLayerMatrices;
    matmul(mats[kWq].view, xn_.data(), B, q_.data());
    matmul(mats[kWk].view, xn_.data(), B, kb);
    matmul(mats[kWv].view, xn_.data(), B, vb);
    train::rope_forward(rope, q_.data(), B, H, pos_.data(), c);
    train::rope_forward(rope, kb, B, Hkv, pos_.data(), c);
    // Every block row sees every context row and every block row.
    c.pool.parallel_for(B * H, 1, [&](int64_t i0, int64_t i1, int t) {
      float* scores = scores_.data() + static_cast<int64_t>(t) * (n_ctx_ + B);
      for (int64_t ih = i0; ih < i1; ++ih) {
        const int64_t i = ih / H, h = ih % H, kvo = h / group * hd;
        const float* qh = q_.data() + i * qw + h * hd;
        float top = -INFINITY;
        for (int64_t j = 0; j < keys; ++j) {
          const float* kj = kc + j * kv_width_ + kvo;
          float s = 0.0f;
          for (int64_t x = 0; x < hd; ++x) s += qh[x] * kj[x];
          scores[j] = s * scale;
          top = std::max(top, scores[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < keys; ++j) sum += scores[j] = std::exp(scores[j] - top);
        const float inv = 1.0f / sum;
        float* out = att_.data() + i * qw + h * hd;
        std::fill(out, out + hd, 0.0f);
        for (int64_t j = 0; j < keys; ++j) {
          const float w = scores[j] * inv;
          const float* vj = vc + j * kv_width_ + kvo;
          for (int64_t x = 0; x < hd; ++x) out[x] += w * vj[x];
        }
      }
    });
    matmul(mats[kWo].view, att_.data(), B, h_.data());
    train::add_into(h_.data(), x_.data(), B * d, c);
    train::rmsnorm_forward(L.ffn_norm, eps, h_.data(), B, hn_.data(), inv_.data(), c);
    matmul(mats[kGate].view, hn_.data(), B, gate_.data());
    matmul(mats[kUp].view, hn_.data(), B, up_.data());
    train::swiglu_forward(gate_.data(), up_.data(), B * F, act_.data(), c);
    matmul(mats[kDown].view, act_.data(), B, x_.data());
    train::add_into(x_.data(), h_.data(), B * d, c);
  }
  len_ = ctx_len_ + B;
  train::rmsnorm_forward(m.output_norm(), eps, x_.data(), rows, f_.data(), inv_.data(), c);
  matmul(head_, f_.data(), rows, logits_.data());
}

void DflashDraftSource::propose(std::span<const int32_t> committed, int max_depth, Draft& out) {
  out.clear();
  const auto n = static_cast<int64_t>(committed.size());
  const int64_t depth = std::min<int64_t>(max_depth, cfg_.block);
  if (n < 1 || depth < 1 || n - 1 > n_ctx_) return;
  // Context rows cover the positions the target has evaluated: every committed token but the last.
  ctx_len_ = len_ = std::min(ctx_len_, n - 1);
  while (ctx_len_ < n - 1) extend_context(std::min(kChunk, n - 1 - ctx_len_));
  run_block(committed[static_cast<size_t>(n - 1)], n - 1, depth);

  history_.assign(committed.begin(), committed.end());
  const bool sampled = sampler_.params().temperature > 0.0f;
  for (int64_t i = 0; i < depth; ++i) {
    sampling::Distribution& q = out.q_slot(static_cast<size_t>(i));
    const std::span<const float> logits(logits_.data() + i * cfg_.vocab, static_cast<size_t>(cfg_.vocab));
    sampler_.distribution(logits, history_, q);
    const int32_t x = sampler_.draw(q, sequence_, static_cast<uint64_t>(n + i), kDrawDraft);
    out.tokens.push_back(x);
    history_.push_back(x);
  }
  out.sampled = sampled;
}

void DflashDraftSource::accept(std::span<const int32_t> committed, int /*n_accepted*/) {
  ctx_len_ = std::min<int64_t>(ctx_len_, std::max<int64_t>(0, static_cast<int64_t>(committed.size()) - 1));
  len_ = ctx_len_;
}

}  // namespace tandem::speculative
