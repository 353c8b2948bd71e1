// Reading a latent-attention layer's tensor views from GGUF (mla.h). Apart from the computation in
// mla.cpp, so that loading alone (the fuzzer's target) links without the kernels.
#include <string>
#include <vector>

#include "tandem/model/mla.h"
#include "tandem/util/error.h"

namespace tandem::model {

namespace {

// A split up-projection tensor: per head `rows` rows of `cols`, as the converter writes it ({cols, rows,
// n_head}) or flattened to two dimensions ({cols, n_head * rows}); one matrix of all the heads' rows either
// way (the heads' matrices follow one another in the file).
MatrixView per_head_rows(const ArchReader& r, const std::string& name, int64_t cols, int64_t rows,
                         int64_t n_head) {
  const gguf::TensorInfo* t = r.file().tensor(name);
  if (t && t->n_dims <= 2 && n_head > 1) return r.matrix(name, cols, n_head * rows);
  const std::vector<MatrixView> heads = r.matrices(name, cols, rows, n_head);
  MatrixView m = heads.front();
  m.rows = n_head * rows;
  return m;
}

}  // namespace

void bind_mla_layer(const ArchReader& r, const Config& c, int64_t layer, MlaWeights& w) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  const int64_t q_width = c.n_head * c.head_dim;
  if (c.mla.q_lora_rank > 0) {
    w.wq_a = r.matrix(p + "attn_q_a.weight", c.n_embd, c.mla.q_lora_rank);
    w.q_a_norm = r.vector(p + "attn_q_a_norm.weight", c.mla.q_lora_rank);
    w.wq_b = r.matrix(p + "attn_q_b.weight", c.mla.q_lora_rank, q_width);
  } else {
    w.wq = r.matrix(p + "attn_q.weight", c.n_embd, q_width);
  }
  w.wkv_a = r.matrix(p + "attn_kv_a_mqa.weight", c.n_embd, c.mla.kv_lora_rank + c.n_rot);
  w.kv_a_norm = r.vector(p + "attn_kv_a_norm.weight", c.mla.kv_lora_rank);
  const int64_t nope = c.head_dim - c.n_rot, L = c.mla.kv_lora_rank;
  const std::string joined = p + "attn_kv_b.weight", keys = p + "attn_k_b.weight",
                    values = p + "attn_v_b.weight";
  const bool has_keys = r.has_tensor(keys), has_values = r.has_tensor(values);
  if (!has_keys && !has_values) {
    if (!r.has_tensor(joined))
      throw Error("model file '" + r.file().path() + "' lacks tensor '" + joined + "' (or its split form, '" +
                  keys + "' and '" + values + "')");
    w.wkv_b = r.matrix(joined, L, c.n_head * (nope + c.head_dim_v));
    return;
  }
  if (!has_keys || !has_values)
    throw Error("model file '" + r.file().path() + "' holds tensor '" + (has_keys ? keys : values) +
                "' but not '" + (has_keys ? values : keys) + "'; a split up-projection needs both");
  w.wk_b = per_head_rows(r, keys, nope, L, c.n_head);
  w.wv_b = per_head_rows(r, values, L, c.head_dim_v, c.n_head);
  // A file may hold attn_kv_b beside the split tensors (converters that keep it for a non-absorbed path). The
  // split ones are used: they are what the reference multiplies in the absorbed form this engine runs, and,
  // when quantized, they were quantized along the dimension each product runs over. attn_kv_b is still
  // checked (and so not refused as unused) but not read.
  r.matrix(joined, L, c.n_head * (nope + c.head_dim_v), /*required=*/false);
}

}  // namespace tandem::model
