#include "tandem/model/forward.h"

#include <algorithm>
#include <cmath>

#include "tandem/cache/attention.h"
#include "tandem/kernels/ops.h"
#include "tandem/tensor/quant.h"
#include "tandem/util/error.h"

namespace tandem::model {

Forward::Forward(const Model& model, ThreadPool& pool, int64_t max_rows)
    : model_(model), pool_(pool), max_rows_(max_rows) {
  const Config& c = model.config();
  TANDEM_CHECK(max_rows > 0, "max_rows must be positive");
  if (c.encoder)
    throw Error("model '" + c.arch + "' is an encoder: it computes embeddings (tandem embed), not text");
  const int64_t widest =
      std::max({c.n_embd, c.n_ff, c.n_head * c.head_dim_v, c.moe.n_ff_expert, c.moe.n_ff_shared,
                c.ssm_d_inner, c.mla.q_lora_rank, c.mla.kv_lora_rank, c.n_mtp > 0 ? 2 * c.n_embd : 0});
  scratch_ = kernels::MatmulScratch(pool.size(), widest, max_rows);
  inv_freq_.resize(static_cast<size_t>(c.n_rot / 2));
  for (int64_t i = 0; i < c.n_rot / 2; ++i) {
    double f = std::pow(static_cast<double>(c.rope_base),
                        -2.0 * static_cast<double>(i) / static_cast<double>(c.n_rot));
    if (!c.rope_freq_factors.empty()) f /= c.rope_freq_factors[static_cast<size_t>(i)];
    inv_freq_[static_cast<size_t>(i)] = static_cast<float>(f * c.rope_linear_scale);
  }
  auto alloc = [&](std::vector<float>& v, int64_t width) {
    v.assign(static_cast<size_t>(max_rows * width), 0.0f);
  };
  alloc(x_, c.n_embd);
  alloc(xb_, c.n_embd);
  alloc(q_, c.q_dim());
  alloc(k_, c.kv_dim());
  alloc(v_, c.v_dim());
  alloc(att_, c.n_head * c.head_dim_v);
  alloc(ffn_gate_, c.n_ff);
  alloc(ffn_up_, c.n_ff);
  alloc(rope_cs_, std::max<int64_t>(c.n_rot, 2));
  if (c.n_mtp > 0) alloc(mtp_in_, 2 * c.n_embd);
  runs_.reserve(static_cast<size_t>(max_rows));
  if (c.moe.n_expert > 0) moe_ = MoeFfn(c, max_rows);
  if (c.mla.kv_lora_rank > 0) {
    mla_ = MlaProjection(c, max_rows);
    alloc(latent_q_, c.n_head * mla_.key_width());
    alloc(latent_k_, mla_.key_width());
    alloc(latent_att_, c.n_head * c.mla.kv_lora_rank);
  }
  if (!c.layer_recurrent.empty()) ssm_ = std::make_unique<SsmMixer>(c, max_rows);
}

void Forward::run(std::span<const Row> rows, std::span<cache::KvCache* const> caches, float* logits,
                  const CaptureFn* capture, std::span<const TreeRows> trees) {
  run_timed(rows, caches, logits, capture, trees, nullptr, nullptr);
}

void Forward::run_mtp(int64_t k, std::span<const Row> rows, const float* hidden,
                      std::span<cache::KvCache* const> caches, float* logits, const CaptureFn* capture) {
  const Config& c = model_.config();
  if (k < 0 || k >= c.n_mtp)
    throw Error("model '" + c.arch + "' has " + std::to_string(c.n_mtp) +
                " next-token-prediction (MTP) layers; layer " + std::to_string(k) + " does not exist");
  TANDEM_CHECK(hidden != nullptr, "an MTP step needs the previous hidden states");
  run_timed(rows, caches, logits, capture, {}, &model_.weights().mtp[static_cast<size_t>(k)], hidden);
}

void Forward::run_timed(std::span<const Row> rows, std::span<cache::KvCache* const> caches, float* logits,
                        const CaptureFn* capture, std::span<const TreeRows> trees, const MtpWeights* mtp,
                        const float* mtp_hidden) {
  // A forward of one or two rows (a decode step, a short verify window) takes the kernels' prefetch reach
  // from the tuner of its width and reports its time back (kernels/prefetch_tuner.h).
  const auto width = static_cast<int64_t>(rows.size());
  kernels::PrefetchTuner* tuner = width >= 1 && width <= kTunedWidths ? &reach_tuners_[width - 1] : nullptr;
  scratch_.set_prefetch_reach(tuner != nullptr ? tuner->begin() : kernels::PrefetchReach::kNear);
  const auto t0 = std::chrono::steady_clock::now();
  run_untimed(rows, caches, logits, capture, trees, mtp, mtp_hidden);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (tuner != nullptr) tuner->end(seconds);
  if (times_ != nullptr) {
    times_->total_s += seconds;
    ++times_->forwards;
  }
}

void Forward::mtp_input(const MtpWeights& m, std::span<const Row> rows, const float* hidden) {
  const Config& c = model_.config();
  const Weights& w = model_.weights();
  const MatrixView& embed = m.embed.empty() ? w.tok_embd : m.embed;
  const auto R = static_cast<int64_t>(rows.size());
  for_rows(R, [&](int64_t r) {
    float* u = mtp_in_.data() + r * 2 * c.n_embd;
    float* e = xb_.data() + r * c.n_embd;
    dequantize_row(embed.type, embed.row(rows[static_cast<size_t>(r)].token), e, c.n_embd);
    if (c.embed_scale != 1.0f)
      for (int64_t i = 0; i < c.n_embd; ++i) e[i] *= c.embed_scale;
    kernels::rms_norm(e, m.enorm.data, u, c.n_embd, c.norm_eps);
    kernels::rms_norm(hidden + r * c.n_embd, m.hnorm.data, u + c.n_embd, c.n_embd, c.norm_eps);
  });
  timed(&PhaseTimes::matmul_s,
        [&] { kernels::matmul(m.eh_proj, mtp_in_.data(), R, x_.data(), pool_, scratch_); });
}

void Forward::run_untimed(std::span<const Row> rows, std::span<cache::KvCache* const> caches, float* logits,
                          const CaptureFn* capture, std::span<const TreeRows> trees, const MtpWeights* mtp,
                          const float* mtp_hidden) {
  const Config& c = model_.config();
  const Weights& w = model_.weights();
  const int64_t R = static_cast<int64_t>(rows.size());
  if (R == 0) return;
  if (R > max_rows_) throw Error("batch of " + std::to_string(R) + " rows exceeds the forward's capacity");
  // An MTP layer reads the model's own experts: residency follows the main layers' routing.
  ExpertResidency* residency = mtp ? nullptr : residency_;
  if (residency) residency->rebalance_if_due();

  // Validate every row before touching any cache: positions continue each sequence without gaps.
  if (lengths_.size() < caches.size()) lengths_.resize(caches.size());
  for (size_t s = 0; s < caches.size(); ++s) lengths_[s] = caches[s] ? caches[s]->length() : 0;
  int64_t max_pos = 0;
  for (const Row& row : rows) {
    if (row.token < 0 || row.token >= c.n_vocab)
      throw Error("token id " + std::to_string(row.token) + " is outside the vocabulary (0.." +
                  std::to_string(c.n_vocab - 1) + ")");
    if (row.seq < 0 || static_cast<size_t>(row.seq) >= caches.size() ||
        caches[static_cast<size_t>(row.seq)] == nullptr)
      throw Error("row refers to sequence " + std::to_string(row.seq) + ", which has no cache");
    const cache::KvCache& kv = *caches[static_cast<size_t>(row.seq)];
    int64_t& len = lengths_[static_cast<size_t>(row.seq)];
    if (row.pos < 0 || row.pos > len)
      throw Error("row position " + std::to_string(row.pos) + " skips past the cache length " +
                  std::to_string(len));
    if (row.pos >= kv.capacity())
      throw Error("position " + std::to_string(row.pos) + " exceeds the context size " +
                  std::to_string(kv.capacity()) + "; use a larger -c");
    len = row.pos + 1;
    max_pos = std::max(max_pos, row.pos);
  }
  index_trees(rows, caches, trees);
  if (ssm_) ssm_->check_rows(rows, caches);
  // Each touched cache makes [its lowest row position, its new length) writable.
  firsts_.assign(caches.size(), INT64_MAX);
  for (const Row& row : rows)
    firsts_[static_cast<size_t>(row.seq)] = std::min(firsts_[static_cast<size_t>(row.seq)], row.pos);
  for (size_t s = 0; s < caches.size(); ++s)
    if (firsts_[s] != INT64_MAX) caches[s]->prepare_append(firsts_[s], lengths_[s]);
  const size_t need_scores = static_cast<size_t>(max_pos + 1);
  if (static_cast<int64_t>(need_scores) > scores_stride_ && c.n_head_kv > 0) {
    // Grows only when a longer context is first used; steady-state decoding does not allocate.
    scores_stride_ = static_cast<int64_t>(std::max(need_scores, size_t{256}));
    const int64_t heads =
        std::min(c.n_head / model_.config().kv_geometry().n_head_kv, cache::kMaxWindowQueries);
    window_queries_ = std::clamp(kScoresBudget / scores_stride_, heads, cache::kMaxWindowQueries);
    scores_.assign(static_cast<size_t>(scores_stride_ * window_queries_ * pool_.size()), 0.0f);
  }

  // Embeddings (an MTP layer's input: the projected next-token embeddings and previous hidden states).
  if (mtp) {
    mtp_input(*mtp, rows, mtp_hidden);
  } else {
    for (int64_t r = 0; r < R; ++r) {
      float* x = x_.data() + r * c.n_embd;
      dequantize_row(w.tok_embd.type, w.tok_embd.row(rows[static_cast<size_t>(r)].token), x, c.n_embd);
      if (c.embed_scale != 1.0f)
        for (int64_t i = 0; i < c.n_embd; ++i) x[i] *= c.embed_scale;
    }
  }

  // Rotary angles once per row (every layer and head uses them).
  for (int64_t r = 0; r < R; ++r) {
    kernels::rope_angles(c.n_rot, inv_freq_.data(), path_pos(rows[static_cast<size_t>(r)]),
                         rope_cs_.data() + r * c.n_rot);
  }

  // An MTP layer is one block, layer 0 of its own cache.
  const int64_t n_layers = mtp ? 1 : c.n_layer;
  for (int64_t il = 0; il < n_layers; ++il) {
    const LayerWeights& l = mtp ? mtp->block : w.layers[static_cast<size_t>(il)];
    for_rows(R, [&](int64_t r) {
      kernels::rms_norm(x_.data() + r * c.n_embd, l.attn_norm.data, xb_.data() + r * c.n_embd, c.n_embd,
                        c.norm_eps);
    });
    if (c.recurrent(il)) {
      timed(&PhaseTimes::matmul_s,
            [&] { ssm_->run(l, il, rows, caches, xb_.data(), x_.data(), pool_, scratch_); });
      // Mamba's layers end with the mixer; a hybrid's (jamba) go on to the FFN.
      if (!l.ffn_norm.empty()) {
        for_rows(R, [&](int64_t r) {
          kernels::rms_norm(x_.data() + r * c.n_embd, l.ffn_norm.data, xb_.data() + r * c.n_embd, c.n_embd,
                            c.norm_eps);
        });
        ffn_residual(l, R, il, residency);
      }
      if (capture) (*capture)(il, x_.data(), R);
      continue;
    }
    if (!l.mla.empty()) {
      timed(&PhaseTimes::matmul_s, [&] {
        mla_.project(l.mla, xb_.data(), R, rope_cs_.data(), latent_q_.data(), latent_k_.data(), pool_,
                     scratch_);
      });
      for (int64_t r = 0; r < R; ++r)
        caches[static_cast<size_t>(rows[static_cast<size_t>(r)].seq)]->store(
            il, rows[static_cast<size_t>(r)].pos, latent_k_.data() + r * mla_.key_width(), nullptr);
    } else {
      project_qkv(l, rows, caches, il);
    }
    timed(&PhaseTimes::attention_s, [&] { attention(rows, caches, il); });
    if (!l.mla.empty())
      timed(&PhaseTimes::matmul_s,
            [&] { mla_.expand(l.mla, latent_att_.data(), R, att_.data(), pool_, scratch_); });
    timed(&PhaseTimes::matmul_s, [&] { kernels::matmul(l.wo, att_.data(), R, xb_.data(), pool_, scratch_); });
    for_rows(R, [&](int64_t r) {
      float* out = xb_.data() + r * c.n_embd;
      if (!l.post_attn_norm.empty()) kernels::rms_norm(out, l.post_attn_norm.data, out, c.n_embd, c.norm_eps);
      kernels::add_in_place(x_.data() + r * c.n_embd, out, c.n_embd);
      kernels::rms_norm(x_.data() + r * c.n_embd, l.ffn_norm.data, xb_.data() + r * c.n_embd, c.n_embd,
                        c.norm_eps);
    });
    ffn_residual(l, R, il, residency);
    if (capture) (*capture)(il, x_.data(), R);
  }

  // Final norm for the rows that need logits (all rows when capturing), then the head.
  const VectorView& out_norm = mtp && !mtp->head_norm.empty() ? mtp->head_norm : w.output_norm;
  int64_t n_out = 0;
  for (int64_t r = 0; r < R; ++r) {
    const bool want = rows[static_cast<size_t>(r)].logits;
    if (!want && !capture) continue;
    float* dst = xb_.data() + (capture ? r : n_out) * c.n_embd;
    kernels::rms_norm(x_.data() + r * c.n_embd, out_norm.data, dst, c.n_embd, c.norm_eps);
    if (want) ++n_out;
  }
  if (capture) {
    (*capture)(n_layers, xb_.data(), R);
    // Pack the rows that want logits to the front.
    int64_t k = 0;
    for (int64_t r = 0; r < R; ++r)
      if (rows[static_cast<size_t>(r)].logits) {
        if (k != r) std::copy_n(xb_.data() + r * c.n_embd, c.n_embd, xb_.data() + k * c.n_embd);
        ++k;
      }
  }
  if (n_out > 0) {
    TANDEM_CHECK(logits != nullptr, "rows want logits but no output buffer was given");
    head_with(mtp && !mtp->head.empty() ? mtp->head : w.output, xb_.data(), n_out, logits);
  }
}

void Forward::index_trees(std::span<const Row> rows, std::span<cache::KvCache* const> caches,
                          std::span<const TreeRows> trees) {
  trees_ = trees;
  tree_of_.assign(caches.size(), -1);
  if (trees.empty()) return;
  const Config& c = model_.config();
  if (ssm_)
    throw Error("model '" + c.arch +
                "' has recurrent (mamba) layers, whose state follows one sequence, not a token tree; use a "
                "chain of drafts (--tree-nodes 0)");
  for (size_t t = 0; t < trees.size(); ++t) {
    const TreeRows& tree = trees[t];
    if (tree.seq < 0 || static_cast<size_t>(tree.seq) >= caches.size() ||
        caches[static_cast<size_t>(tree.seq)] == nullptr)
      throw Error("a token tree refers to sequence " + std::to_string(tree.seq) + ", which has no cache");
    int32_t& slot = tree_of_[static_cast<size_t>(tree.seq)];
    if (slot >= 0)
      throw Error("sequence " + std::to_string(tree.seq) +
                  " has two token trees in one forward; a forward carries at most one per sequence");
    slot = static_cast<int32_t>(t);
    const cache::TreeMask& m = tree.mask;
    if (m.parent.size() != m.depth.size() || m.base < 0)
      throw Error("a token tree needs one parent and one depth per node");
    for (size_t i = 0; i < m.parent.size(); ++i) {
      const int32_t p = m.parent[i];
      if (p < -1 || p >= static_cast<int32_t>(i) ||
          m.depth[i] != (p < 0 ? 0 : m.depth[static_cast<size_t>(p)] + 1) ||
          m.depth[i] >= cache::kMaxTreeDepth)
        throw Error("token tree node " + std::to_string(i) + " has parent " + std::to_string(p) +
                    " and depth " + std::to_string(m.depth[i]) +
                    ": parents must come first and depths follow them");
    }
  }
  for (const Row& row : rows) {
    const TreeRows* tree = tree_of(row);
    if (tree && row.pos - tree->mask.base >= static_cast<int64_t>(tree->mask.parent.size()))
      throw Error("row position " + std::to_string(row.pos) + " is past the token tree's last node");
  }
}

void Forward::project_qkv(const LayerWeights& l, std::span<const Row> rows,
                          std::span<cache::KvCache* const> caches, int64_t il) {
  const Config& c = model_.config();
  const int64_t R = static_cast<int64_t>(rows.size());
  const kernels::MatmulOut qkv[] = {{&l.wq, q_.data()}, {&l.wk, k_.data()}, {&l.wv, v_.data()}};
  timed(&PhaseTimes::matmul_s, [&] { kernels::matmul_group(qkv, xb_.data(), R, pool_, scratch_); });
  for (int64_t r = 0; r < R; ++r) {
    float* q = q_.data() + r * c.q_dim();
    float* k = k_.data() + r * c.kv_dim();
    float* v = v_.data() + r * c.v_dim();
    if (!l.bq.empty()) kernels::add_in_place(q, l.bq.data, c.q_dim());
    if (!l.bk.empty()) kernels::add_in_place(k, l.bk.data, c.kv_dim());
    if (!l.bv.empty()) kernels::add_in_place(v, l.bv.data, c.v_dim());
    const int64_t pos = rows[static_cast<size_t>(r)].pos;
    const bool neox = c.rope_layout == RopeLayout::kNeoX;
    const float* cs = rope_cs_.data() + r * c.n_rot;
    for (int64_t h = 0; h < c.n_head; ++h) {
      float* qh = q + h * c.head_dim;
      if (!l.q_norm.empty()) kernels::rms_norm(qh, l.q_norm.data, qh, c.head_dim, c.norm_eps);
      kernels::rope_apply(qh, c.n_rot, cs, neox);
    }
    for (int64_t h = 0; h < c.n_head_kv; ++h) {
      float* kh = k + h * c.head_dim;
      if (!l.k_norm.empty()) kernels::rms_norm(kh, l.k_norm.data, kh, c.head_dim, c.norm_eps);
      kernels::rope_apply(kh, c.n_rot, cs, neox);
    }
    caches[static_cast<size_t>(rows[static_cast<size_t>(r)].seq)]->store(il, pos, k, v);
  }
}

void Forward::ffn_residual(const LayerWeights& l, int64_t R, int64_t il, ExpertResidency* residency) {
  const Config& c = model_.config();
  if (!l.moe.empty()) {
    timed(&PhaseTimes::matmul_s, [&] { moe_.run(l.moe, xb_.data(), R, pool_, scratch_, residency, il); });
  } else {
    dense_ffn(l, R);
  }
  for_rows(R, [&](int64_t r) {
    float* out = xb_.data() + r * c.n_embd;
    if (!l.post_ffn_norm.empty()) kernels::rms_norm(out, l.post_ffn_norm.data, out, c.n_embd, c.norm_eps);
    kernels::add_in_place(x_.data() + r * c.n_embd, out, c.n_embd);
  });
}

void Forward::dense_ffn(const LayerWeights& l, int64_t R) {
  const Config& c = model_.config();
  const kernels::MatmulOut gate_up[] = {{&l.w_gate, ffn_gate_.data()}, {&l.w_up, ffn_up_.data()}};
  timed(&PhaseTimes::matmul_s, [&] { kernels::matmul_group(gate_up, xb_.data(), R, pool_, scratch_); });
  for_rows(R, [&](int64_t r) {
    float* g = ffn_gate_.data() + r * c.n_ff;
    const float* u = ffn_up_.data() + r * c.n_ff;
    if (c.activation == FfnActivation::kSiLU) {
      kernels::swiglu(g, u, g, c.n_ff);
    } else {
      kernels::geglu(g, u, g, c.n_ff);
    }
  });
  timed(&PhaseTimes::matmul_s,
        [&] { kernels::matmul(l.w_down, ffn_gate_.data(), R, xb_.data(), pool_, scratch_); });
}

void Forward::head(const float* hidden, int64_t n, float* logits) {
  head_with(model_.weights().output, hidden, n, logits);
}

void Forward::head_with(const MatrixView& output, const float* hidden, int64_t n, float* logits) {
  const Config& c = model_.config();
  timed(&PhaseTimes::matmul_s, [&] { kernels::matmul(output, hidden, n, logits, pool_, scratch_); });
  if (c.final_softcap > 0) kernels::soft_cap(logits, n * c.n_vocab, c.final_softcap);
}

void Forward::attention(std::span<const Row> rows, std::span<cache::KvCache* const> caches, int64_t layer) {
  const Config& c = model_.config();
  const int64_t R = static_cast<int64_t>(rows.size());
  // The cache's heads (kv_geometry()): latent attention attends its absorbed queries to one latent head.
  const bool latent = c.mla.kv_lora_rank > 0;
  const int64_t kv_heads = latent ? 1 : c.n_head_kv;
  const int64_t key_dim = latent ? mla_.key_width() : c.head_dim;
  const int64_t value_dim = latent ? c.mla.kv_lora_rank : c.head_dim_v;
  const float* queries = latent ? latent_q_.data() : q_.data();
  float* out = latent ? latent_att_.data() : att_.data();
  const int64_t group = c.n_head / kv_heads;
  cache::AttentionParams params{c.attn_scale, c.attn_softcap};
  const bool sliding = c.sliding(layer);
  // A tree node's window starts from its path position, not its storage position.
  const auto first_of = [&](const Row& row) {
    return sliding ? std::max<int64_t>(0, path_pos(row) - c.sliding_window + 1) : 0;
  };
  // Runs of rows at consecutive positions of one sequence from one first position (a verify window, a
  // prompt chunk), as many as the scores scratch holds: their queries share each pass over the cache rows
  // (cache::attend_rows), with the bits of one row and head at a time.
  const int64_t max_run = std::max<int64_t>(1, window_queries_ / group);
  runs_.clear();
  for (int64_t r = 0; r < R; ++r) {
    const Row& row = rows[static_cast<size_t>(r)];
    const TreeRows* tree = tree_of(row);
    if (!runs_.empty()) {
      const Run& run = runs_.back();
      const Row& prev = rows[static_cast<size_t>(run.row + run.n - 1)];
      if (run.n < max_run && prev.seq == row.seq && prev.pos + 1 == row.pos && run.tree == tree &&
          first_of(prev) == first_of(row)) {
        ++runs_.back().n;
        continue;
      }
    }
    runs_.push_back({r, 1, tree});
  }
  // One task per run, KV head and share of its query heads. Fewer runs and KV heads than threads (a decode
  // step of latent attention: one run, one latent head) split each head group into shares, so that every
  // thread takes part; each share reads the cache rows again, but a head's result has the same bits in any
  // share (attend_rows, attend_tree).
  const auto n_runs = static_cast<int64_t>(runs_.size());
  const int64_t groups = n_runs * kv_heads;
  const int64_t shares = std::clamp<int64_t>((pool_.size() + groups - 1) / groups, 1, group);
  const cache::WindowLayout layout{c.n_head * key_dim, key_dim, c.n_head * value_dim, value_dim};
  pool_.parallel_for_dynamic(groups * shares, 1, [&](int64_t t0, int64_t t1, int thread) {
    float* scores = scores_.data() + thread * scores_stride_ * window_queries_;
    for (int64_t t = t0; t < t1; ++t) {
      const Run& run = runs_[static_cast<size_t>(t / shares / kv_heads)];
      const int64_t kvh = t / shares % kv_heads, share = t % shares;
      const int64_t g0 = share * group / shares, n_q = (share + 1) * group / shares - g0;
      const int64_t h0 = kvh * group + g0;
      const Row& row = rows[static_cast<size_t>(run.row)];
      const cache::KvCache& kv = *caches[static_cast<size_t>(row.seq)];
      const float* q = queries + run.row * c.n_head * key_dim + h0 * key_dim;
      float* dst = out + run.row * c.n_head * value_dim + h0 * value_dim;
      if (run.tree) {
        cache::attend_tree(kv, layer, kvh, q, run.n, n_q, layout, run.tree->mask, tree_node(row),
                           first_of(row), params, scores, scores_stride_, dst);
      } else {
        cache::attend_rows(kv, layer, kvh, q, run.n, n_q, layout, first_of(row), row.pos, params, scores,
                           scores_stride_, dst);
      }
    }
  });
}

}  // namespace tandem::model
