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
  copy_target_rows(target, false, {}, drafter.embedding());
  copy_target_rows(target, true, drafter.config().draft_vocab, drafter.head());
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

void DflashDraftSource::matmul(const MatrixView& w, const float* x, int64_t rows, float* y, Rows& rw) {
  kernels::matmul(w, x, rows, y, compute_.pool, rw.mm);
}

DflashDraftSource::Rows::Rows(const train::DflashConfig& cfg, int threads, int64_t n_ctx_rows,
                              int64_t n_block_rows, int64_t context)
    : ctx_rows(n_ctx_rows), block_rows(n_block_rows), n_ctx(context), n_threads(threads) {
  const int64_t d = cfg.d, qw = cfg.n_head * cfg.head_dim, kvw = cfg.n_kv_head * cfg.head_dim;
  const int64_t most = std::max(ctx_rows, block_rows);
  const auto sized = [](int64_t rows, int64_t width) {
    return std::vector<float>(static_cast<size_t>(rows * width), 0.0f);
  };
  pos.assign(static_cast<size_t>(most), 0);
  k = sized(most, kvw);
  v = sized(most, kvw);
  in = sized(ctx_rows, cfg.n_taps * d);
  g = sized(ctx_rows, d);
  ctx = sized(ctx_rows, d);
  for (auto* b : {&x, &xn, &h, &hn, &f}) *b = sized(block_rows, d);
  for (auto* b : {&q, &att}) *b = sized(block_rows, qw);
  for (auto* b : {&gate, &up, &act}) *b = sized(block_rows, cfg.ffn);
  inv = sized(most, 1);
  scores = sized(n_threads, n_ctx + cfg.block);
  logits = sized(block_rows, cfg.head_rows());
  mm = kernels::MatmulScratch(n_threads, std::max({cfg.n_taps * d, qw, cfg.ffn, d}), most);
}

DflashDraftBatch::DflashDraftBatch(const train::DflashConfig& config, ThreadPool& pool, int max_sequences,
                                   int64_t n_ctx, int64_t max_rows)
    : cfg_(config) {
  if (max_sequences < 1) throw Error("a DFlash drafter batch holds at least one sequence");
  if (n_ctx < 1) throw Error("the DFlash drafter needs a context of at least one position");
  const auto n = static_cast<size_t>(max_sequences);
  rows_ = DflashDraftSource::Rows(cfg_, pool.size(), std::max<int64_t>(max_rows, 1),
                                  max_sequences * cfg_.block, n_ctx);
  members_.reserve(n);
  spans_.reserve(n);
  blocks_.reserve(n);
}

DflashDraftSource::DflashDraftSource(std::unique_ptr<train::DflashDrafter> drafter, std::vector<int32_t> taps,
                                     ThreadPool& pool, int64_t n_ctx, const model::Model& target,
                                     DflashDraftBatch* batch)
    : TapDraftSource(std::move(taps), drafter->config().n_taps, drafter->config().d, n_ctx, "DFlash"),
      drafter_(std::move(drafter)),
      cfg_(drafter_->config()),
      vocab_(target, cfg_.draft_vocab, cfg_.d),
      compute_(pool),
      n_ctx_(n_ctx),
      kv_width_(cfg_.n_kv_head * cfg_.head_dim) {
  if (batch != nullptr) {
    const train::DflashConfig& b = batch->config();
    if (b.d != cfg_.d || b.n_head != cfg_.n_head || b.n_kv_head != cfg_.n_kv_head ||
        b.head_dim != cfg_.head_dim || b.ffn != cfg_.ffn || b.vocab != cfg_.vocab ||
        b.n_taps != cfg_.n_taps || b.n_layers != cfg_.n_layers || b.block != cfg_.block ||
        b.draft_vocab != cfg_.draft_vocab)
      throw Error(
          "the DFlash drafter's shape differs from its batch's: make the batch from the drafter's config");
    if (batch->rows_.n_ctx < n_ctx_)
      throw Error("the DFlash drafter's context of " + std::to_string(n_ctx_) +
                  " positions is longer than its batch's (" + std::to_string(batch->rows_.n_ctx) +
                  "): make the batch with the sources' context");
    if (batch->rows_.n_threads < pool.size())
      throw Error(
          "the DFlash drafter's batch was made for fewer threads than the drafter's pool: make it with "
          "the sources' pool");
  }
  batch_ = batch;
  const int64_t B = cfg_.block;
  if (cfg_.vocab != vocab_.vocab())
    throw Error("the DFlash drafter's vocabulary of " + std::to_string(cfg_.vocab) +
                " tokens differs from the target's " + std::to_string(vocab_.vocab()) +
                ": train one for this target");
  drafter_->release_target_weights();
  full_.assign(static_cast<size_t>(cfg_.vocab), 0.0f);
  const auto sized = [](int64_t rows, int64_t width) {
    return std::vector<float>(static_cast<size_t>(rows * width), 0.0f);
  };
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    k_.push_back(sized(n_ctx_ + B, kv_width_));
    v_.push_back(sized(n_ctx_ + B, kv_width_));
  }
  if (batch_ == nullptr) own_rows();

  const train::DflashDrafter& m = *drafter_;
  fc_ = make_matrix(m.fc());
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const train::DflashDrafter::Layer& L = m.layer(l);
    for (const train::Param* p : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      layer_mats_.push_back(make_matrix(*p));
  }
}

DflashDraftSource::Rows& DflashDraftSource::own_rows() {
  if (rows_.block_rows == 0) rows_ = Rows(cfg_, compute_.pool.size(), kChunk, cfg_.block, n_ctx_);
  return rows_;
}

std::unique_ptr<DflashDraftSource> DflashDraftSource::load(const std::string& path,
                                                           const model::Model& target,
                                                           const std::string& target_file_hash,
                                                           ThreadPool& pool, int64_t n_ctx,
                                                           DflashDraftBatch* batch) {
  // The metadata first (no parameters), to build a drafter of the recorded shape.
  train::DrafterInfo info = train::load_drafter(path, {});
  const train::DflashConfig cfg = dflash_config_of(info);
  check_eagle_target(info, target, target_file_hash);
  // No f32 copies of the target's embedding and head: the source reads the target's own.
  auto drafter = std::make_unique<train::DflashDrafter>(cfg, 0, cfg.block, /*target_weights=*/false);
  std::vector<train::Param*> params = drafter->params();
  info = train::load_drafter(path, params);
  return std::make_unique<DflashDraftSource>(std::move(drafter), info.tap_layers, pool, n_ctx, target, batch);
}

size_t DflashDraftSource::weight_bytes() const {
  size_t bytes = 0;
  for (const train::Param* p : drafter_->params()) bytes += p->value.size() * sizeof(float);
  bytes += fc_.q8.size() + vocab_.bytes();
  for (const Matrix& m : layer_mats_) bytes += m.q8.size();
  return bytes;
}

void DflashDraftSource::begin(std::span<const int32_t> /*prompt*/, const DraftSettings& settings) {
  begin_generation(settings, tree_branch);
  len_ = 0;
  ctx_len_ = 0;
}

void DflashDraftSource::extend_context(std::span<const Span> spans, Rows& w) {
  const train::DflashDrafter& m = *drafter_;
  const train::Rope rope{cfg_.head_dim, cfg_.rope_theta, cfg_.rope_layout};
  train::Compute& c = compute_;
  const int64_t tw = cfg_.n_taps * cfg_.d, kvw = kv_width_;
  const auto bytes = [](int64_t floats) { return static_cast<size_t>(floats) * sizeof(float); };
  int64_t n = 0;
  for (const Span& s : spans) {
    const DflashDraftSource& src = *s.source;
    for (int64_t i = 0; i < s.n; ++i)
      w.pos[static_cast<size_t>(n + i)] = static_cast<int32_t>(src.ctx_len_ + i);
    std::memcpy(w.in.data() + n * tw, src.taps_.rows(src.ctx_len_, s.n).data(), bytes(s.n * tw));
    n += s.n;
  }
  TANDEM_CHECK(n >= 1 && n <= w.ctx_rows, "a DFlash context forward beyond its rows");
  matmul(fc_.view, w.in.data(), n, w.g.data(), w);
  train::rmsnorm_forward(m.context_norm(), cfg_.norm_eps, w.g.data(), n, w.ctx.data(), w.inv.data(), c);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const Matrix* mats = layer_mats_.data() + l * kLayerMatrices;
    matmul(mats[kWk].view, w.ctx.data(), n, w.k.data(), w);
    matmul(mats[kWv].view, w.ctx.data(), n, w.v.data(), w);
    train::rope_forward(rope, w.k.data(), n, cfg_.n_kv_head, w.pos.data(), c);
    int64_t r = 0;
    for (const Span& s : spans) {
      DflashDraftSource& src = *s.source;
      const auto li = static_cast<size_t>(l);
      std::memcpy(src.k_[li].data() + src.ctx_len_ * kvw, w.k.data() + r * kvw, bytes(s.n * kvw));
      std::memcpy(src.v_[li].data() + src.ctx_len_ * kvw, w.v.data() + r * kvw, bytes(s.n * kvw));
      r += s.n;
    }
  }
  for (const Span& s : spans) s.source->ctx_len_ += s.n;
}

void DflashDraftSource::run_blocks(std::span<const Block> blocks, Rows& w) {
  const train::DflashDrafter& m = *drafter_;
  const int64_t d = cfg_.d, B = cfg_.block, H = cfg_.n_head, Hkv = cfg_.n_kv_head, hd = cfg_.head_dim;
  const int64_t qw = H * hd, group = H / Hkv, F = cfg_.ffn, kvw = kv_width_;
  const auto nb = static_cast<int64_t>(blocks.size()), n = nb * B;
  const float eps = cfg_.norm_eps, scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const train::Rope rope{hd, cfg_.rope_theta, cfg_.rope_layout};
  train::Compute& c = compute_;
  const auto bytes = [](int64_t floats) { return static_cast<size_t>(floats) * sizeof(float); };
  TANDEM_CHECK(nb >= 1 && n <= w.block_rows, "a DFlash block forward beyond its rows");
  for (int64_t b = 0; b < nb; ++b) {
    const Block& blk = blocks[static_cast<size_t>(b)];
    TANDEM_CHECK(blk.source->n_ctx_ <= w.n_ctx, "a DFlash source's context is longer than its scratch's");
    for (int64_t i = 0; i < B; ++i) {
      w.pos[static_cast<size_t>(b * B + i)] = static_cast<int32_t>(blk.first_pos + i);
      float* x = w.x.data() + (b * B + i) * d;
      if (i == 0)
        vocab_.embed(blk.anchor, x);
      else
        std::memcpy(x, m.mask_embedding().value.data(), bytes(d));
    }
  }
  const int64_t stride = w.n_ctx + B;  // per thread's scores
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const train::DflashDrafter::Layer& L = m.layer(l);
    const auto li = static_cast<size_t>(l);
    train::rmsnorm_forward(L.attn_norm, eps, w.x.data(), n, w.xn.data(), w.inv.data(), c);
    const Matrix* mats = layer_mats_.data() + l * kLayerMatrices;
    matmul(mats[kWq].view, w.xn.data(), n, w.q.data(), w);
    matmul(mats[kWk].view, w.xn.data(), n, w.k.data(), w);
    matmul(mats[kWv].view, w.xn.data(), n, w.v.data(), w);
    train::rope_forward(rope, w.q.data(), n, H, w.pos.data(), c);
    train::rope_forward(rope, w.k.data(), n, Hkv, w.pos.data(), c);
    // Each block's keys and values follow its own context.
    for (int64_t b = 0; b < nb; ++b) {
      DflashDraftSource& src = *blocks[static_cast<size_t>(b)].source;
      std::memcpy(src.k_[li].data() + src.ctx_len_ * kvw, w.k.data() + b * B * kvw, bytes(B * kvw));
      std::memcpy(src.v_[li].data() + src.ctx_len_ * kvw, w.v.data() + b * B * kvw, bytes(B * kvw));
    }
    // Every block row sees every row of its own sequence's context and every row of its own block.
    c.pool.parallel_for(n * H, 1, [&](int64_t i0, int64_t i1, int t) {
      float* scores = w.scores.data() + static_cast<int64_t>(t) * stride;
      for (int64_t ih = i0; ih < i1; ++ih) {
        const int64_t i = ih / H, h = ih % H, kvo = h / group * hd;
        const DflashDraftSource& src = *blocks[static_cast<size_t>(i / B)].source;
        const float* kc = src.k_[li].data();
        const float* vc = src.v_[li].data();
        const int64_t keys = src.ctx_len_ + B;
        const float* qh = w.q.data() + i * qw + h * hd;
        float top = -INFINITY;
        for (int64_t j = 0; j < keys; ++j) {
          const float* kj = kc + j * kvw + kvo;
          float s = 0.0f;
          for (int64_t x = 0; x < hd; ++x) s += qh[x] * kj[x];
          scores[j] = s * scale;
          top = std::max(top, scores[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < keys; ++j) sum += scores[j] = std::exp(scores[j] - top);
        const float inv = 1.0f / sum;
        float* out = w.att.data() + i * qw + h * hd;
        std::fill(out, out + hd, 0.0f);
        for (int64_t j = 0; j < keys; ++j) {
          const float wt = scores[j] * inv;
          const float* vj = vc + j * kvw + kvo;
          for (int64_t x = 0; x < hd; ++x) out[x] += wt * vj[x];
        }
      }
    });
    matmul(mats[kWo].view, w.att.data(), n, w.h.data(), w);
    train::add_into(w.h.data(), w.x.data(), n * d, c);
    train::rmsnorm_forward(L.ffn_norm, eps, w.h.data(), n, w.hn.data(), w.inv.data(), c);
    matmul(mats[kGate].view, w.hn.data(), n, w.gate.data(), w);
    matmul(mats[kUp].view, w.hn.data(), n, w.up.data(), w);
    train::swiglu_forward(w.gate.data(), w.up.data(), n * F, w.act.data(), c);
    matmul(mats[kDown].view, w.act.data(), n, w.x.data(), w);
    train::add_into(w.x.data(), w.h.data(), n * d, c);
  }
  // The wanted rows of every block, one after another (into h, free now), through the output head.
  int64_t wanted = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const Block& blk = blocks[static_cast<size_t>(b)];
    blk.source->len_ = blk.source->ctx_len_ + B;
    std::memcpy(w.h.data() + wanted * d, w.x.data() + b * B * d, bytes(blk.rows * d));
    wanted += blk.rows;
  }
  if (wanted == 0) return;
  train::rmsnorm_forward(m.output_norm(), eps, w.h.data(), wanted, w.f.data(), w.inv.data(), c);
  matmul(vocab_.head(), w.f.data(), wanted, w.logits.data(), w);
}

void DflashDraftSource::draw(std::span<const int32_t> committed, const float* logits, int64_t depth,
                             Draft& out) {
  const auto n = static_cast<int64_t>(committed.size());
  history_.assign(committed.begin(), committed.end());
  for (int64_t i = 0; i < depth; ++i) {
    sampling::Distribution& q = out.q_slot(static_cast<size_t>(i));
    vocab_.expand(logits + i * vocab_.size(), full_.data());
    sampler_.distribution(full_, history_, q);
    const int32_t x = sampler_.draw(q, sequence_, static_cast<uint64_t>(n + i), kDrawDraft);
    out.tokens.push_back(x);
    history_.push_back(x);
  }
  out.sampled = sampler_.params().temperature > 0.0f;
}

void DflashDraftSource::propose(std::span<const int32_t> committed, int max_depth, Draft& out) {
  out.clear();
  const auto n = static_cast<int64_t>(committed.size());
  const int64_t depth = std::min<int64_t>(max_depth, cfg_.block);
  if (n < 1 || depth < 1 || n - 1 > n_ctx_) return;
  Rows& w = run_own_block(committed, depth);
  draw(committed, w.logits.data(), depth, out);
}

DflashDraftSource::Rows& DflashDraftSource::run_own_block(std::span<const int32_t> committed, int64_t depth) {
  const auto n = static_cast<int64_t>(committed.size());
  Rows& w = own_rows();
  // Context rows cover the positions the target has evaluated: every committed token but the last.
  ctx_len_ = len_ = std::min(ctx_len_, n - 1);
  while (ctx_len_ < n - 1) {
    const Span span{this, std::min(w.ctx_rows, n - 1 - ctx_len_)};
    extend_context(std::span<const Span>(&span, 1), w);
  }
  const Block block{this, committed[static_cast<size_t>(n - 1)], n - 1, depth};
  run_blocks(std::span<const Block>(&block, 1), w);
  return w;
}

void DflashDraftSource::propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth,
                                     Draft& out) {
  out.clear();
  const auto n = static_cast<int64_t>(committed.size());
  const int64_t depth = std::min<int64_t>(max_depth, cfg_.block);
  if (n < 1 || depth < 1 || max_nodes < 1 || n - 1 > n_ctx_) return;
  Rows& w = run_own_block(committed, depth);
  // Row i's children hang from the chain's node at depth i (the committed text for row 0).
  tree_.clear(n);
  int32_t chain = -1;
  for (int64_t i = 0; i < depth; ++i) {
    tree_.path_text(chain, committed, history_);
    const auto first = static_cast<int32_t>(tree_.size());
    vocab_.expand(w.logits.data() + i * vocab_.size(), full_.data());
    tree_.add_children(chain, full_, history_, tree_cover);
    chain = first;  // the row's most probable token continues the chain
  }
  tree_.propose(max_nodes, out);
}

void DflashDraftSource::propose_batch(std::span<const DraftRequest> requests) {
  TANDEM_CHECK(batch_ != nullptr, "a DFlash drafter proposes in batches only with a DflashDraftBatch");
  DflashDraftBatch& b = *batch_;
  Rows& w = b.rows_;
  auto& members = b.members_;
  members.clear();
  for (const DraftRequest& r : requests) {
    auto& src = static_cast<DflashDraftSource&>(*r.source);
    TANDEM_CHECK(src.batch_ == batch_, "the sources of a batched proposal share their batch");
    TANDEM_CHECK(members.size() < members.capacity(), "more sequences propose together than the batch holds");
    r.out->clear();
    const auto n = static_cast<int64_t>(r.committed.size());
    const int64_t depth = std::min<int64_t>(r.max_depth, cfg_.block);
    if (n < 1 || depth < 1 || n - 1 > src.n_ctx_) continue;
    src.ctx_len_ = src.len_ = std::min(src.ctx_len_, n - 1);
    members.push_back({&src, r.committed, depth, r.out});
  }
  ++b.proposals_;
  b.widest_ = std::max(b.widest_, static_cast<int64_t>(members.size()));
  if (members.empty()) return;
  // The context rows each member lacks (every committed position but the last), in forwards shared across
  // members.
  for (;;) {
    b.spans_.clear();
    int64_t rows = 0;
    for (const DflashDraftBatch::Member& m : members) {
      DflashDraftSource& src = *m.source;
      const int64_t missing = static_cast<int64_t>(m.committed.size()) - 1 - src.ctx_len_;
      if (missing <= 0 || rows >= w.ctx_rows) continue;
      const int64_t chunk = std::min(missing, w.ctx_rows - rows);
      b.spans_.push_back({&src, chunk});
      rows += chunk;
    }
    if (b.spans_.empty()) break;
    extend_context(b.spans_, w);
  }
  // Then every member's block in one forward.
  b.blocks_.clear();
  for (const DflashDraftBatch::Member& m : members)
    b.blocks_.push_back(
        {m.source, m.committed.back(), static_cast<int64_t>(m.committed.size()) - 1, m.depth});
  run_blocks(b.blocks_, w);
  int64_t at = 0;
  for (const DflashDraftBatch::Member& m : members) {
    m.source->draw(m.committed, w.logits.data() + at * vocab_.size(), m.depth, *m.out);
    at += m.depth;
  }
}

void DflashDraftSource::accept(std::span<const int32_t> committed, int /*n_accepted*/) {
  // The target has evaluated every committed token but the last; taps past it were of rejected drafts.
  const int64_t evaluated = std::max<int64_t>(0, static_cast<int64_t>(committed.size()) - 1);
  ctx_len_ = std::min(ctx_len_, evaluated);
  len_ = ctx_len_;
  taps_.truncate(evaluated);
}

}  // namespace tandem::speculative
