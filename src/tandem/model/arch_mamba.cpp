// mamba: Mamba-1. Every layer is RMSNorm, then a selective state-space mixer (input projection to x and a
// gate z, causal depthwise convolution over x, the selective scan with a softplus time step and B, C
// projected from x, a skip through D, gating by silu(z), output projection), added to the residual. No
// attention, no FFN; the head is tied to the embedding or separate.
#include <limits>
#include <string>

#include "tandem/model/arch.h"
#include "tandem/util/error.h"

namespace tandem::model {

namespace {

// Generous bounds on the mixer's sizes: real models stay far below them, and they keep the state's size
// (layers * d_inner * d_state) far from overflow before the tensors confirm them.
constexpr int64_t kMaxInner = int64_t{1} << 20;
constexpr int64_t kMaxState = 1024;
constexpr int64_t kMaxConv = 64;

MatrixView f32_matrix(const ArchReader& r, const std::string& name, int64_t ne0, int64_t ne1) {
  MatrixView m = r.matrix(name, ne0, ne1);
  if (m.type != DType::F32)
    throw Error("tensor '" + name + "' is " + std::string(dtype_name(m.type)) + "; it must be F32");
  if (reinterpret_cast<uintptr_t>(m.data) % alignof(float) != 0)
    throw Error("tensor '" + name + "' is not aligned in the file");
  return m;
}

}  // namespace

void read_ssm_config(const ArchReader& r, Config& c) {
  c.ssm_d_conv = r.int_in("ssm.conv_kernel", 1, kMaxConv, std::nullopt);
  c.ssm_d_inner = r.int_in("ssm.inner_size", 1, kMaxInner, std::nullopt);
  c.ssm_d_state = r.int_in("ssm.state_size", 1, kMaxState, std::nullopt);
  c.ssm_dt_rank = r.int_in("ssm.time_step_rank", 1, kMaxInner, std::nullopt);
}

void bind_ssm_mixer(const ArchReader& r, const Config& c, int64_t layer, bool dt_b_c_norms, LayerWeights& l) {
  const int64_t E = c.n_embd, N = c.ssm_d_inner, S = c.ssm_d_state, R = c.ssm_dt_rank;
  const std::string p = "blk." + std::to_string(layer) + ".";
  l.ssm_in = r.matrix(p + "ssm_in.weight", E, 2 * N);
  l.ssm_conv1d = f32_matrix(r, p + "ssm_conv1d.weight", c.ssm_d_conv, N);
  l.ssm_conv1d_b = r.vector(p + "ssm_conv1d.bias", N);
  l.ssm_x = r.matrix(p + "ssm_x.weight", N, R + 2 * S);
  l.ssm_dt = r.matrix(p + "ssm_dt.weight", R, N);
  l.ssm_dt_b = r.vector(p + "ssm_dt.bias", N);
  l.ssm_a = f32_matrix(r, p + "ssm_a", S, N);
  l.ssm_d = r.vector(p + "ssm_d", N);
  l.ssm_out = r.matrix(p + "ssm_out.weight", N, E);
  if (dt_b_c_norms) {
    l.ssm_dt_norm = r.vector(p + "ssm_dt_norm.weight", R);
    l.ssm_b_norm = r.vector(p + "ssm_b_norm.weight", S);
    l.ssm_c_norm = r.vector(p + "ssm_c_norm.weight", S);
  }
}

void load_mamba(const ArchReader& r, Config& c, Weights& w) {
  read_embedding_and_blocks(r, c);
  c.n_ctx_train = r.int_in("context_length", 1, std::numeric_limits<int32_t>::max(), 2048);
  c.norm_eps = r.positive_float("attention.layer_norm_rms_epsilon", 1e-5f);
  read_ssm_config(r, c);
  if (r.file().get_bool(r.arch() + ".ssm.dt_b_c_rms").value_or(false))
    throw Error("metadata '" + r.arch() +
                ".ssm.dt_b_c_rms' is true (RMS-normalised dt, B and C, as in Falcon-Mamba), which is not "
                "supported yet");
  c.layer_recurrent.assign(static_cast<size_t>(c.n_layer), 1);

  w.tok_embd = r.matrix("token_embd.weight", c.n_embd, c.n_vocab);
  w.output_norm = r.vector("output_norm.weight", c.n_embd);
  w.output = r.matrix("output.weight", c.n_embd, c.n_vocab, /*required=*/false);
  if (w.output.empty()) w.output = w.tok_embd;  // tied head
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    l.attn_norm = r.vector("blk." + std::to_string(i) + ".attn_norm.weight", c.n_embd);
    bind_ssm_mixer(r, c, i, /*dt_b_c_norms=*/false, l);
  }
}

}  // namespace tandem::model
