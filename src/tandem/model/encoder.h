// Pooled embeddings. Encoder is the forward of an encoder-only model (bert): many sequences in one batch,
// their rows packed into the same matrix products, each attending to all of its own rows and to no others.
// Its float matrix products take the encoder GEMM (kernels::encoder_matmul_group), whose sums depend on no
// row but a row's own, so a sequence's embedding has the same bits alone or anywhere in a batch. Embedder
// turns token sequences into pooled, optionally L2-normalised vectors from either kind of model: an encoder's
// final hidden states, or a decoder's post-final-norm hidden states (embedding models built on
// llama/qwen2/qwen3 bodies).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tandem/kernels/full_attention.h"
#include "tandem/kernels/matmul.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/util/thread_pool.h"

namespace tandem::model {

struct EmbedOptions {
  Pooling pooling = Pooling::kNone;  // kNone: the model's own (Embedder::pooling())
  bool normalize = true;             // divide each embedding by its L2 norm
};

// Pools a sequence's final hidden states hidden [n, dim] into out [dim] (kNone is not a pooling here).
void pool_hidden(const float* hidden, int64_t n, int64_t dim, Pooling pooling, float* out);
// x /= |x|_2 (a zero vector stays zero).
void l2_normalize(float* x, int64_t n);

class Encoder {
 public:
  // Workspace for forwards of up to max_rows rows (all sequences of a batch together), at least the model's
  // context so that any one sequence fits. Throws tandem::Error when the model is not an encoder.
  Encoder(const Model& model, ThreadPool& pool, int64_t max_rows);

  const Model& model() const { return model_; }
  int64_t max_rows() const { return max_rows_; }
  int64_t max_tokens() const { return model_.config().n_ctx_train; }  // the longest sequence

  // Final hidden states of sequences packed into one forward: hidden [sum of lengths, n_embd], the rows of
  // sequence 0 first. The sequences' lengths must sum to at most max_rows(). Allocates nothing.
  void run(std::span<const std::span<const int32_t>> seqs, float* hidden);

 private:
  void attention(std::span<const std::span<const int32_t>> seqs);
  // Rotary positions (an encoder without a position table): each row's q and k heads by its position.
  void rotate(std::span<const std::span<const int32_t>> seqs);

  // fn(r) for every row r < n, across the team when there are enough rows to pay for a barrier.
  template <typename Fn>
  void for_rows(int64_t n, Fn&& fn) {
    if (n < 4) {
      for (int64_t r = 0; r < n; ++r) fn(r);
      return;
    }
    pool_.parallel_for(n, 1, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) fn(r);
    });
  }

  const Model& model_;
  ThreadPool& pool_;
  int64_t max_rows_;
  kernels::MatmulScratch scratch_;
  kernels::FullAttentionShape shape_;
  // Activations, [max_rows, width] each.
  std::vector<float> x_, xb_, q_, k_, v_, att_, ffn_;
  std::vector<float> ffn_up_;   // [max_rows, n_ff] with a gated FFN (SwiGLU), else empty
  std::vector<float> rope_cs_;  // [max_tokens, n_rot]: rope_angles of each position, with rotary positions
  std::vector<float> att_scratch_;  // [threads, full_attention_scratch(shape_, max_tokens())]
  std::vector<int64_t> seq_first_;  // [sequences of the batch]: first row of each
};

// Token sequences to embeddings, with whichever forward the model has.
class Embedder {
 public:
  // max_rows: rows of one forward (an encoder packs several sequences into it). n_ctx: a decoder's context
  // (0: default_context()); an encoder's is its trained one.
  Embedder(const Model& model, ThreadPool& pool, int64_t max_rows = 2048, int64_t n_ctx = 0);
  ~Embedder();

  int64_t dim() const { return model_.config().n_embd; }
  // The longest sequence accepted: an encoder's trained context, a decoder session's context.
  int64_t max_tokens() const;
  // The model's own pooling: an encoder's {arch}.pooling_type, a decoder's too where it states one (1 mean,
  // 2 cls, 3 last), else the last token (what decoder embedding models train).
  Pooling pooling() const { return pooling_; }

  // Embeds each sequence into out [seqs.size(), dim()], in order. Throws tandem::Error naming the sequence
  // for an empty one, one longer than max_tokens(), or a token outside the vocabulary; nothing is computed
  // then.
  void embed(std::span<const std::span<const int32_t>> seqs, const EmbedOptions& options, float* out);

 private:
  const Model& model_;
  Pooling pooling_;
  std::unique_ptr<Encoder> encoder_;  // encoders
  std::unique_ptr<Session> session_;  // decoders
  std::vector<float> hidden_;         // encoders: [encoder max_rows, n_embd]
};

}  // namespace tandem::model
