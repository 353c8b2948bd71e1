#include "tandem/speculative/eagle_draft.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "tandem/speculative/calibration.h"
#include "tandem/speculative/drafter_shape.h"
#include "tandem/train/layers.h"
#include "tandem/util/error.h"

namespace tandem::speculative {
namespace {

constexpr int64_t kChunk = 64;  // real rows per drafter forward when catching up with the target

const train::Param* find(std::span<train::Param* const> params, const char* name) {
  for (const train::Param* p : params)
    if (p->name == name) return p;
  throw Error(std::string("the EAGLE drafter has no parameter ") + name);
}

std::string join(std::span<const int32_t> v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

std::string vocabulary_hash(const gguf::File& file) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (std::string_view token : file.get_strings("tokenizer.ggml.tokens")) {
    for (char ch : token) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
    h *= 0x100000001b3ull;  // the 0 byte that ends each token
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::vector<int32_t> default_eagle_taps(int64_t n_layer) {
  const auto clamp = [&](int64_t l) { return static_cast<int32_t>(std::clamp<int64_t>(l, 0, n_layer - 1)); };
  std::vector<int32_t> taps = {clamp(2), clamp(n_layer / 2), clamp(n_layer - 3)};
  if (taps[0] >= taps[1] || taps[1] >= taps[2]) taps = {clamp(1), clamp(n_layer / 2), clamp(n_layer - 1)};
  taps.erase(std::unique(taps.begin(), taps.end()), taps.end());
  return taps;
}

train::EagleConfig eagle_config_for(const model::Model& target, int64_t n_taps) {
  train::EagleConfig e;
  shape_from_target(target, n_taps, e);
  return e;
}

train::EagleConfig eagle_config_of(const train::DrafterInfo& info) {
  if (info.kind != kEagleKind)
    throw Error("the drafter is of kind '" + info.kind + "', not '" + kEagleKind + "'");
  train::EagleConfig e;
  shape_from_info(info, e);
  e.train_head = info.own_head;
  e.n_layer = info.layer_count;
  return e;
}

void set_eagle_shape(train::DrafterInfo& info, const train::EagleConfig& e) {
  info.kind = kEagleKind;
  info.block_size = 1;
  info.layer_count = e.n_layer;
  shape_to_info(e, info);
  info.own_head = e.train_head;
}

void copy_target_weights(const model::Model& target, train::EagleDrafter& drafter) {
  copy_target_rows(target, false, {}, drafter.embedding());
  if (!drafter.config().train_head)
    copy_target_rows(target, true, drafter.config().draft_vocab, drafter.head());
}

void check_eagle_target(const train::DrafterInfo& info, const model::Model& target,
                        const std::string& target_file_hash) {
  const std::string vocab = vocabulary_hash(target.file());
  if (info.target_vocab_hash != vocab || info.vocab != target.config().n_vocab)
    throw Error("the drafter was made for another vocabulary (hash " + info.target_vocab_hash + ", " +
                std::to_string(info.vocab) + " tokens; this target: " + vocab + ", " +
                std::to_string(target.config().n_vocab) +
                " tokens): train one for this target with `tandem train-drafter`");
  if (info.target_file_hash != target_file_hash)
    throw Error("the drafter was made for another target file (hash " + info.target_file_hash +
                "; this target: " + target_file_hash +
                "): use the target it was trained on, or train one for this target");
  const int64_t n_layer = target.config().n_layer;
  const bool taps_fit = std::all_of(info.tap_layers.begin(), info.tap_layers.end(),
                                    [&](int32_t l) { return l >= 0 && l < n_layer; });
  if (!taps_fit || info.d != target.config().n_embd)
    throw Error("the drafter's tap layers (" + join(info.tap_layers) + ", width " + std::to_string(info.d) +
                ") do not fit this target (" + std::to_string(n_layer) + " layers, width " +
                std::to_string(target.config().n_embd) + "): train one for this target");
}

EagleDraftSource::Rows::Rows(const train::EagleConfig& cfg, int threads, int64_t n, int64_t n_logits,
                             int64_t context)
    : rows(n), logit_rows(n_logits), n_ctx(context), n_threads(threads) {
  const int64_t d = cfg.d, qw = cfg.n_head * cfg.head_dim, kvw = cfg.n_kv_head * cfg.head_dim;
  const auto sized = [&](int64_t width) { return std::vector<float>(static_cast<size_t>(n * width), 0.0f); };
  pos.assign(static_cast<size_t>(n), 0);
  ids.assign(static_cast<size_t>(n), 0);
  segment.assign(static_cast<size_t>(n), 0);
  visible.assign(static_cast<size_t>(n), 0);
  node.assign(static_cast<size_t>(n), -1);
  scores.assign(static_cast<size_t>(threads * context), 0.0f);
  in = sized(cfg.n_taps * d);
  for (auto* b : {&g, &e, &ne, &ng, &h1, &n2, &h2, &f}) *b = sized(d);
  u = sized(2 * d);
  q = sized(qw);
  att = sized(qw);
  k = sized(kvw);
  v = sized(kvw);
  for (auto* b : {&gate, &up, &act}) *b = sized(cfg.ffn);
  inv = sized(1);
  logits.assign(static_cast<size_t>(n_logits * cfg.head_rows()), 0.0f);
  mm = kernels::MatmulScratch(threads, d, std::max<int64_t>(n_logits, 1));
}

namespace {

bool same_shape(const train::EagleConfig& a, const train::EagleConfig& b) {
  return a.d == b.d && a.n_head == b.n_head && a.n_kv_head == b.n_kv_head && a.head_dim == b.head_dim &&
         a.ffn == b.ffn && a.vocab == b.vocab && a.n_taps == b.n_taps && a.n_layer == b.n_layer &&
         a.draft_vocab == b.draft_vocab;
}

}  // namespace

EagleDraftBatch::EagleDraftBatch(const train::EagleConfig& config, ThreadPool& pool, int max_sequences,
                                 int64_t n_ctx, int64_t max_rows)
    : cfg_(config) {
  if (max_sequences < 1) throw Error("an EAGLE drafter batch holds at least one sequence");
  if (n_ctx < 1) throw Error("the EAGLE drafter needs a context of at least one position");
  const auto n = static_cast<size_t>(max_sequences);
  rows_ = EagleDraftSource::Rows(cfg_, pool.size(), std::max<int64_t>(max_rows, max_sequences), max_sequences,
                                 n_ctx);
  members_.reserve(n);
  segments_.reserve(n);
}

EagleDraftSource::EagleDraftSource(std::unique_ptr<train::EagleDrafter> drafter, std::vector<int32_t> taps,
                                   ThreadPool& pool, int64_t n_ctx, const model::Model& target,
                                   EagleDraftBatch* batch)
    : TapDraftSource(std::move(taps), drafter->config().n_taps, drafter->config().d, n_ctx, "EAGLE"),
      drafter_(std::move(drafter)),
      cfg_(drafter_->config()),
      compute_(pool),
      n_ctx_(n_ctx),
      kv_width_(cfg_.n_kv_head * cfg_.head_dim),
      vocab_(target, cfg_.draft_vocab, cfg_.d, !cfg_.train_head) {
  if (cfg_.vocab != vocab_.vocab())
    throw Error("the EAGLE drafter's vocabulary of " + std::to_string(cfg_.vocab) +
                " tokens differs from the target's " + std::to_string(vocab_.vocab()) +
                ": train one for this target");
  if (batch != nullptr) {
    if (!same_shape(batch->config(), cfg_))
      throw Error(
          "the EAGLE drafter's shape differs from its batch's: make the batch from the drafter's config");
    if (batch->rows_.n_ctx < n_ctx_)
      throw Error("the EAGLE drafter's context of " + std::to_string(n_ctx_) +
                  " positions is longer than its batch's (" + std::to_string(batch->rows_.n_ctx) +
                  "): make the batch with the sources' context");
    if (batch->rows_.n_threads < pool.size())
      throw Error(
          "the EAGLE drafter's batch was made for fewer threads than the drafter's pool: make it with "
          "the sources' pool");
  }
  batch_ = batch;
  const std::vector<train::Param*> params = drafter_->params();
  fc_ = find(params, "fc.weight");
  emb_norm_ = find(params, "blk.0.emb_norm.weight");
  hidden_norm_ = find(params, "blk.0.hidden_norm.weight");
  wq_ = find(params, "blk.0.attn_q.weight");
  wk_ = find(params, "blk.0.attn_k.weight");
  wv_ = find(params, "blk.0.attn_v.weight");
  wo_ = find(params, "blk.0.attn_output.weight");
  ffn_norm_ = find(params, "blk.0.ffn_norm.weight");
  w_gate_ = find(params, "blk.0.ffn_gate.weight");
  w_up_ = find(params, "blk.0.ffn_up.weight");
  w_down_ = find(params, "blk.0.ffn_down.weight");
  out_norm_ = find(params, "output_norm.weight");
  if (cfg_.train_head) {
    const train::Param& own = *find(params, "output.weight");
    TANDEM_CHECK(own.size() == cfg_.head_rows() * cfg_.d && !own.value.empty(),
                 "the EAGLE drafter's own head holds its values");
    head_.type = DType::F32;
    head_.rows = own.rows;
    head_.cols = own.cols;
    head_.row_bytes = static_cast<size_t>(own.cols) * sizeof(float);
    head_.data = reinterpret_cast<const uint8_t*>(own.value.data());
  } else {
    head_ = vocab_.head();
  }
  for (int64_t l = 1; l < cfg_.n_layer; ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const auto weight = [&](const char* what) { return find(params, (blk + what + ".weight").c_str()); };
    plain_.push_back({weight("attn_norm"), weight("attn_q"), weight("attn_k"), weight("attn_v"),
                      weight("attn_output"), weight("ffn_norm"), weight("ffn_gate"), weight("ffn_up"),
                      weight("ffn_down"), std::vector<float>(static_cast<size_t>(n_ctx_ * kv_width_), 0.0f),
                      std::vector<float>(static_cast<size_t>(n_ctx_ * kv_width_), 0.0f)});
  }

  const int64_t d = cfg_.d;
  const auto sized = [](int64_t rows, int64_t width) {
    return std::vector<float>(static_cast<size_t>(rows * width), 0.0f);
  };
  k_ = sized(n_ctx_, kv_width_);
  v_ = sized(n_ctx_, kv_width_);
  if (batch_ == nullptr) rows_ = Rows(cfg_, pool.size(), kChunk, 1, n_ctx_);
  g_last_ = sized(1, d);
  logits_ = sized(1, cfg_.vocab);
}

std::unique_ptr<EagleDraftSource> EagleDraftSource::load(const std::string& path, const model::Model& target,
                                                         const std::string& target_file_hash,
                                                         ThreadPool& pool, int64_t n_ctx,
                                                         EagleDraftBatch* batch) {
  // The metadata first (no parameters), to build a drafter of the recorded shape.
  train::DrafterInfo info = train::load_drafter(path, {});
  const train::EagleConfig cfg = eagle_config_of(info);
  check_eagle_target(info, target, target_file_hash);
  // No f32 copies of the target's embedding and head: the source reads the target's own.
  auto drafter = std::make_unique<train::EagleDrafter>(cfg, 1, /*target_weights=*/false);
  std::vector<train::Param*> params = drafter->params();
  info = train::load_drafter(path, params);
  return std::make_unique<EagleDraftSource>(std::move(drafter), info.tap_layers, pool, n_ctx, target, batch);
}

void EagleDraftSource::begin(std::span<const int32_t> /*prompt*/, const DraftSettings& settings) {
  begin_generation(settings, tree_branch);
  len_ = 0;
  real_len_ = 0;
}

void EagleDraftSource::forward(int64_t n, const float* given_g, const int32_t* next_ids, bool want_logits) {
  if (rows_.rows == 0) rows_ = Rows(cfg_, compute_.pool.size(), kChunk, 1, n_ctx_);  // batched, alone now
  const Segment one{.source = this,
                    .n = n,
                    .given_g = given_g,
                    .next_ids = next_ids,
                    .want_logits = want_logits,
                    .tree = nullptr};
  run(std::span<const Segment>(&one, 1), rows_);
}

void EagleDraftSource::run(std::span<const Segment> segments, Rows& w) {
  const int64_t d = cfg_.d, H = cfg_.n_head, Hkv = cfg_.n_kv_head, hd = cfg_.head_dim, F = cfg_.ffn;
  const int64_t tw = cfg_.n_taps * d, kvw = kv_width_;
  const float eps = cfg_.norm_eps;
  train::Compute& c = compute_;
  const auto bytes = [](int64_t floats) { return static_cast<size_t>(floats) * sizeof(float); };

  // Each row's position, next token and g: fc(taps) for the rows that read taps (gathered, one product over
  // all of them, then put in place), the given g for the others.
  int64_t n = 0, tap_rows = 0, n_logits = 0;
  for (size_t si = 0; si < segments.size(); ++si) {
    const Segment& s = segments[si];
    const EagleDraftSource& src = *s.source;
    TANDEM_CHECK(src.n_ctx_ <= w.n_ctx, "an EAGLE source's context is longer than its scratch's");
    TANDEM_CHECK(n + s.n <= w.rows, "an EAGLE drafter forward beyond its rows");
    TANDEM_CHECK(s.tree == nullptr || segments.size() == 1, "an EAGLE drafter's tree rows run alone");
    for (int64_t i = 0; i < s.n; ++i) {
      const auto r = static_cast<size_t>(n + i);
      w.ids[r] = s.next_ids[i];
      w.segment[r] = static_cast<int32_t>(si);
      if (s.tree != nullptr) {
        // A tree node: rotated at its path position, attending to the rows before the tree and its path.
        const int64_t node = src.len_ - s.tree->base + i;
        w.node[r] = static_cast<int32_t>(node);
        w.pos[r] = static_cast<int32_t>(s.tree->base + s.tree->depth[static_cast<size_t>(node)]);
        w.visible[r] = s.tree->base;
      } else {
        w.node[r] = -1;
        w.pos[r] = static_cast<int32_t>(src.len_ + i);
        w.visible[r] = src.len_ + i + 1;  // causal: the cache up to the row itself
      }
    }
    if (s.given_g != nullptr) {
      std::memcpy(w.g.data() + n * d, s.given_g, bytes(s.n * d));
    } else {
      std::memcpy(w.in.data() + tap_rows * tw, src.taps_.rows(src.len_, s.n).data(), bytes(s.n * tw));
      tap_rows += s.n;
    }
    n += s.n;
    n_logits += s.tree != nullptr ? s.n : s.want_logits ? 1 : 0;
  }
  TANDEM_CHECK(n >= 1 && n_logits <= w.logit_rows, "an EAGLE drafter forward beyond its rows");
  if (tap_rows > 0) {
    train::linear_forward(*fc_, nullptr, w.in.data(), tap_rows, w.h1.data(), c);
    int64_t r = 0, t = 0;
    for (const Segment& s : segments) {
      if (s.given_g == nullptr) {
        std::memcpy(w.g.data() + r * d, w.h1.data() + t * d, bytes(s.n * d));
        t += s.n;
      }
      r += s.n;
    }
  }
  for (int64_t r = 0; r < n; ++r) vocab_.embed(w.ids[static_cast<size_t>(r)], w.e.data() + r * d);
  train::rmsnorm_forward(*emb_norm_, eps, w.e.data(), n, w.ne.data(), w.inv.data(), c);
  train::rmsnorm_forward(*hidden_norm_, eps, w.g.data(), n, w.ng.data(), w.inv.data(), c);
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(w.u.data() + r * 2 * d, w.ne.data() + r * d, bytes(d));
    std::memcpy(w.u.data() + r * 2 * d + d, w.ng.data() + r * d, bytes(d));
  }
  const train::Rope rope{hd, cfg_.rope_theta, cfg_.rope_layout};
  // Keys and values of every row, roped, into each segment's own cache; then every row's attention over its
  // own segment's cache. layer < 0: the first layer's cache, else plain layer `layer`'s.
  const auto attention = [&](int64_t layer) {
    train::rope_forward(rope, w.q.data(), n, H, w.pos.data(), c);
    train::rope_forward(rope, w.k.data(), n, Hkv, w.pos.data(), c);
    int64_t r = 0;
    for (const Segment& s : segments) {
      EagleDraftSource& src = *s.source;
      std::vector<float>& kc = layer < 0 ? src.k_ : src.plain_[static_cast<size_t>(layer)].k;
      std::vector<float>& vc = layer < 0 ? src.v_ : src.plain_[static_cast<size_t>(layer)].v;
      std::memcpy(kc.data() + src.len_ * kvw, w.k.data() + r * kvw, bytes(s.n * kvw));
      std::memcpy(vc.data() + src.len_ * kvw, w.v.data() + r * kvw, bytes(s.n * kvw));
      r += s.n;
    }
    attend(segments, layer, n, w);
  };
  train::linear_forward(*wq_, nullptr, w.u.data(), n, w.q.data(), c);
  train::linear_forward(*wk_, nullptr, w.u.data(), n, w.k.data(), c);
  train::linear_forward(*wv_, nullptr, w.u.data(), n, w.v.data(), c);
  attention(-1);
  train::linear_forward(*wo_, nullptr, w.att.data(), n, w.h1.data(), c);
  train::add_into(w.h1.data(), w.g.data(), n * d, c);
  train::rmsnorm_forward(*ffn_norm_, eps, w.h1.data(), n, w.n2.data(), w.inv.data(), c);
  train::linear_forward(*w_gate_, nullptr, w.n2.data(), n, w.gate.data(), c);
  train::linear_forward(*w_up_, nullptr, w.n2.data(), n, w.up.data(), c);
  train::swiglu_forward(w.gate.data(), w.up.data(), n * F, w.act.data(), c);
  train::linear_forward(*w_down_, nullptr, w.act.data(), n, w.h2.data(), c);
  train::add_into(w.h2.data(), w.h1.data(), n * d, c);
  // The plain layers, in place on h2 (ne is free for their normalized input).
  for (size_t l = 0; l < plain_.size(); ++l) {
    const PlainLayer& p = plain_[l];
    train::rmsnorm_forward(*p.attn_norm, eps, w.h2.data(), n, w.ne.data(), w.inv.data(), c);
    train::linear_forward(*p.wq, nullptr, w.ne.data(), n, w.q.data(), c);
    train::linear_forward(*p.wk, nullptr, w.ne.data(), n, w.k.data(), c);
    train::linear_forward(*p.wv, nullptr, w.ne.data(), n, w.v.data(), c);
    attention(static_cast<int64_t>(l));
    train::linear_forward(*p.wo, nullptr, w.att.data(), n, w.h1.data(), c);
    train::add_into(w.h1.data(), w.h2.data(), n * d, c);
    train::rmsnorm_forward(*p.ffn_norm, eps, w.h1.data(), n, w.n2.data(), w.inv.data(), c);
    train::linear_forward(*p.w_gate, nullptr, w.n2.data(), n, w.gate.data(), c);
    train::linear_forward(*p.w_up, nullptr, w.n2.data(), n, w.up.data(), c);
    train::swiglu_forward(w.gate.data(), w.up.data(), n * F, w.act.data(), c);
    train::linear_forward(*p.w_down, nullptr, w.act.data(), n, w.h2.data(), c);
    train::add_into(w.h2.data(), w.h1.data(), n * d, c);
  }

  // Each segment's last row: its output hidden state, and (gathered into e) the rows that want logits.
  // A tree segment's rows: every output hidden state, at its node, and every row's logits.
  int64_t r = 0, j = 0;
  for (const Segment& s : segments) {
    EagleDraftSource& src = *s.source;
    if (s.tree != nullptr) {
      const int64_t first = src.len_ - s.tree->base;
      std::memcpy(src.tree_hidden_.data() + first * d, w.h2.data() + r * d, bytes(s.n * d));
      std::memcpy(w.e.data() + j * d, w.h2.data() + r * d, bytes(s.n * d));
      j += s.n;
    }
    src.len_ += s.n;
    r += s.n;
    const float* last = w.h2.data() + (r - 1) * d;
    std::copy(last, last + d, src.g_last_.begin());
    if (s.tree == nullptr && s.want_logits) std::memcpy(w.e.data() + j++ * d, last, bytes(d));
  }
  if (n_logits == 0) return;
  train::rmsnorm_forward(*out_norm_, eps, w.e.data(), n_logits, w.f.data(), w.inv.data(), c);
  kernels::matmul(head_, w.f.data(), n_logits, w.logits.data(), c.pool, w.mm);
  j = 0;
  const int64_t N = head_.rows;
  for (const Segment& s : segments)
    if (s.tree == nullptr && s.want_logits)
      vocab_.expand(w.logits.data() + j++ * N, s.source->logits_.data());
}

void EagleDraftSource::attend(std::span<const Segment> segments, int64_t layer, int64_t n, Rows& w) {
  const int64_t H = cfg_.n_head, hd = cfg_.head_dim, qw = H * hd, group = H / cfg_.n_kv_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  compute_.pool.parallel_for(n * H, 1, [&](int64_t i0, int64_t i1, int t) {
    float* scores = w.scores.data() + static_cast<int64_t>(t) * w.n_ctx;
    for (int64_t ih = i0; ih < i1; ++ih) {
      const int64_t i = ih / H, h = ih % H;
      const Segment& seg = segments[static_cast<size_t>(w.segment[static_cast<size_t>(i)])];
      const EagleDraftSource& src = *seg.source;
      const float* k_cache = layer < 0 ? src.k_.data() : src.plain_[static_cast<size_t>(layer)].k.data();
      const float* v_cache = layer < 0 ? src.v_.data() : src.plain_[static_cast<size_t>(layer)].v.data();
      // The cache rows the row attends to, in order: the first `visible`, then (a tree row) its path's.
      const int64_t visible = w.visible[static_cast<size_t>(i)];
      int64_t path[cache::kMaxTreeDepth];
      int64_t n_path = 0;
      if (const int32_t node = w.node[static_cast<size_t>(i)]; node >= 0) {
        const cache::TreeMask& m = *seg.tree;
        n_path = m.depth[static_cast<size_t>(node)] + 1;
        for (int32_t a = node; a >= 0; a = m.parent[static_cast<size_t>(a)])
          path[m.depth[static_cast<size_t>(a)]] = m.base + a;
      }
      const int64_t count = visible + n_path;
      const auto row_of = [&](int64_t j) { return j < visible ? j : path[j - visible]; };
      const float* qh = w.q.data() + i * qw + h * hd;
      const int64_t kvh = h / group;
      float top = -INFINITY;
      for (int64_t j = 0; j < count; ++j) {
        const float* kj = k_cache + row_of(j) * kv_width_ + kvh * hd;
        float s = 0.0f;
        for (int64_t x = 0; x < hd; ++x) s += qh[x] * kj[x];
        scores[j] = s * scale;
        top = std::max(top, s * scale);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < count; ++j) {
        float& s = scores[j];
        s = std::exp(s - top);
        sum += s;
      }
      float* out = w.att.data() + i * qw + h * hd;
      std::fill(out, out + hd, 0.0f);
      for (int64_t j = 0; j < count; ++j) {
        const float wt = scores[j] / sum;
        const float* vj = v_cache + row_of(j) * kv_width_ + kvh * hd;
        for (int64_t x = 0; x < hd; ++x) out[x] += wt * vj[x];
      }
    }
  });
}

void EagleDraftSource::draw(int64_t position, size_t i, Draft& out) {
  sampling::Distribution& q = out.q_slot(i);
  sampler_.distribution(logits_, history_, q);
  const int32_t x = sampler_.draw(q, sequence_, static_cast<uint64_t>(position), kDrawDraft);
  out.tokens.push_back(x);
  out.sampled = sampler_.params().temperature > 0.0f;
  history_.push_back(x);
}

void EagleDraftSource::propose(std::span<const int32_t> committed, int max_depth, Draft& out) {
  out.clear();
  const auto n = static_cast<int64_t>(committed.size());
  // Real rows reach position n - 2 (the target has evaluated every committed token but the last); the draft
  // rows that follow take positions n - 1 .. n + depth - 3.
  const int64_t depth = std::min<int64_t>(max_depth, n_ctx_ - n + 2);
  if (n < 2 || depth < 1) return;
  catch_up(committed);
  history_.assign(committed.begin(), committed.end());
  for (int64_t i = 0; i < depth; ++i) {
    draw(n + i, static_cast<size_t>(i), out);
    if (i + 1 < depth) forward(1, g_last_.data(), &out.tokens.back(), true);
  }
}

void EagleDraftSource::catch_up(std::span<const int32_t> committed) {
  const auto n = static_cast<int64_t>(committed.size());
  // The last real row runs in this call (not kept from an earlier one), so that its logits and output
  // hidden state are at hand.
  real_len_ = len_ = std::min(real_len_, n - 2);
  while (real_len_ < n - 1) {
    const int64_t rows = std::min(kChunk, n - 1 - real_len_);
    forward(rows, nullptr, committed.data() + real_len_ + 1, real_len_ + rows == n - 1);
    real_len_ += rows;
  }
}

void EagleDraftSource::propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth,
                                    Draft& out) {
  out.clear();
  const auto n = static_cast<int64_t>(committed.size());
  if (n < 2 || max_nodes < 1 || max_depth < 1 || n - 1 > n_ctx_) return;
  catch_up(committed);
  // The tree's rows follow the real rows: node i at cache row base + i, rotated at base + its depth.
  const int64_t base = len_, d = cfg_.d;
  const int expand = std::clamp(tree_expand, 1, static_cast<int>(kChunk));
  if (rows_.rows == 0 || rows_.logit_rows < expand)
    rows_ = Rows(cfg_, compute_.pool.size(), kChunk, expand, n_ctx_);
  tree_g_.resize(static_cast<size_t>(expand * d));
  tree_ids_.resize(static_cast<size_t>(expand));
  tree_.clear(base);
  history_.assign(committed.begin(), committed.end());
  tree_.add_children(-1, logits_, history_, tree_cover);
  tree_root_.assign(g_last_.begin(), g_last_.end());  // the last real row's output, read by the first level
  const int32_t deepest = std::min<int32_t>(max_depth, static_cast<int32_t>(cache::kMaxTreeDepth));
  for (int32_t level = 1; level < deepest; ++level) {
    const std::span<const int32_t> picked = tree_.expand(level, max_nodes, expand, n_ctx_ - base);
    if (picked.empty()) break;
    const int64_t rows = static_cast<int64_t>(picked.size());
    if (tree_hidden_.size() < static_cast<size_t>(tree_.slots() * d))
      tree_hidden_.resize(static_cast<size_t>(tree_.slots() * d));
    for (int64_t r = 0; r < rows; ++r) {
      const DynamicTree::Candidate& c = tree_.candidate(picked[static_cast<size_t>(r)]);
      const float* g =
          c.parent < 0 ? tree_root_.data() : tree_hidden_.data() + tree_.candidate(c.parent).slot * d;
      std::memcpy(tree_g_.data() + r * d, g, static_cast<size_t>(d) * sizeof(float));
      tree_ids_[static_cast<size_t>(r)] = c.token;
    }
    const cache::TreeMask mask = tree_.mask();
    const Segment seg{.source = this,
                      .n = rows,
                      .given_g = tree_g_.data(),
                      .next_ids = tree_ids_.data(),
                      .want_logits = true,
                      .tree = &mask};
    run(std::span<const Segment>(&seg, 1), rows_);
    const int64_t N = head_.rows;  // the draft vocabulary
    for (size_t r = 0; r < picked.size(); ++r) {
      vocab_.expand(rows_.logits.data() + static_cast<int64_t>(r) * N, logits_.data());
      tree_.path_text(picked[r], committed, history_);
      tree_.add_children(picked[r], logits_, history_, tree_cover);
    }
  }
  tree_.propose(max_nodes, out);
}

void EagleDraftSource::propose_batch(std::span<const DraftRequest> requests) {
  TANDEM_CHECK(batch_ != nullptr, "an EAGLE drafter proposes in batches only with an EagleDraftBatch");
  EagleDraftBatch& b = *batch_;
  auto& members = b.members_;
  auto& segments = b.segments_;
  members.clear();
  for (const DraftRequest& r : requests) {
    auto& src = static_cast<EagleDraftSource&>(*r.source);
    TANDEM_CHECK(src.batch_ == batch_, "the sources of a batched proposal share their batch");
    TANDEM_CHECK(members.size() < members.capacity(), "more sequences propose together than the batch holds");
    r.out->clear();
    const auto n = static_cast<int64_t>(r.committed.size());
    const int64_t depth = std::min<int64_t>(r.max_depth, src.n_ctx_ - n + 2);
    if (n < 2 || depth < 1) continue;
    src.real_len_ = src.len_ = std::min(src.real_len_, n - 2);
    src.history_.assign(r.committed.begin(), r.committed.end());
    members.push_back({&src, r.committed, depth, r.out});
  }
  ++b.proposals_;
  b.widest_ = std::max(b.widest_, static_cast<int64_t>(members.size()));
  // The real rows each member lacks, up to its last committed position the target has evaluated (n - 2), in
  // forwards shared across members; each member's last real row gives its first draft's logits.
  const int64_t max_rows = b.rows_.rows;
  for (;;) {
    segments.clear();
    int64_t rows = 0;
    for (EagleDraftBatch::Member& m : members) {
      EagleDraftSource& src = *m.source;
      const int64_t last = static_cast<int64_t>(m.committed.size()) - 1;
      if (src.real_len_ >= last || rows >= max_rows) continue;
      const int64_t chunk = std::min(last - src.real_len_, max_rows - rows);
      segments.push_back({.source = &src,
                          .n = chunk,
                          .given_g = nullptr,
                          .next_ids = m.committed.data() + src.real_len_ + 1,
                          .want_logits = src.real_len_ + chunk == last,
                          .tree = nullptr});
      rows += chunk;
    }
    if (segments.empty()) break;
    run(segments, b.rows_);
    for (const Segment& s : segments) s.source->real_len_ += s.n;
  }
  // Then each drafting step: a draft from every member's logits, and one row per member still drafting.
  for (int64_t step = 0; !members.empty(); ++step) {
    for (EagleDraftBatch::Member& m : members)
      m.source->draw(static_cast<int64_t>(m.committed.size()) + step, static_cast<size_t>(step), *m.out);
    std::erase_if(members, [&](const EagleDraftBatch::Member& m) { return step + 1 >= m.depth; });
    if (members.empty()) break;
    segments.clear();
    for (EagleDraftBatch::Member& m : members)
      segments.push_back({.source = m.source,
                          .n = 1,
                          .given_g = m.source->g_last_.data(),
                          .next_ids = &m.out->tokens.back(),
                          .want_logits = true,
                          .tree = nullptr});
    run(segments, b.rows_);
  }
}

void EagleDraftSource::accept(std::span<const int32_t> committed, int /*n_accepted*/) {
  len_ = real_len_;
  // The target has evaluated every committed token but the last; taps past it were of rejected drafts.
  taps_.truncate(static_cast<int64_t>(committed.size()) - 1);
}

std::string eagle_cost_key(const std::string& drafter_path) {
  return std::string(kEagleKind) + ":" + file_fingerprint(drafter_path);
}

double measure_eagle_draft_cost(EagleDraftSource& source, double decode_seconds, int64_t context, int depth,
                                int rounds) {
  return measure_drafting_cost(source, "EAGLE", source.n_ctx(), source.drafter().config().vocab,
                               decode_seconds, context, depth, rounds);
}

}  // namespace tandem::speculative
