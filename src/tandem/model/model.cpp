#include "tandem/model/model.h"

#include <cmath>
#include <numbers>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/util/error.h"

namespace tandem::model {
namespace {

std::string supported_types() {
  std::string s;
  for (uint32_t id = 0; id < 64; ++id)
    if (auto tr = dtype_traits(id); tr && tr->computable)
      s += (s.empty() ? "" : ", ") + std::string(tr->name);
  return s;
}

void check_computable(const gguf::TensorInfo& t) {
  if (!traits(t.type).computable)
    throw Error("tensor '" + t.name + "' has type " + std::string(dtype_name(t.type)) +
                ", which Tandem cannot compute; re-quantize the model to one of: " + supported_types());
}

}  // namespace

int64_t ArchReader::req_int(std::string_view key) const {
  std::string full = arch_ + "." + std::string(key);
  auto v = file_.get_int(full);
  if (!v) throw Error("model file '" + file_.path() + "' lacks required metadata '" + full + "'");
  if (*v <= 0) throw Error("metadata '" + full + "' must be positive (got " + std::to_string(*v) + ")");
  return *v;
}

int64_t ArchReader::opt_int(std::string_view key, int64_t fallback) const {
  return file_.get_int(arch_ + "." + std::string(key)).value_or(fallback);
}

float ArchReader::opt_float(std::string_view key, float fallback) const {
  return static_cast<float>(file_.get_float(arch_ + "." + std::string(key)).value_or(fallback));
}

bool ArchReader::has(std::string_view key) const {
  return file_.find(arch_ + "." + std::string(key)) != nullptr;
}

MatrixView ArchReader::matrix(const std::string& name, int64_t ne0, int64_t ne1, bool required) const {
  const gguf::TensorInfo* t = file_.tensor(name);
  if (!t) {
    if (required) throw Error("model file '" + file_.path() + "' lacks tensor '" + name + "'");
    return {};
  }
  if (t->n_dims > 2 || t->ne[0] != ne0 || t->ne[1] != ne1)
    throw Error("tensor '" + name + "' has shape " + t->shape_string() + ", expected [" +
                std::to_string(ne0) + ", " + std::to_string(ne1) + "]");
  check_computable(*t);
  MatrixView m;
  m.type = t->type;
  m.cols = ne0;
  m.rows = ne1;
  m.row_bytes = row_bytes(t->type, ne0);
  m.data = t->data;
  return m;
}

VectorView ArchReader::vector(const std::string& name, int64_t n, bool required) const {
  const gguf::TensorInfo* t = file_.tensor(name);
  if (!t) {
    if (required) throw Error("model file '" + file_.path() + "' lacks tensor '" + name + "'");
    return {};
  }
  if (t->elements() != n)
    throw Error("tensor '" + name + "' has shape " + t->shape_string() + ", expected [" + std::to_string(n) +
                "]");
  if (t->type != DType::F32)
    throw Error("tensor '" + name + "' is " + std::string(dtype_name(t->type)) +
                "; norm weights and biases must be F32");
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0)
    throw Error("tensor '" + name + "' is not aligned in the file");
  return {reinterpret_cast<const float*>(t->data), n};
}

void read_common_hparams(const ArchReader& r, Config& c) {
  c.arch = r.arch();
  c.n_embd = r.req_int("embedding_length");
  c.n_layer = r.req_int("block_count");
  c.n_head = r.req_int("attention.head_count");
  c.n_head_kv = r.opt_int("attention.head_count_kv", c.n_head);
  if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0)
    throw Error("attention.head_count (" + std::to_string(c.n_head) +
                ") must be a multiple of head_count_kv (" + std::to_string(c.n_head_kv) + ")");
  if (c.n_embd % c.n_head != 0 && !r.has("attention.key_length"))
    throw Error("embedding_length is not a multiple of head_count and attention.key_length is absent");
  c.head_dim = r.opt_int("attention.key_length", c.n_embd / c.n_head);
  c.head_dim_v = r.opt_int("attention.value_length", c.head_dim);
  c.n_ff = r.req_int("feed_forward_length");
  c.n_ctx_train = r.opt_int("context_length", 2048);
  c.norm_eps = r.opt_float("attention.layer_norm_rms_epsilon", 1e-5f);
  c.n_rot = r.opt_int("rope.dimension_count", c.head_dim);
  if (c.n_rot <= 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0)
    throw Error("rope.dimension_count " + std::to_string(c.n_rot) +
                " must be even and at most the head size " + std::to_string(c.head_dim));
  c.rope_base = r.opt_float("rope.freq_base", 10000.0f);
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const gguf::TensorInfo* embd = r.file().tensor("token_embd.weight");
  if (!embd) throw Error("model file '" + r.file().path() + "' lacks tensor 'token_embd.weight'");
  c.n_vocab = embd->ne[1];
  read_rope_scaling(r, c);
}

void read_rope_scaling(const ArchReader& r, Config& c) {
  std::string type(r.file().get_string(r.arch() + ".rope.scaling.type").value_or("none"));
  float factor = r.opt_float("rope.scaling.factor", r.opt_float("rope.scale_linear", 1.0f));
  if (type == "linear" || (type == "none" && r.has("rope.scale_linear"))) {
    if (!(factor > 0)) throw Error("rope scaling factor must be positive");
    c.rope_linear_scale = 1.0f / factor;
  } else if (type == "yarn" || type == "longrope") {
    throw Error("rope scaling type '" + type + "' is not supported yet");
  }
  const int64_t pairs = c.n_rot / 2;
  if (const gguf::TensorInfo* t = r.file().tensor("rope_freqs.weight")) {
    VectorView v = r.vector("rope_freqs.weight", pairs);
    c.rope_freq_factors.assign(v.data, v.data + pairs);
    (void)t;
  } else if (type == "llama3" || r.has("rope.scaling.low_freq_factor")) {
    // Llama 3 scaling: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    const double low = r.opt_float("rope.scaling.low_freq_factor", 1.0f);
    const double high = r.opt_float("rope.scaling.high_freq_factor", 4.0f);
    const double old_ctx = static_cast<double>(r.opt_int("rope.scaling.original_context_length", 8192));
    const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
    c.rope_freq_factors.resize(static_cast<size_t>(pairs));
    for (int64_t i = 0; i < pairs; ++i) {
      const double freq = std::pow(static_cast<double>(c.rope_base), -2.0 * i / static_cast<double>(c.n_rot));
      const double wavelen = 2 * std::numbers::pi / freq;
      double f;
      if (wavelen < high_wavelen) {
        f = 1;
      } else if (wavelen > low_wavelen) {
        f = factor;
      } else {
        const double smooth = (old_ctx / wavelen - low) / (high - low);
        f = 1.0 / ((1 - smooth) / factor + smooth);
      }
      c.rope_freq_factors[static_cast<size_t>(i)] = static_cast<float>(f);
    }
  }
}

void bind_standard_layers(const ArchReader& r, const Config& c, Weights& w) {
  w.tok_embd = r.matrix("token_embd.weight", c.n_embd, c.n_vocab);
  w.output_norm = r.vector("output_norm.weight", c.n_embd);
  w.output = r.matrix("output.weight", c.n_embd, c.n_vocab, /*required=*/false);
  if (w.output.empty()) w.output = w.tok_embd;  // tied head
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    l.attn_norm = r.vector(p + "attn_norm.weight", c.n_embd);
    l.wq = r.matrix(p + "attn_q.weight", c.n_embd, c.q_dim());
    l.wk = r.matrix(p + "attn_k.weight", c.n_embd, c.kv_dim());
    l.wv = r.matrix(p + "attn_v.weight", c.n_embd, c.v_dim());
    l.wo = r.matrix(p + "attn_output.weight", c.n_head * c.head_dim_v, c.n_embd);
    l.bq = r.vector(p + "attn_q.bias", c.q_dim(), false);
    l.bk = r.vector(p + "attn_k.bias", c.kv_dim(), false);
    l.bv = r.vector(p + "attn_v.bias", c.v_dim(), false);
    l.q_norm = r.vector(p + "attn_q_norm.weight", c.head_dim, c.qk_norm);
    l.k_norm = r.vector(p + "attn_k_norm.weight", c.head_dim, c.qk_norm);
    l.post_attn_norm = r.vector(p + "post_attention_norm.weight", c.n_embd, c.post_norms);
    l.ffn_norm = r.vector(p + "ffn_norm.weight", c.n_embd);
    l.w_gate = r.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff);
    l.w_up = r.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff);
    l.w_down = r.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd);
    l.post_ffn_norm = r.vector(p + "post_ffw_norm.weight", c.n_embd, c.post_norms);
  }
}

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

void repack_layer_weights(const gguf::File& file, Weights& w) {
  for (LayerWeights& l : w.layers)
    for (MatrixView* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) repack(file, *m);
  if (w.output.data != w.tok_embd.data) repack(file, w.output);  // a head of its own (not tied)
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, gguf::LoadMode mode) {
  return from_file(gguf::File::open(path, mode));
}

std::unique_ptr<Model> Model::from_file(gguf::File file) {
  std::unique_ptr<Model> m(new Model(std::move(file)));
  auto arch = m->file_.get_string("general.architecture");
  if (!arch) throw Error("model file '" + m->file_.path() + "' lacks general.architecture");
  std::string known;
  for (const ArchEntry& e : architectures()) {
    if (e.name == *arch) {
      ArchReader reader(m->file_, std::string(*arch));
      e.load(reader, m->config_, m->weights_);
      repack_layer_weights(m->file_, m->weights_);
      return m;
    }
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  if (m->file_.tensors().empty())
    throw Error("'" + m->file_.path() +
                "' holds no tensors (a vocabulary-only file?); it cannot be run as a model");
  throw Error("architecture '" + std::string(*arch) + "' is not supported (supported: " + known + ")");
}

size_t Model::weight_bytes_per_token() const {
  size_t total = weights_.output.bytes() + weights_.tok_embd.row_bytes;
  for (const LayerWeights& l : weights_.layers)
    total += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.w_gate.bytes() + l.w_up.bytes() +
             l.w_down.bytes();
  return total;
}

int64_t Model::quantized_macs_per_token() const {
  auto macs = [](const MatrixView& m) { return kernels::is_quantized_weight(m.type) ? m.rows * m.cols : 0; };
  int64_t total = macs(weights_.output);
  for (const LayerWeights& l : weights_.layers)
    total +=
        macs(l.wq) + macs(l.wk) + macs(l.wv) + macs(l.wo) + macs(l.w_gate) + macs(l.w_up) + macs(l.w_down);
  return total;
}

}  // namespace tandem::model
