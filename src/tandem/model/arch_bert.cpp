// bert: BERT-family encoders (bge, e5, all-MiniLM, ...). Token, learned absolute position and token-type
// embeddings summed and LayerNorm-ed; post-norm layers (LayerNorm with bias after each residual add);
// biased q/k/v and output projections; non-causal attention; an FFN of GELU(x W_up + b) W_down + b; no
// output head. The checkpoint names its pooling in bert.pooling_type.
//
// nomic-bert (nomic-embed-text): the same encoder with rotary positions in place of learned ones (NeoX
// pairs, {arch}.rope.freq_base), one fused q/k/v projection (attn_qkv), no biases on the projections, and a
// SwiGLU FFN, (silu(x W_gate) * x W_up) W_down. model/encoder.cpp reads which of these a checkpoint has from
// its weights: an empty position table means rotary positions, a gate matrix SwiGLU, empty biases none.
#include <cstdint>
#include <limits>
#include <string>

#include "tandem/model/arch.h"
#include "tandem/util/error.h"

namespace tandem::model {
namespace {

Pooling read_pooling(const ArchReader& r) {
  const int64_t type = r.int_in("pooling_type", 0, 4, 0);
  switch (type) {
    case 1:
      return Pooling::kMean;
    case 2:
      return Pooling::kCls;
    case 3:
      return Pooling::kLast;
    case 4:
      throw Error("metadata '" + r.arch() +
                  ".pooling_type' is 4 (rank: a reranker's classification head), which Tandem does not "
                  "support; use an embedding model (pooling_type 1 mean, 2 cls or 3 last)");
    default:
      return Pooling::kNone;
  }
}

// What both variants share: the encoder's hyperparameters and the token and token-type embeddings with their
// LayerNorm.
void read_encoder(const ArchReader& r, Config& c, Weights& w, FfnActivation activation) {
  c.encoder = true;
  read_common_hparams(r, c);
  c.norm_eps = r.positive_float("attention.layer_norm_epsilon", 1e-12f);
  c.activation = activation;
  c.pooling = read_pooling(r);
  if (r.file().get_bool(r.arch() + ".attention.causal").value_or(false))
    throw Error("metadata '" + r.arch() +
                ".attention.causal' is true, but a bert encoder attends both ways; the file is inconsistent");
  if (c.n_head_kv != c.n_head)
    throw Error("metadata '" + r.arch() + ".attention.head_count_kv' is " + std::to_string(c.n_head_kv) +
                ", but a bert encoder has as many key/value heads as query heads (" +
                std::to_string(c.n_head) + ")");
  check_layer_count(r, c);

  w.tok_embd = r.matrix("token_embd.weight", c.n_embd, c.n_vocab);
  const gguf::TensorInfo* types = r.file().tensor("token_types.weight");
  if (types == nullptr) throw Error("model file '" + r.file().path() + "' lacks tensor 'token_types.weight'");
  const int64_t n_types = types->ne[1];
  if (types->n_dims != 2 || n_types < 1 || n_types > std::numeric_limits<int32_t>::max())
    throw Error("tensor 'token_types.weight' has shape " + types->shape_string() + ", expected [" +
                std::to_string(c.n_embd) + ", number of token types]");
  w.type_embd = r.matrix("token_types.weight", c.n_embd, n_types);
  w.embd_norm = r.vector("token_embd_norm.weight", c.n_embd);
  w.embd_norm_b = r.vector("token_embd_norm.bias", c.n_embd);
}

// Rows [first, first + n) of m, as a matrix of their own.
MatrixView row_range(const MatrixView& m, int64_t first, int64_t n) {
  MatrixView v = m;
  v.rows = n;
  v.data = m.row(first);
  return v;
}

}  // namespace

void load_bert(const ArchReader& r, Config& c, Weights& w) {
  read_encoder(r, c, w, FfnActivation::kGeluTanh);
  w.pos_embd = r.matrix("position_embd.weight", c.n_embd, c.n_ctx_train);

  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    l.wq = r.matrix(p + "attn_q.weight", c.n_embd, c.q_dim());
    l.wk = r.matrix(p + "attn_k.weight", c.n_embd, c.kv_dim());
    l.wv = r.matrix(p + "attn_v.weight", c.n_embd, c.v_dim());
    l.bq = r.vector(p + "attn_q.bias", c.q_dim());
    l.bk = r.vector(p + "attn_k.bias", c.kv_dim());
    l.bv = r.vector(p + "attn_v.bias", c.v_dim());
    l.wo = r.matrix(p + "attn_output.weight", c.n_head * c.head_dim_v, c.n_embd);
    l.bo = r.vector(p + "attn_output.bias", c.n_embd);
    l.attn_out_norm = r.vector(p + "attn_output_norm.weight", c.n_embd);
    l.attn_out_norm_b = r.vector(p + "attn_output_norm.bias", c.n_embd);
    l.w_up = r.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff);
    l.b_up = r.vector(p + "ffn_up.bias", c.n_ff);
    l.w_down = r.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd);
    l.b_down = r.vector(p + "ffn_down.bias", c.n_embd);
    l.layer_out_norm = r.vector(p + "layer_output_norm.weight", c.n_embd);
    l.layer_out_norm_b = r.vector(p + "layer_output_norm.bias", c.n_embd);
  }
}

void load_nomic_bert(const ArchReader& r, Config& c, Weights& w) {
  read_encoder(r, c, w, FfnActivation::kSiLU);
  c.rope_layout = RopeLayout::kNeoX;
  if (c.n_rot % 2 != 0 || c.n_rot > c.head_dim)
    throw Error("metadata '" + r.arch() + ".rope.dimension_count' is " + std::to_string(c.n_rot) +
                ", expected an even number of at most the head size " + std::to_string(c.head_dim));

  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    // [n_embd, q_dim + kv_dim + v_dim]: the query rows, then the key rows, then the value rows.
    const MatrixView qkv = r.matrix(p + "attn_qkv.weight", c.n_embd, c.q_dim() + c.kv_dim() + c.v_dim());
    l.wq = row_range(qkv, 0, c.q_dim());
    l.wk = row_range(qkv, c.q_dim(), c.kv_dim());
    l.wv = row_range(qkv, c.q_dim() + c.kv_dim(), c.v_dim());
    l.wo = r.matrix(p + "attn_output.weight", c.n_head * c.head_dim_v, c.n_embd);
    l.attn_out_norm = r.vector(p + "attn_output_norm.weight", c.n_embd);
    l.attn_out_norm_b = r.vector(p + "attn_output_norm.bias", c.n_embd);
    l.w_up = r.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff);
    l.w_gate = r.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff);
    l.w_down = r.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd);
    l.layer_out_norm = r.vector(p + "layer_output_norm.weight", c.n_embd);
    l.layer_out_norm_b = r.vector(p + "layer_output_norm.bias", c.n_embd);
  }
}

}  // namespace tandem::model
