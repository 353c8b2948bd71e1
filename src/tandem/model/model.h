// A loaded checkpoint: its configuration, its weights (views into the mapped file) and the file itself.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/model/config.h"
#include "tandem/model/weights.h"

namespace tandem::model {

class Model {
 public:
  // Brings the file into memory (mapped or copied: gguf::LoadMode), reads the architecture named by
  // general.architecture and binds every weight. Throws tandem::Error for an unknown architecture, a missing
  // or misshapen tensor, or an unsupported type.
  static std::unique_ptr<Model> load(const std::string& path, gguf::LoadMode mode = gguf::LoadMode::kAuto);
  static std::unique_ptr<Model> from_file(gguf::File file);

  const Config& config() const { return config_; }
  const Weights& weights() const { return weights_; }
  const gguf::File& file() const { return file_; }
  // Bytes of weights read by one decode step (every matrix once, plus one embedding row; of a layer's routed
  // experts, the n_expert_used a token chooses).
  size_t weight_bytes_per_token() const;
  // Multiply-adds of one token's matrix products with quantized weights (rows times columns of each), the
  // work kernels::measure_dot_peak bounds.
  int64_t quantized_macs_per_token() const;

 private:
  explicit Model(gguf::File file) : file_(std::move(file)) {}
  gguf::File file_;
  Config config_;
  Weights weights_;
  std::vector<float> channel_minor_;  // the recurrent layers' ssm_conv_t and ssm_a_t (weights.h)
  std::vector<uint8_t> mla_copies_;   // the latent attention layers' wk_t and wv (weights.h)
};

// What an architecture file uses to read metadata and bind tensors with checked shapes. Metadata of the
// wrong GGUF type (a bool or a float where an integer belongs, a string where a number does) is refused by
// the getters; values out of their valid range are refused naming the key and the range.
class ArchReader {
 public:
  ArchReader(const gguf::File& file, std::string arch);
  const gguf::File& file() const { return file_; }
  const std::string& arch() const { return arch_; }

  // "{arch}.{key}" metadata, required or with a default.
  int64_t req_int(std::string_view key) const;
  int64_t opt_int(std::string_view key, int64_t fallback) const;
  // An integer in [lo, hi]; `fallback` when absent (required when there is none).
  int64_t int_in(std::string_view key, int64_t lo, int64_t hi, std::optional<int64_t> fallback) const;
  float opt_float(std::string_view key, float fallback) const;
  // A finite number greater than zero (NaN, infinities, zero and negatives are refused); `fallback` when
  // absent.
  float positive_float(std::string_view key, float fallback) const;
  bool has(std::string_view key) const;

  // Tensors by name; shapes are {ne0, ne1}. Required ones throw when absent; optional ones return empty
  // views. Each tensor bound is recorded, so that the loader can refuse files holding tensors nothing uses.
  MatrixView matrix(const std::string& name, int64_t ne0, int64_t ne1, bool required = true) const;
  VectorView vector(const std::string& name, int64_t n, bool required = true) const;
  // A stacked 3-D tensor {ne0, ne1, count} (a layer's experts) as `count` matrices {ne0, ne1}.
  std::vector<MatrixView> matrices(const std::string& name, int64_t ne0, int64_t ne1, int64_t count,
                                   bool required = true) const;
  bool has_tensor(const std::string& name) const { return file_.tensor(name) != nullptr; }
  // The first tensor of the file no matrix() or vector() call has bound; nullptr when all are.
  const gguf::TensorInfo* first_unbound() const;

 private:
  const gguf::TensorInfo* bind(const std::string& name, bool required) const;

  const gguf::File& file_;
  std::string arch_;
  mutable std::vector<uint8_t> bound_;  // [file tensors], 1 once bound
};

// The architecture families, each defined in its own file (arch_*.cpp): fill the config and bind the weights.
using ArchLoadFn = void (*)(const ArchReader& reader, Config& config, Weights& weights);
struct ArchEntry {
  std::string_view name;
  ArchLoadFn load;
};
// The known architectures, in registry.cpp.
const std::vector<ArchEntry>& architectures();

// Reads the architecture named by general.architecture, fills `config` and binds `weights` to the file's
// tensors in the file's own form (Model::from_file then repacks), checking that the file is consistent: a
// tandem::Error names the key or tensor that is not. Used alone where weights are not computed with
// (fuzzing).
void bind_model(const gguf::File& file, Config& config, Weights& weights);

// The architecture name, width, vocabulary (from token_embd.weight) and block_count, checked against the
// file's tensors: shared by every family whose layers are all blk.N blocks of the main forward.
void read_embedding_and_blocks(const ArchReader& r, Config& c);
// Shared by the llama-like families: hyperparameters common to all of them and the standard tensor names.
void read_common_hparams(const ArchReader& r, Config& c);
void bind_standard_layers(const ArchReader& r, const Config& c, Weights& w);
// Refuses a block_count that differs from the number of blk.N layers the file holds.
void check_layer_count(const ArchReader& r, const Config& c);
// Rope frequency factors from a rope_freqs tensor or from Llama 3 scaling metadata (empty when neither).
void read_rope_scaling(const ArchReader& r, Config& c);

}  // namespace tandem::model
