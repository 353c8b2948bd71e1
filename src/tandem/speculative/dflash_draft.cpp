#include "tandem/speculative/dflash_draft.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "tandem/speculative/drafter_shape.h"
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
  train::DflashConfig e;
  shape_from_target(target, n_taps, e);
  e.n_layers = n_layers;
  e.block = block;
  return e;
}

train::DflashConfig dflash_config_of(const train::DrafterInfo& info) {
  if (info.kind != kDflashKind)
    throw Error("the drafter is of kind '" + info.kind + "', not '" + kDflashKind + "'");
  train::DflashConfig e;
  shape_from_info(info, e);
  e.n_layers = info.layer_count;
  e.block = info.block_size;
  return e;
}

void set_dflash_shape(train::DrafterInfo& info, const train::DflashConfig& e) {
  info.kind = kDflashKind;
  info.block_size = e.block;
  info.layer_count = e.n_layers;
  shape_to_info(e, info);
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
                                     ThreadPool& pool, int64_t n_ctx, const model::Model& target)
    : drafter_(std::move(drafter)),
      cfg_(drafter_->config()),
      embedding_(target.weights().tok_embd),
      head_(target.weights().output),
      compute_(pool),
      n_ctx_(n_ctx),
      kv_width_(cfg_.n_kv_head * cfg_.head_dim),
      taps_(std::move(taps), cfg_.n_taps, cfg_.d, n_ctx, "DFlash") {
  const int64_t d = cfg_.d, B = cfg_.block, qw = cfg_.n_head * cfg_.head_dim;
  for (const auto& [what, m] : {std::pair{"token embedding", &embedding_}, std::pair{"output head", &head_}})
    if (m->rows != cfg_.vocab || m->cols != d)
      throw Error(std::string("the target's ") + what + " is [" + std::to_string(m->rows) + ", " +
                  std::to_string(m->cols) + "], the DFlash drafter needs [" + std::to_string(cfg_.vocab) +
                  ", " + std::to_string(d) + "]");
  // The embedding is read a row at a time, so it must be in the file's row layout (the model repacks
  // only matrices that the matmul kernels read).
  TANDEM_CHECK(embedding_.form == WeightForm::kFile, "the target's token embedding is in its file form");
  drafter_->release_target_weights();
  const auto sized = [](int64_t rows, int64_t width) {
    return std::vector<float>(static_cast<size_t>(rows * width), 0.0f);
  };
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
  // No f32 copies of the target's embedding and head: the source reads the target's own.
  auto drafter = std::make_unique<train::DflashDrafter>(cfg, 0, cfg.block, /*target_weights=*/false);
  std::vector<train::Param*> params = drafter->params();
  info = train::load_drafter(path, params);
  return std::make_unique<DflashDraftSource>(std::move(drafter), info.tap_layers, pool, n_ctx, target);
}

size_t DflashDraftSource::weight_bytes() const {
  size_t bytes = 0;
  for (const train::Param* p : drafter_->params()) bytes += p->value.size() * sizeof(float);
  bytes += fc_.q8.size();
  for (const Matrix& m : layer_mats_) bytes += m.q8.size();
  return bytes;
}

void DflashDraftSource::begin(std::span<const int32_t> /*prompt*/, const DraftSettings& settings) {
  sampler_ = sampling::Sampler(settings.sampling);
  sequence_ = settings.sequence_id;
  len_ = 0;
  ctx_len_ = 0;
  taps_.truncate(0);
}

void DflashDraftSource::on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                                         int64_t first_pos) {
  taps_.capture(layer, hidden, n_rows, first_pos);
}

void DflashDraftSource::set_taps(int64_t first_pos, std::span<const float> rows) {
  taps_.set(first_pos, rows);
}

void DflashDraftSource::extend_context(int64_t n) {
  const train::DflashDrafter& m = *drafter_;
  const train::Rope rope{cfg_.head_dim, cfg_.rope_theta, cfg_.rope_layout};
  train::Compute& c = compute_;
  for (int64_t i = 0; i < n; ++i) pos_[static_cast<size_t>(i)] = static_cast<int32_t>(ctx_len_ + i);
  matmul(fc_.view, taps_.rows(ctx_len_, n).data(), n, g_.data());
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
    if (i == 0)
      dequantize_row(embedding_.type, embedding_.row(anchor), x_.data(), d);
    else
      std::memcpy(x_.data() + i * d, m.mask_embedding().value.data(), static_cast<size_t>(d) * sizeof(float));
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
  // The target has evaluated every committed token but the last; taps past it were of rejected drafts.
  const int64_t evaluated = std::max<int64_t>(0, static_cast<int64_t>(committed.size()) - 1);
  ctx_len_ = std::min(ctx_len_, evaluated);
  len_ = ctx_len_;
  taps_.truncate(evaluated);
}

}  // namespace tandem::speculative
