// Reading a checkpoint's metadata into a Config and binding its tensors, with the checks that make a
// consistent file the only kind that loads: every hyperparameter of the expected GGUF type and in its valid
// range, block_count equal to the layers the tensors hold, every tensor of the expected shape and type, every
// tensor used, and a vocabulary as long as the embedding. No allocation is sized by a metadata number before
// that number is checked against the tensors the file holds.
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <optional>
#include <string>

#include "tandem/model/model.h"
#include "tandem/util/error.h"

namespace tandem::model {
namespace {

// Generous bounds on the per-head hyperparameters: real models stay far below them, and they keep products
// such as n_head * head_dim far from overflow before the tensors confirm them.
constexpr int64_t kMaxHeads = int64_t{1} << 16;
constexpr int64_t kMaxHeadDim = int64_t{1} << 16;
constexpr int64_t kMaxContext = std::numeric_limits<int32_t>::max();

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

std::string number(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "+inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

// The layer a "blk.N...." tensor belongs to, or -1 for other names (and indices too long to be real).
int64_t layer_of(std::string_view name) {
  if (!name.starts_with("blk.")) return -1;
  int64_t n = 0;
  size_t i = 4;
  for (; i < name.size() && i < 4 + 12 && name[i] >= '0' && name[i] <= '9'; ++i) n = n * 10 + (name[i] - '0');
  if (i == 4 || i >= name.size() || name[i] != '.') return -1;
  return n;
}

}  // namespace

// block_count against the blk.N tensors present, before anything is sized by it.
void check_layer_count(const ArchReader& r, const Config& c) {
  int64_t present = 0;
  const gguf::TensorInfo* last = nullptr;
  for (const gguf::TensorInfo& t : r.file().tensors()) {
    const int64_t layer = layer_of(t.name);
    if (layer >= c.n_layer)
      throw Error("metadata '" + r.arch() + ".block_count' is " + std::to_string(c.n_layer) +
                  ", but the file holds tensor '" + t.name + "' of layer " + std::to_string(layer) +
                  "; block_count must be the number of blk.N layers");
    if (layer + 1 > present) {
      present = layer + 1;
      last = &t;
    }
  }
  if (present < c.n_layer)
    throw Error("metadata '" + r.arch() + ".block_count' is " + std::to_string(c.n_layer) +
                ", but the file holds tensors for " + std::to_string(present) + " layers" +
                (last ? " (the last is '" + last->name + "')" : std::string()) +
                "; block_count must be the number of blk.N layers");
}

ArchReader::ArchReader(const gguf::File& file, std::string arch)
    : file_(file), arch_(std::move(arch)), bound_(file.tensors().size(), 0) {}

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

int64_t ArchReader::int_in(std::string_view key, int64_t lo, int64_t hi,
                           std::optional<int64_t> fallback) const {
  const std::string full = arch_ + "." + std::string(key);
  std::optional<int64_t> v = file_.get_int(full);
  if (!v && !fallback)
    throw Error("model file '" + file_.path() + "' lacks required metadata '" + full + "'");
  if (!v) return *fallback;
  if (*v < lo || *v > hi)
    throw Error("metadata '" + full + "' is " + std::to_string(*v) + ", expected " + std::to_string(lo) +
                " to " + std::to_string(hi));
  return *v;
}

float ArchReader::opt_float(std::string_view key, float fallback) const {
  return static_cast<float>(file_.get_float(arch_ + "." + std::string(key)).value_or(fallback));
}

float ArchReader::positive_float(std::string_view key, float fallback) const {
  const std::string full = arch_ + "." + std::string(key);
  const std::optional<double> v = file_.get_float(full);
  if (!v) return fallback;
  const auto f = static_cast<float>(*v);
  if (!(f > 0) || !std::isfinite(f))
    throw Error("metadata '" + full + "' is " + number(*v) + ", expected a finite number greater than 0");
  return f;
}

bool ArchReader::has(std::string_view key) const {
  return file_.find(arch_ + "." + std::string(key)) != nullptr;
}

const gguf::TensorInfo* ArchReader::bind(const std::string& name, bool required) const {
  const gguf::TensorInfo* t = file_.tensor(name);
  if (!t) {
    if (required) throw Error("model file '" + file_.path() + "' lacks tensor '" + name + "'");
    return nullptr;
  }
  bound_[static_cast<size_t>(t - file_.tensors().data())] = 1;
  return t;
}

const gguf::TensorInfo* ArchReader::first_unbound() const {
  for (size_t k = 0; k < bound_.size(); ++k)
    if (!bound_[k]) return &file_.tensors()[k];
  return nullptr;
}

MatrixView ArchReader::matrix(const std::string& name, int64_t ne0, int64_t ne1, bool required) const {
  const gguf::TensorInfo* t = bind(name, required);
  if (!t) return {};
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

std::vector<MatrixView> ArchReader::matrices(const std::string& name, int64_t ne0, int64_t ne1, int64_t count,
                                             bool required) const {
  const gguf::TensorInfo* t = bind(name, required);
  if (!t) return {};
  if (t->n_dims > 3 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != count)
    throw Error("tensor '" + name + "' has shape " + t->shape_string() + ", expected [" +
                std::to_string(ne0) + ", " + std::to_string(ne1) + ", " + std::to_string(count) + "]");
  check_computable(*t);
  std::vector<MatrixView> out(static_cast<size_t>(count));
  for (int64_t e = 0; e < count; ++e) {
    MatrixView& m = out[static_cast<size_t>(e)];
    m.type = t->type;
    m.cols = ne0;
    m.rows = ne1;
    m.row_bytes = row_bytes(t->type, ne0);
    m.data = t->data + static_cast<size_t>(e) * m.bytes();
  }
  return out;
}

VectorView ArchReader::vector(const std::string& name, int64_t n, bool required) const {
  const gguf::TensorInfo* t = bind(name, required);
  if (!t) return {};
  if (t->ne[0] != n || t->elements() != n)
    throw Error("tensor '" + name + "' has shape " + t->shape_string() + ", expected [" + std::to_string(n) +
                "]");
  if (t->type != DType::F32)
    throw Error("tensor '" + name + "' is " + std::string(dtype_name(t->type)) +
                "; norm weights and biases must be F32");
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0)
    throw Error("tensor '" + name + "' is not aligned in the file");
  return {reinterpret_cast<const float*>(t->data), n};
}

void read_embedding_and_blocks(const ArchReader& r, Config& c) {
  c.arch = r.arch();
  const gguf::TensorInfo* embd = r.file().tensor("token_embd.weight");
  if (!embd) throw Error("model file '" + r.file().path() + "' lacks tensor 'token_embd.weight'");
  c.n_embd = r.req_int("embedding_length");
  if (c.n_embd != embd->ne[0])
    throw Error("metadata '" + r.arch() + ".embedding_length' is " + std::to_string(c.n_embd) +
                ", but tensor 'token_embd.weight' has shape " + embd->shape_string() + " (rows of " +
                std::to_string(embd->ne[0]) + ")");
  c.n_vocab = embd->ne[1];
  // Every layer holds several tensors: a count past the file's tensors is refused before anything is sized
  // by it (the layers' binding then requires the exact number).
  const auto n_tensors = static_cast<int64_t>(r.file().tensors().size());
  c.n_layer = r.int_in("block_count", 1, std::numeric_limits<int32_t>::max(), std::nullopt);
  if (c.n_layer > n_tensors)
    throw Error("metadata '" + r.arch() + ".block_count' is " + std::to_string(c.n_layer) +
                ", but the file holds only " + std::to_string(n_tensors) +
                " tensors; block_count must be the number of blk.N layers");
}

void read_common_hparams(const ArchReader& r, Config& c) {
  read_embedding_and_blocks(r, c);
  c.n_head = r.int_in("attention.head_count", 1, kMaxHeads, std::nullopt);
  c.n_head_kv = r.int_in("attention.head_count_kv", 1, c.n_head, c.n_head);
  if (c.n_head % c.n_head_kv != 0)
    throw Error("attention.head_count (" + std::to_string(c.n_head) +
                ") must be a multiple of head_count_kv (" + std::to_string(c.n_head_kv) + ")");
  if (c.n_embd % c.n_head != 0 && !r.has("attention.key_length"))
    throw Error("embedding_length is not a multiple of head_count and attention.key_length is absent");
  c.head_dim = r.int_in("attention.key_length", 1, kMaxHeadDim, std::max<int64_t>(1, c.n_embd / c.n_head));
  c.head_dim_v = r.int_in("attention.value_length", 1, kMaxHeadDim, c.head_dim);
  c.n_ff = r.req_int("feed_forward_length");
  c.n_ctx_train = r.int_in("context_length", 1, kMaxContext, 2048);
  c.norm_eps = r.positive_float("attention.layer_norm_rms_epsilon", 1e-5f);
  c.n_rot = r.opt_int("rope.dimension_count", c.head_dim);
  if (c.n_rot <= 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0)
    throw Error("rope.dimension_count " + std::to_string(c.n_rot) +
                " must be even and at most the head size " + std::to_string(c.head_dim));
  c.rope_base = r.positive_float("rope.freq_base", 10000.0f);
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  read_rope_scaling(r, c);
}

void read_rope_scaling(const ArchReader& r, Config& c) {
  std::string type(r.file().get_string(r.arch() + ".rope.scaling.type").value_or("none"));
  const char* factor_key = r.has("rope.scaling.factor") ? "rope.scaling.factor" : "rope.scale_linear";
  const float factor = r.positive_float(factor_key, 1.0f);
  if (type == "linear" || (type == "none" && r.has("rope.scale_linear"))) {
    c.rope_linear_scale = 1.0f / factor;
  } else if (type == "yarn" || type == "longrope") {
    throw Error("rope scaling type '" + type + "' is not supported yet");
  }
  const int64_t pairs = c.n_rot / 2;
  if (r.has_tensor("rope_freqs.weight")) {
    VectorView v = r.vector("rope_freqs.weight", pairs);
    c.rope_freq_factors.assign(v.data, v.data + pairs);
  } else if (type == "llama3" || r.has("rope.scaling.low_freq_factor")) {
    // Llama 3 scaling: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    const double low = r.positive_float("rope.scaling.low_freq_factor", 1.0f);
    const double high = r.positive_float("rope.scaling.high_freq_factor", 4.0f);
    if (!(high > low))
      throw Error("metadata '" + r.arch() + ".rope.scaling.high_freq_factor' (" + number(high) +
                  ") must be greater than rope.scaling.low_freq_factor (" + number(low) + ")");
    const double old_ctx =
        static_cast<double>(r.int_in("rope.scaling.original_context_length", 1, kMaxContext, 8192));
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
  check_layer_count(r, c);
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
    if (!c.moe_layer(i)) {  // MoE layers' experts are bound by their family (model/moe.h)
      l.w_gate = r.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff);
      l.w_up = r.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff);
      l.w_down = r.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd);
    }
    l.post_ffn_norm = r.vector(p + "post_ffw_norm.weight", c.n_embd, c.post_norms);
  }
}

void bind_model(const gguf::File& file, Config& config, Weights& weights) {
  auto arch = file.get_string("general.architecture");
  if (!arch) throw Error("model file '" + file.path() + "' lacks general.architecture");
  const ArchEntry* entry = nullptr;
  std::string known;
  for (const ArchEntry& e : architectures()) {
    if (e.name == *arch) entry = &e;
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  if (!entry) {
    if (file.tensors().empty())
      throw Error("'" + file.path() +
                  "' holds no tensors (a vocabulary-only file?); it cannot be run as a model");
    throw Error("architecture '" + std::string(*arch) + "' is not supported (supported: " + known + ")");
  }
  ArchReader reader(file, std::string(*arch));
  entry->load(reader, config, weights);
  if (const gguf::TensorInfo* t = reader.first_unbound())
    throw Error("model file '" + file.path() + "' holds tensor '" + t->name + "' " + t->shape_string() +
                ", which a " + std::string(*arch) + " model with block_count " +
                std::to_string(config.n_layer + config.n_mtp) + " does not use; the file is inconsistent");
  // A token id indexes both the vocabulary and the embedding rows: they must be the same length.
  if (file.find("tokenizer.ggml.tokens")) {
    const size_t n_tokens = file.get_strings("tokenizer.ggml.tokens").size();
    if (n_tokens != static_cast<size_t>(config.n_vocab))
      throw Error("metadata 'tokenizer.ggml.tokens' holds " + std::to_string(n_tokens) +
                  " tokens, but tensor 'token_embd.weight' has " + std::to_string(config.n_vocab) +
                  " rows; the vocabulary and the embedding must be the same length");
  }
}

}  // namespace tandem::model
