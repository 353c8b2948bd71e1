#include "tandem/model/model.h"

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/model/mla.h"
#include "tandem/util/error.h"

namespace tandem::model {

namespace {

// Repacks the layer matrices and an untied head in place, once, where a repacked form pays on this CPU
// (kernels/repack.h): they go through the matmul kernels only (the embedding table, read row by row, keeps
// the file's form, and so does a head tied to it). Where the pages cannot be made writable the file's form
// stays; the kernels read every form, with the same results (lane pairs: the same up to float rounding).
void repack(const gguf::File& file, MatrixView& m) {
  if (m.empty() || m.form != WeightForm::kFile) return;
  const WeightForm form = kernels::repack_form(m.type, m.rows, m.cols, m.data);
  if (form == WeightForm::kFile) return;
  uint8_t* bytes = file.writable(m.data, m.bytes());
  if (!bytes) return;
  kernels::repack_rows(form, m.type, m.cols, bytes, m.bytes());
  file.seal(m.data, m.bytes());
  m.form = form;
}

void repack_layer(const gguf::File& file, LayerWeights& l) {
  for (MatrixView* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.ssm_in, &l.ssm_x,
                        &l.ssm_dt, &l.ssm_out})
    repack(file, *m);
  // attn_kv_b, attn_k_b and attn_v_b stay in the file's form: latent attention multiplies copies of them, or
  // their own float rows (model/mla.h).
  for (MatrixView* m : {&l.mla.wq, &l.mla.wq_a, &l.mla.wq_b, &l.mla.wkv_a}) repack(file, *m);
  for (MatrixView* m : {&l.moe.router, &l.moe.shared_gate, &l.moe.shared_up, &l.moe.shared_down})
    repack(file, *m);
  for (auto* experts : {&l.moe.gate, &l.moe.up, &l.moe.down})
    for (MatrixView& m : *experts) repack(file, m);
}

void repack_layer_weights(const gguf::File& file, Weights& w) {
  for (LayerWeights& l : w.layers) repack_layer(file, l);
  // The MTP layers' own matrices (their embedding, read row by row, keeps the file's form).
  for (MtpWeights& m : w.mtp) {
    repack_layer(file, m.block);
    repack(file, m.eh_proj);
    if (m.head.data != m.embed.data && m.head.data != w.tok_embd.data) repack(file, m.head);
  }
  if (w.output.data != w.tok_embd.data) repack(file, w.output);  // a head of its own (not tied)
}

// The recurrent layers' small F32 weights, transposed channel-minor for the kernels (kernels/ssm.h) into
// `owner`, which must not be resized afterwards.
void make_channel_minor(const Config& c, Weights& w, std::vector<float>& owner) {
  const int64_t N = c.ssm_d_inner, K = c.ssm_d_conv, S = c.ssm_d_state;
  int64_t layers = 0;
  for (int64_t il = 0; il < c.n_layer; ++il) layers += c.recurrent(il) ? 1 : 0;
  owner.assign(static_cast<size_t>(layers * (K + S) * N), 0.0f);
  float* out = owner.data();
  const auto transpose = [&](const MatrixView& m, int64_t cols) {
    const auto* src = reinterpret_cast<const float*>(m.data);  // [N, cols]
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < cols; ++j) out[j * N + i] = src[i * cols + j];
    const float* t = out;
    out += cols * N;
    return t;
  };
  for (int64_t il = 0; il < c.n_layer; ++il) {
    if (!c.recurrent(il)) continue;
    LayerWeights& l = w.layers[static_cast<size_t>(il)];
    l.ssm_conv_t = transpose(l.ssm_conv1d, K);
    l.ssm_a_t = transpose(l.ssm_a, S);
  }
}

// Every latent attention layer's copies of its up-projection (model/mla.h; the MTP layers' too) into `owner`,
// which must not be resized afterwards.
void make_mla_layer_copies(const Config& c, Weights& w, std::vector<uint8_t>& owner) {
  std::vector<MlaWeights*> layers;
  for (LayerWeights& l : w.layers)
    if (!l.mla.empty()) layers.push_back(&l.mla);
  for (MtpWeights& m : w.mtp)
    if (!m.block.mla.empty()) layers.push_back(&m.block.mla);
  size_t total = 0;
  for (const MlaWeights* m : layers) total += mla_copy_bytes(c, *m);
  owner.assign(total, 0);
  size_t at = 0;
  for (MlaWeights* m : layers) {
    make_mla_copies(c, *m, owner.data() + at);
    at += mla_copy_bytes(c, *m);
  }
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, gguf::LoadMode mode) {
  return from_file(gguf::File::open(path, mode));
}

std::unique_ptr<Model> Model::from_file(gguf::File file) {
  std::unique_ptr<Model> m(new Model(std::move(file)));
  bind_model(m->file_, m->config_, m->weights_);
  make_mla_layer_copies(m->config_, m->weights_, m->mla_copies_);
  repack_layer_weights(m->file_, m->weights_);
  make_channel_minor(m->config_, m->weights_, m->channel_minor_);
  return m;
}

size_t Model::weight_bytes_per_token() const {
  size_t total = weights_.output.bytes() + weights_.tok_embd.row_bytes;
  for (const LayerWeights& l : weights_.layers) {
    total += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.w_gate.bytes() + l.w_up.bytes() +
             l.w_down.bytes() + l.ssm_in.bytes() + l.ssm_x.bytes() + l.ssm_dt.bytes() + l.ssm_out.bytes() +
             l.ssm_conv1d.bytes() + l.ssm_a.bytes();
    // Latent attention reads its copies of attn_kv_b, or of its float rows the keys' copy and the values; of
    // a split attn_k_b and attn_v_b, the tensors or their copies (wk_t and wv).
    total +=
        l.mla.wq.bytes() + l.mla.wq_a.bytes() + l.mla.wq_b.bytes() + l.mla.wkv_a.bytes() + l.mla.wk_t.bytes();
    if (!l.mla.empty())
      total += l.mla.wv.empty()
                   ? static_cast<size_t>(config_.n_head * config_.head_dim_v) * l.mla.wkv_b.row_bytes
                   : l.mla.wv.bytes();
    if (l.moe.empty()) continue;
    // The router, the shared expert and the n_expert_used routed experts a token reads.
    total += l.moe.router.bytes() + l.moe.shared_gate.bytes() + l.moe.shared_up.bytes() +
             l.moe.shared_down.bytes();
    total += static_cast<size_t>(config_.moe.n_expert_used) *
             (l.moe.gate[0].bytes() + l.moe.up[0].bytes() + l.moe.down[0].bytes());
  }
  return total;
}

int64_t Model::quantized_macs_per_token() const {
  auto macs = [](const MatrixView& m) { return kernels::is_quantized_weight(m.type) ? m.rows * m.cols : 0; };
  int64_t total = macs(weights_.output);
  for (const LayerWeights& l : weights_.layers) {
    total += macs(l.wq) + macs(l.wk) + macs(l.wv) + macs(l.wo) + macs(l.w_gate) + macs(l.w_up) +
             macs(l.w_down) + macs(l.ssm_in) + macs(l.ssm_x) + macs(l.ssm_dt) + macs(l.ssm_out);
    // (attn_kv_b is multiplied through float copies or as floats.)
    total += macs(l.mla.wq) + macs(l.mla.wq_a) + macs(l.mla.wq_b) + macs(l.mla.wkv_a);
    if (l.moe.empty()) continue;
    total += macs(l.moe.router) + macs(l.moe.shared_gate) + macs(l.moe.shared_up) + macs(l.moe.shared_down);
    total += config_.moe.n_expert_used * (macs(l.moe.gate[0]) + macs(l.moe.up[0]) + macs(l.moe.down[0]));
  }
  return total;
}

}  // namespace tandem::model
