#include "tandem/model/encoder.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "tandem/kernels/float_kernels.h"
#include "tandem/kernels/ops.h"
#include "tandem/tensor/quant.h"
#include "tandem/util/error.h"

namespace tandem::model {

void pool_hidden(const float* hidden, int64_t n, int64_t dim, Pooling pooling, float* out) {
  switch (pooling) {
    case Pooling::kCls:
      std::copy_n(hidden, dim, out);
      return;
    case Pooling::kLast:
      std::copy_n(hidden + (n - 1) * dim, dim, out);
      return;
    case Pooling::kMean:
    case Pooling::kNone:
      break;
  }
  for (int64_t d = 0; d < dim; ++d) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += hidden[i * dim + d];
    out[d] = static_cast<float>(sum / static_cast<double>(n));
  }
}

void l2_normalize(float* x, int64_t n) {
  const double sum =
      kernels::interleaved_sum8<double>(n, [x](int64_t i) { return static_cast<double>(x[i]) * x[i]; });
  if (sum <= 0) return;
  const auto scale = static_cast<float>(1.0 / std::sqrt(sum));
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

Encoder::Encoder(const Model& model, ThreadPool& pool, int64_t max_rows)
    : model_(model), pool_(pool), max_rows_(std::max(max_rows, model.config().n_ctx_train)) {
  const Config& c = model.config();
  if (!c.encoder)
    throw Error("model '" + c.arch + "' is a decoder; its embeddings come from Embedder's decoder path");
  const int64_t widest = std::max({c.n_embd, c.n_ff, c.n_head * c.head_dim_v});
  scratch_ = kernels::MatmulScratch(pool.size(), widest, max_rows_);
  shape_ = {c.n_head,    c.n_head_kv, c.head_dim, c.head_dim_v,
            c.q_dim(),   c.kv_dim(),  c.v_dim(),  c.n_head * c.head_dim_v,
            c.attn_scale};
  auto alloc = [&](std::vector<float>& v, int64_t width) {
    v.assign(static_cast<size_t>(max_rows_ * width), 0.0f);
  };
  alloc(x_, c.n_embd);
  alloc(xb_, c.n_embd);
  alloc(q_, c.q_dim());
  alloc(k_, c.kv_dim());
  alloc(v_, c.v_dim());
  alloc(att_, c.n_head * c.head_dim_v);
  alloc(ffn_, c.n_ff);
  const Weights& w = model.weights();
  if (!w.layers.empty() && !w.layers[0].w_gate.empty()) alloc(ffn_up_, c.n_ff);
  if (w.pos_embd.empty()) {
    // Rotary positions: every position's cosines and sines, once.
    std::vector<float> inv_freq(static_cast<size_t>(c.n_rot / 2));
    for (int64_t i = 0; i < c.n_rot / 2; ++i)
      inv_freq[static_cast<size_t>(i)] = static_cast<float>(std::pow(
          static_cast<double>(c.rope_base), -2.0 * static_cast<double>(i) / static_cast<double>(c.n_rot)));
    rope_cs_.assign(static_cast<size_t>(max_tokens() * c.n_rot), 0.0f);
    for (int64_t pos = 0; pos < max_tokens(); ++pos)
      kernels::rope_angles(c.n_rot, inv_freq.data(), pos, rope_cs_.data() + pos * c.n_rot);
  }
  att_scratch_.assign(
      static_cast<size_t>(pool.size() * kernels::full_attention_scratch(shape_, max_tokens())), 0.0f);
  seq_first_.reserve(static_cast<size_t>(max_rows_));
}

void Encoder::run(std::span<const std::span<const int32_t>> seqs, float* hidden) {
  const Config& c = model_.config();
  const Weights& w = model_.weights();
  const int64_t E = c.n_embd;
  seq_first_.clear();
  int64_t R = 0;
  for (const auto& seq : seqs) {
    const auto n = static_cast<int64_t>(seq.size());
    TANDEM_CHECK(n > 0 && n <= max_tokens(), "encoder sequence length out of range");
    seq_first_.push_back(R);
    R += n;
  }
  TANDEM_CHECK(R <= max_rows_, "encoder batch exceeds its row capacity");
  if (R == 0) return;

  // Token + learned position (bert; nomic-bert rotates q and k instead) + token-type (type 0: single-segment
  // inputs) embeddings, then their LayerNorm.
  const bool rotary = w.pos_embd.empty();
  pool_.parallel_for(static_cast<int64_t>(seqs.size()), 1, [&](int64_t s0, int64_t s1, int) {
    for (int64_t s = s0; s < s1; ++s) {
      const auto& seq = seqs[static_cast<size_t>(s)];
      for (int64_t pos = 0; pos < static_cast<int64_t>(seq.size()); ++pos) {
        float* x = x_.data() + (seq_first_[static_cast<size_t>(s)] + pos) * E;
        float* tmp = xb_.data() + (seq_first_[static_cast<size_t>(s)] + pos) * E;
        dequantize_row(w.tok_embd.type, w.tok_embd.row(seq[static_cast<size_t>(pos)]), x, E);
        if (!rotary) {
          dequantize_row(w.pos_embd.type, w.pos_embd.row(pos), tmp, E);
          kernels::add_in_place(x, tmp, E);
        }
        dequantize_row(w.type_embd.type, w.type_embd.row(0), tmp, E);
        kernels::add_in_place(x, tmp, E);
        kernels::layer_norm(x, w.embd_norm.data, w.embd_norm_b.data, x, E, c.norm_eps);
      }
    }
  });

  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = w.layers[static_cast<size_t>(il)];
    const kernels::MatmulOut qkv[] = {{&l.wq, q_.data()}, {&l.wk, k_.data()}, {&l.wv, v_.data()}};
    kernels::encoder_matmul_group(qkv, x_.data(), R, pool_, scratch_);
    if (!l.bq.empty())
      for_rows(R, [&](int64_t r) {
        kernels::add_in_place(q_.data() + r * c.q_dim(), l.bq.data, c.q_dim());
        kernels::add_in_place(k_.data() + r * c.kv_dim(), l.bk.data, c.kv_dim());
        kernels::add_in_place(v_.data() + r * c.v_dim(), l.bv.data, c.v_dim());
      });
    if (rotary) rotate(seqs);
    attention(seqs);
    kernels::encoder_matmul(l.wo, att_.data(), R, xb_.data(), pool_, scratch_);
    // Post-norm: x = LayerNorm(x + attention(x)).
    for_rows(R, [&](int64_t r) {
      float* x = x_.data() + r * E;
      const float* o = xb_.data() + r * E;
      if (l.bo.empty())
        for (int64_t i = 0; i < E; ++i) x[i] += o[i];
      else
        for (int64_t i = 0; i < E; ++i) x[i] += o[i] + l.bo.data[i];
      kernels::layer_norm(x, l.attn_out_norm.data, l.attn_out_norm_b.data, x, E, c.norm_eps);
    });
    if (!l.w_gate.empty()) {
      // SwiGLU: silu(x W_gate) * x W_up.
      const kernels::MatmulOut gate_up[] = {{&l.w_gate, ffn_.data()}, {&l.w_up, ffn_up_.data()}};
      kernels::encoder_matmul_group(gate_up, x_.data(), R, pool_, scratch_);
      for_rows(R, [&](int64_t r) {
        float* f = ffn_.data() + r * c.n_ff;
        kernels::silu_mul(f, ffn_up_.data() + r * c.n_ff, f, c.n_ff);
      });
    } else {
      kernels::encoder_matmul(l.w_up, x_.data(), R, ffn_.data(), pool_, scratch_);
      for_rows(R, [&](int64_t r) {
        float* f = ffn_.data() + r * c.n_ff;
        if (!l.b_up.empty()) kernels::add_in_place(f, l.b_up.data, c.n_ff);
        kernels::gelu(f, c.n_ff);
      });
    }
    kernels::encoder_matmul(l.w_down, ffn_.data(), R, xb_.data(), pool_, scratch_);
    // x = LayerNorm(x + ffn(x)).
    for_rows(R, [&](int64_t r) {
      float* x = x_.data() + r * E;
      const float* o = xb_.data() + r * E;
      if (l.b_down.empty())
        for (int64_t i = 0; i < E; ++i) x[i] += o[i];
      else
        for (int64_t i = 0; i < E; ++i) x[i] += o[i] + l.b_down.data[i];
      kernels::layer_norm(x, l.layer_out_norm.data, l.layer_out_norm_b.data, x, E, c.norm_eps);
    });
  }
  std::copy_n(x_.data(), R * E, hidden);
}

void Encoder::rotate(std::span<const std::span<const int32_t>> seqs) {
  const Config& c = model_.config();
  const bool neox = c.rope_layout == RopeLayout::kNeoX;
  pool_.parallel_for(static_cast<int64_t>(seqs.size()), 1, [&](int64_t s0, int64_t s1, int) {
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t first = seq_first_[static_cast<size_t>(s)];
      for (int64_t pos = 0; pos < static_cast<int64_t>(seqs[static_cast<size_t>(s)].size()); ++pos) {
        const float* cs = rope_cs_.data() + pos * c.n_rot;
        float* q = q_.data() + (first + pos) * c.q_dim();
        float* k = k_.data() + (first + pos) * c.kv_dim();
        for (int64_t h = 0; h < c.n_head; ++h) kernels::rope_apply(q + h * c.head_dim, c.n_rot, cs, neox);
        for (int64_t h = 0; h < c.n_head_kv; ++h) kernels::rope_apply(k + h * c.head_dim, c.n_rot, cs, neox);
      }
    }
  });
}

void Encoder::attention(std::span<const std::span<const int32_t>> seqs) {
  const Config& c = model_.config();
  const int64_t per_thread = kernels::full_attention_scratch(shape_, max_tokens());
  // One task per sequence and key/value head: each reads only its own sequence's rows.
  const auto n_seqs = static_cast<int64_t>(seqs.size());
  pool_.parallel_for_dynamic(n_seqs * c.n_head_kv, 1, [&](int64_t t0, int64_t t1, int thread) {
    float* scratch = att_scratch_.data() + thread * per_thread;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = t / c.n_head_kv, kvh = t % c.n_head_kv;
      const int64_t first = seq_first_[static_cast<size_t>(s)];
      const auto n = static_cast<int64_t>(seqs[static_cast<size_t>(s)].size());
      kernels::attend_full(q_.data() + first * shape_.q_stride, k_.data() + first * shape_.k_stride,
                           v_.data() + first * shape_.v_stride, n, shape_, kvh, kvh + 1, scratch,
                           att_.data() + first * shape_.out_stride);
    }
  });
}

namespace {

Pooling decoder_pooling(const Model& model) {
  const std::optional<int64_t> type = model.file().get_int(model.config().arch + ".pooling_type");
  if (type == 1) return Pooling::kMean;
  if (type == 2) return Pooling::kCls;
  return Pooling::kLast;
}

}  // namespace

Embedder::Embedder(const Model& model, ThreadPool& pool, int64_t max_rows, int64_t n_ctx) : model_(model) {
  if (model.config().encoder) {
    pooling_ = model.config().pooling == Pooling::kNone ? Pooling::kMean : model.config().pooling;
    encoder_ = std::make_unique<Encoder>(model, pool, max_rows);
    hidden_.assign(static_cast<size_t>(encoder_->max_rows() * dim()), 0.0f);
  } else {
    pooling_ = decoder_pooling(model);
    SessionOptions options;
    options.batch = std::min<int64_t>(max_rows, 512);
    options.n_ctx = n_ctx;
    session_ = std::make_unique<Session>(model, pool, options);
  }
}

Embedder::~Embedder() = default;

int64_t Embedder::max_tokens() const {
  return encoder_ ? encoder_->max_tokens() : session_->n_ctx();
}

void Embedder::embed(std::span<const std::span<const int32_t>> seqs, const EmbedOptions& options,
                     float* out) {
  const int64_t D = dim();
  const int64_t limit = max_tokens();
  const int64_t n_vocab = model_.config().n_vocab;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto n = static_cast<int64_t>(seqs[s].size());
    if (n == 0) throw Error("input " + std::to_string(s) + " has no tokens; give it some text");
    if (n > limit)
      throw Error("input " + std::to_string(s) + " has " + std::to_string(n) + " tokens, more than the " +
                  std::to_string(limit) + " the model takes; shorten it");
    for (const int32_t id : seqs[s])
      if (id < 0 || id >= n_vocab)
        throw Error("input " + std::to_string(s) + " holds token id " + std::to_string(id) +
                    ", outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
  }
  const Pooling pooling = options.pooling == Pooling::kNone ? pooling_ : options.pooling;

  if (encoder_) {
    // Consecutive sequences packed into forwards of at most max_rows() rows.
    size_t s0 = 0;
    while (s0 < seqs.size()) {
      size_t s1 = s0;
      int64_t rows = 0;
      while (s1 < seqs.size() && rows + static_cast<int64_t>(seqs[s1].size()) <= encoder_->max_rows())
        rows += static_cast<int64_t>(seqs[s1++].size());
      encoder_->run(seqs.subspan(s0, s1 - s0), hidden_.data());
      int64_t first = 0;
      for (size_t s = s0; s < s1; ++s) {
        const auto n = static_cast<int64_t>(seqs[s].size());
        pool_hidden(hidden_.data() + first * D, n, D, pooling, out + static_cast<int64_t>(s) * D);
        first += n;
      }
      s0 = s1;
    }
  } else {
    // One sequence at a time; the capture sees each chunk's post-final-norm rows (layer n_layer).
    for (size_t s = 0; s < seqs.size(); ++s) {
      float* dst = out + static_cast<int64_t>(s) * D;
      std::fill_n(dst, D, 0.0f);
      const auto n = static_cast<int64_t>(seqs[s].size());
      int64_t seen = 0;
      const CaptureFn capture = [&](int64_t layer, const float* hidden, int64_t rows) {
        if (layer != model_.config().n_layer) return;
        if (pooling == Pooling::kMean) {
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t d = 0; d < D; ++d) dst[d] += hidden[r * D + d] / static_cast<float>(n);
        } else if (pooling == Pooling::kCls && seen == 0) {
          std::copy_n(hidden, D, dst);
        } else if (pooling == Pooling::kLast && seen + rows == n) {
          std::copy_n(hidden + (rows - 1) * D, D, dst);
        }
        seen += rows;
      };
      session_->truncate(0);
      session_->eval(seqs[s], false, &capture);
    }
  }
  if (options.normalize)
    for (size_t s = 0; s < seqs.size(); ++s) l2_normalize(out + static_cast<int64_t>(s) * D, D);
}

}  // namespace tandem::model
