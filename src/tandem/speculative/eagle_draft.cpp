#include "tandem/speculative/eagle_draft.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "tandem/speculative/calibration.h"
#include "tandem/speculative/drafter_shape.h"

#include "tandem/tensor/quant.h"
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

void copy_target_matrix(const model::Model& target, const char* name, train::Param& dst) {
  const gguf::TensorInfo* t = target.file().tensor(name);
  if (t == nullptr) t = target.file().tensor("token_embd.weight");  // a tied head
  if (t == nullptr || t->ne[0] != dst.cols || t->ne[1] != dst.rows)
    throw Error(std::string("the target has no ") + name + " of shape [" + std::to_string(dst.rows) + ", " +
                std::to_string(dst.cols) + "] for the drafter to share");
  const size_t row_bytes = t->bytes / static_cast<size_t>(t->ne[1]);
  for (int64_t r = 0; r < dst.rows; ++r)
    dequantize_row(t->type, t->data + static_cast<size_t>(r) * row_bytes, dst.value.data() + r * dst.cols,
                   dst.cols);
}

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
  copy_target_matrix(target, "token_embd.weight", drafter.embedding());
  if (!drafter.config().train_head) copy_target_matrix(target, "output.weight", drafter.head());
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

EagleDraftSource::EagleDraftSource(std::unique_ptr<train::EagleDrafter> drafter, std::vector<int32_t> taps,
                                   ThreadPool& pool, int64_t n_ctx)
    : drafter_(std::move(drafter)),
      cfg_(drafter_->config()),
      compute_(pool),
      n_ctx_(n_ctx),
      kv_width_(cfg_.n_kv_head * cfg_.head_dim),
      taps_(std::move(taps), cfg_.n_taps, cfg_.d, n_ctx, "EAGLE") {
  const std::vector<train::Param*> params = drafter_->params();
  fc_ = find(params, "fc.weight");
  emb_ = find(params, "token_embd.weight");
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
  head_ = find(params, "output.weight");
  for (int64_t l = 1; l < cfg_.n_layer; ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const auto weight = [&](const char* what) { return find(params, (blk + what + ".weight").c_str()); };
    plain_.push_back({weight("attn_norm"), weight("attn_q"), weight("attn_k"), weight("attn_v"),
                      weight("attn_output"), weight("ffn_norm"), weight("ffn_gate"), weight("ffn_up"),
                      weight("ffn_down"), std::vector<float>(static_cast<size_t>(n_ctx_ * kv_width_), 0.0f),
                      std::vector<float>(static_cast<size_t>(n_ctx_ * kv_width_), 0.0f)});
  }

  const int64_t d = cfg_.d, qw = cfg_.n_head * cfg_.head_dim;
  const auto sized = [](int64_t rows, int64_t width) {
    return std::vector<float>(static_cast<size_t>(rows * width), 0.0f);
  };
  k_ = sized(n_ctx_, kv_width_);
  v_ = sized(n_ctx_, kv_width_);
  pos_.assign(static_cast<size_t>(kChunk), 0);
  for (auto* b : {&g_, &e_, &ne_, &ng_, &h1_, &n2_, &h2_, &f_}) *b = sized(kChunk, d);
  u_ = sized(kChunk, 2 * d);
  q_ = sized(kChunk, qw);
  att_ = sized(kChunk, qw);
  for (auto* b : {&gate_, &up_, &act_}) *b = sized(kChunk, cfg_.ffn);
  inv_ = sized(kChunk, 1);
  scores_ = sized(n_ctx_, 1);
  g_last_ = sized(1, d);
  logits_ = sized(1, cfg_.vocab);
}

std::unique_ptr<EagleDraftSource> EagleDraftSource::load(const std::string& path, const model::Model& target,
                                                         const std::string& target_file_hash,
                                                         ThreadPool& pool, int64_t n_ctx) {
  // The metadata first (no parameters), to build a drafter of the recorded shape.
  train::DrafterInfo info = train::load_drafter(path, {});
  const train::EagleConfig cfg = eagle_config_of(info);
  check_eagle_target(info, target, target_file_hash);
  auto drafter = std::make_unique<train::EagleDrafter>(cfg, 1);
  std::vector<train::Param*> params = drafter->params();
  info = train::load_drafter(path, params);
  copy_target_weights(target, *drafter);
  return std::make_unique<EagleDraftSource>(std::move(drafter), info.tap_layers, pool, n_ctx);
}

void EagleDraftSource::begin(std::span<const int32_t> /*prompt*/, const DraftSettings& settings) {
  sampler_ = sampling::Sampler(settings.sampling);
  sequence_ = settings.sequence_id;
  len_ = 0;
  real_len_ = 0;
  taps_.truncate(0);
}

void EagleDraftSource::on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                                        int64_t first_pos) {
  taps_.capture(layer, hidden, n_rows, first_pos);
}

void EagleDraftSource::set_taps(int64_t first_pos, std::span<const float> rows) {
  taps_.set(first_pos, rows);
}

void EagleDraftSource::forward(int64_t n, const float* given_g, const int32_t* next_ids, bool want_logits) {
  const int64_t d = cfg_.d, H = cfg_.n_head, Hkv = cfg_.n_kv_head, hd = cfg_.head_dim, F = cfg_.ffn;
  const float eps = cfg_.norm_eps;
  train::Compute& c = compute_;
  for (int64_t i = 0; i < n; ++i) pos_[static_cast<size_t>(i)] = static_cast<int32_t>(len_ + i);

  if (given_g != nullptr)
    std::memcpy(g_.data(), given_g, static_cast<size_t>(n * d) * sizeof(float));
  else
    train::linear_forward(*fc_, nullptr, taps_.rows(len_, n).data(), n, g_.data(), c);
  train::embedding_forward(*emb_, next_ids, n, e_.data());
  train::rmsnorm_forward(*emb_norm_, eps, e_.data(), n, ne_.data(), inv_.data(), c);
  train::rmsnorm_forward(*hidden_norm_, eps, g_.data(), n, ng_.data(), inv_.data(), c);
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(u_.data() + r * 2 * d, ne_.data() + r * d, static_cast<size_t>(d) * sizeof(float));
    std::memcpy(u_.data() + r * 2 * d + d, ng_.data() + r * d, static_cast<size_t>(d) * sizeof(float));
  }
  float* k = k_.data() + len_ * kv_width_;
  float* v = v_.data() + len_ * kv_width_;
  train::linear_forward(*wq_, nullptr, u_.data(), n, q_.data(), c);
  train::linear_forward(*wk_, nullptr, u_.data(), n, k, c);
  train::linear_forward(*wv_, nullptr, u_.data(), n, v, c);
  const train::Rope rope{hd, cfg_.rope_theta, cfg_.rope_layout};
  train::rope_forward(rope, q_.data(), n, H, pos_.data(), c);
  train::rope_forward(rope, k, n, Hkv, pos_.data(), c);

  attend(q_.data(), k_.data(), v_.data(), n);
  train::linear_forward(*wo_, nullptr, att_.data(), n, h1_.data(), c);
  train::add_into(h1_.data(), g_.data(), n * d, c);
  train::rmsnorm_forward(*ffn_norm_, eps, h1_.data(), n, n2_.data(), inv_.data(), c);
  train::linear_forward(*w_gate_, nullptr, n2_.data(), n, gate_.data(), c);
  train::linear_forward(*w_up_, nullptr, n2_.data(), n, up_.data(), c);
  train::swiglu_forward(gate_.data(), up_.data(), n * F, act_.data(), c);
  train::linear_forward(*w_down_, nullptr, act_.data(), n, h2_.data(), c);
  train::add_into(h2_.data(), h1_.data(), n * d, c);
  // The plain layers, in place on h2_ (ne_ is free for their normalized input).
  for (PlainLayer& l : plain_) {
    float* lk = l.k.data() + len_ * kv_width_;
    float* lv = l.v.data() + len_ * kv_width_;
    train::rmsnorm_forward(*l.attn_norm, eps, h2_.data(), n, ne_.data(), inv_.data(), c);
    train::linear_forward(*l.wq, nullptr, ne_.data(), n, q_.data(), c);
    train::linear_forward(*l.wk, nullptr, ne_.data(), n, lk, c);
    train::linear_forward(*l.wv, nullptr, ne_.data(), n, lv, c);
    train::rope_forward(rope, q_.data(), n, H, pos_.data(), c);
    train::rope_forward(rope, lk, n, Hkv, pos_.data(), c);
    attend(q_.data(), l.k.data(), l.v.data(), n);
    train::linear_forward(*l.wo, nullptr, att_.data(), n, h1_.data(), c);
    train::add_into(h1_.data(), h2_.data(), n * d, c);
    train::rmsnorm_forward(*l.ffn_norm, eps, h1_.data(), n, n2_.data(), inv_.data(), c);
    train::linear_forward(*l.w_gate, nullptr, n2_.data(), n, gate_.data(), c);
    train::linear_forward(*l.w_up, nullptr, n2_.data(), n, up_.data(), c);
    train::swiglu_forward(gate_.data(), up_.data(), n * F, act_.data(), c);
    train::linear_forward(*l.w_down, nullptr, act_.data(), n, h2_.data(), c);
    train::add_into(h2_.data(), h1_.data(), n * d, c);
  }
  len_ += n;

  const float* last = h2_.data() + (n - 1) * d;
  std::copy(last, last + d, g_last_.begin());
  if (!want_logits) return;
  train::rmsnorm_forward(*out_norm_, eps, last, 1, f_.data(), inv_.data(), c);
  train::linear_forward(*head_, nullptr, f_.data(), 1, logits_.data(), c);
}

void EagleDraftSource::attend(const float* q, const float* k_cache, const float* v_cache, int64_t n) {
  const int64_t H = cfg_.n_head, hd = cfg_.head_dim, qw = H * hd, group = H / cfg_.n_kv_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t visible = len_ + i + 1;
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q + i * qw + h * hd;
      const int64_t kvh = h / group;
      float top = -INFINITY;
      for (int64_t j = 0; j < visible; ++j) {
        const float* kj = k_cache + j * kv_width_ + kvh * hd;
        float s = 0.0f;
        for (int64_t x = 0; x < hd; ++x) s += qh[x] * kj[x];
        scores_[static_cast<size_t>(j)] = s * scale;
        top = std::max(top, s * scale);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < visible; ++j) {
        float& s = scores_[static_cast<size_t>(j)];
        s = std::exp(s - top);
        sum += s;
      }
      float* out = att_.data() + i * qw + h * hd;
      std::fill(out, out + hd, 0.0f);
      for (int64_t j = 0; j < visible; ++j) {
        const float w = scores_[static_cast<size_t>(j)] / sum;
        const float* vj = v_cache + j * kv_width_ + kvh * hd;
        for (int64_t x = 0; x < hd; ++x) out[x] += w * vj[x];
      }
    }
  }
}

void EagleDraftSource::propose(std::span<const int32_t> committed, int max_depth, Draft& out) {
  out.clear();
  const auto n = static_cast<int64_t>(committed.size());
  // Real rows reach position n - 2 (the target has evaluated every committed token but the last); the draft
  // rows that follow take positions n - 1 .. n + depth - 3.
  const int64_t depth = std::min<int64_t>(max_depth, n_ctx_ - n + 2);
  if (n < 2 || depth < 1) return;
  // The last real row runs in this call (not kept from an earlier one), so that its logits and output
  // hidden state are at hand.
  real_len_ = len_ = std::min(real_len_, n - 2);
  while (real_len_ < n - 1) {
    const int64_t rows = std::min(kChunk, n - 1 - real_len_);
    forward(rows, nullptr, committed.data() + real_len_ + 1, real_len_ + rows == n - 1);
    real_len_ += rows;
  }

  history_.assign(committed.begin(), committed.end());
  const bool sampled = sampler_.params().temperature > 0.0f;
  for (int64_t i = 0; i < depth; ++i) {
    sampling::Distribution& q = out.q_slot(static_cast<size_t>(i));
    sampler_.distribution(logits_, history_, q);
    const int32_t x = sampler_.draw(q, sequence_, static_cast<uint64_t>(n + i), kDrawDraft);
    out.tokens.push_back(x);
    history_.push_back(x);
    if (i + 1 < depth) forward(1, g_last_.data(), &x, true);
  }
  out.sampled = sampled;
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
  if (!(decode_seconds > 0) || context < 2 || depth < 1 || rounds < 1)
    throw Error("measuring the EAGLE drafter's cost needs a positive decode time, context and depth");
  const int64_t n = std::min<int64_t>(context, source.n_ctx() - depth);
  std::vector<int32_t> committed(static_cast<size_t>(std::max<int64_t>(n, 2)));
  const int64_t vocab = source.drafter().config().vocab;
  for (size_t i = 0; i < committed.size(); ++i) committed[i] = static_cast<int32_t>((7 * i + 1) % vocab);
  DraftSettings settings;
  settings.sampling.temperature = 0.0f;
  source.begin(committed, settings);
  Draft draft;
  source.propose(committed, depth, draft);  // the real rows, once, as the target's prompt would
  source.accept(committed, 0);
  std::vector<double> seconds;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    source.propose(committed, depth, draft);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    source.accept(committed, 0);
  }
  std::nth_element(seconds.begin(), seconds.begin() + rounds / 2, seconds.end());
  source.begin({}, settings);
  return seconds[static_cast<size_t>(rounds / 2)] / depth / decode_seconds;
}

}  // namespace tandem::speculative
