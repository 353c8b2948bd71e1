// The EAGLE-3-style draft source (docs/speculative.md, "Drafters that read the target"): the drafter layer of
// train/eagle.h run for inference, reading the target's hidden states at its tap layers.
//
// State per generation: the taps of every position the target evaluated (captured during its forwards), and
// the drafter's own KV cache. Cache row p is "real" when it was computed from the target's taps at p and the
// committed token p + 1; its output predicts token p + 2. A proposal brings the real rows up to the last
// committed position the target has evaluated, then drafts greedily (or samples) d tokens, each further
// draft reading the drafter's own output hidden state in place of the taps it does not have. The draft rows
// are dropped again when the round settles, as the target's cache drops its rejected rows; real rows are
// never recomputed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/model/model.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/speculative/tap_store.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/eagle.h"
#include "tandem/util/thread_pool.h"

namespace tandem::speculative {

inline constexpr const char* kEagleKind = "eagle3";

// Names a target's vocabulary: FNV-1a 64 of its tokenizer.ggml.tokens (each token and a 0 byte), in hex.
std::string vocabulary_hash(const gguf::File& file);

// The tap layers for a target of n_layer decoder layers: low, middle and high (2, n_layer / 2, n_layer - 3),
// clamped to the model; where those collide (models of fewer than 8 layers), 1, n_layer / 2 and n_layer - 1
// instead, and duplicates dropped.
std::vector<int32_t> default_eagle_taps(int64_t n_layer);

// The drafter's shape for `target` (its width, attention heads and FFN width) with n_taps tap layers.
train::EagleConfig eagle_config_for(const model::Model& target, int64_t n_taps);
// The shape a checkpoint records; throws tandem::Error when it is not an EAGLE-3 drafter.
train::EagleConfig eagle_config_of(const train::DrafterInfo& info);
// Records config's shape in info.
void set_eagle_shape(train::DrafterInfo& info, const train::EagleConfig& config);

// Copies the target's tensor `name` ([dst.rows, dst.cols]; output.weight falls back to the tied
// token_embd.weight) into dst, dequantized to f32. Throws tandem::Error when the target has no such tensor.
void copy_target_matrix(const model::Model& target, const char* name, train::Param& dst);

// Copies the target's token embedding (and, unless the drafter trains its own, its output head) into the
// drafter's frozen parameters, dequantized to f32.
void copy_target_weights(const model::Model& target, train::EagleDrafter& drafter);

// Throws tandem::Error unless the drafter was made for this target, saying which of the file hash, the
// vocabulary or the tap layers (and width) differs.
void check_eagle_target(const train::DrafterInfo& info, const model::Model& target,
                        const std::string& target_file_hash);

class EagleDraftSource;

// The calibration key of a drafter file's drafting cost (Calibration::draft_per_token): its kind and
// file_fingerprint(), so that each drafter, and no draft model, is charged its own measured cost.
std::string eagle_cost_key(const std::string& drafter_path);

// The cost of one drafted token relative to a target decode step of `decode_seconds`: the median over
// `rounds` of a proposal of `depth` tokens (one real row and depth - 1 draft rows, as each round of
// speculation runs) after a context of `context` positions, divided by depth. The source is begun anew
// and left empty.
double measure_eagle_draft_cost(EagleDraftSource& source, double decode_seconds, int64_t context = 64,
                                int depth = 6, int rounds = 7);

class EagleDraftSource final : public DraftSource {
 public:
  // drafter: trained or loaded, its frozen weights set; taps: the target layers it reads, in training order.
  // n_ctx: the longest sequence (positions) the source will see.
  EagleDraftSource(std::unique_ptr<train::EagleDrafter> drafter, std::vector<int32_t> taps, ThreadPool& pool,
                   int64_t n_ctx);

  // Loads a checkpoint written by `tandem train-drafter`, refusing one made for another target.
  static std::unique_ptr<EagleDraftSource> load(const std::string& path, const model::Model& target,
                                                const std::string& target_file_hash, ThreadPool& pool,
                                                int64_t n_ctx);

  std::string_view kind() const override { return kEagleKind; }
  void begin(std::span<const int32_t> prompt, const DraftSettings& settings) override;
  void propose(std::span<const int32_t> committed, int max_depth, Draft& out) override;
  void accept(std::span<const int32_t> committed, int n_accepted) override;
  std::span<const int64_t> target_layers() const override { return taps_.target_layers(); }
  void on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                        int64_t first_pos) override;

  // Sets the captured taps of rows at positions first_pos .. (rows [n, n_taps * d], the tap layers side by
  // side in order), as on_target_hidden would from a target forward.
  void set_taps(int64_t first_pos, std::span<const float> rows);
  train::EagleDrafter& drafter() { return *drafter_; }
  std::span<const int32_t> taps() const { return taps_.layers(); }
  // The captured taps (rows past the committed text are forgotten when a round settles).
  const TapStore& tap_store() const { return taps_; }
  int64_t n_ctx() const { return n_ctx_; }

  // The output hidden state (before the final norm) of the last row the latest proposal ran, [d].
  std::span<const float> last_hidden() const { return g_last_; }
  // Rows of the drafter's KV cache (real rows and the current proposal's draft rows).
  int64_t cache_length() const { return len_; }
  // The cached keys of rows [0, cache_length()), [cache_length(), n_kv_head * head_dim].
  std::span<const float> cached_keys() const { return {k_.data(), static_cast<size_t>(len_ * kv_width_)}; }

 private:
  // Runs n rows at positions len_ .. len_ + n - 1 (each reading taps_ there, or given_g [n, d] when not
  // null), appending their keys and values; leaves the last row's output hidden state in g_last_ and, when
  // want_logits, its logits in logits_.
  void forward(int64_t n, const float* given_g, const int32_t* next_ids, bool want_logits);
  // Causal attention of n rows of roped queries q [n, n_head * head_dim] over cache rows 0 .. len_ + i
  // (row i), into att_.
  void attend(const float* q, const float* k_cache, const float* v_cache, int64_t n);

  // A plain decoder layer after the first (train::EagleDrafter's blk.N, N >= 1): its weights, borrowed,
  // and its cache, [n_ctx, n_kv_head * head_dim] each.
  struct PlainLayer {
    const train::Param *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w_gate, *w_up, *w_down;
    std::vector<float> k, v;
  };

  std::unique_ptr<train::EagleDrafter> drafter_;
  train::EagleConfig cfg_;
  train::Compute compute_;
  int64_t n_ctx_;
  int64_t kv_width_;
  sampling::Sampler sampler_{sampling::Params{}};
  uint64_t sequence_ = 0;

  // Weights, borrowed from drafter_.
  const train::Param *fc_, *emb_, *emb_norm_, *hidden_norm_, *wq_, *wk_, *wv_, *wo_, *ffn_norm_, *w_gate_,
      *w_up_, *w_down_, *out_norm_, *head_;

  TapStore taps_;             // [n_ctx, n_taps * d] the target's captured taps by position
  std::vector<float> k_, v_;  // [n_ctx, n_kv_head * head_dim] the first layer's cache, roped keys
  std::vector<PlainLayer> plain_;
  int64_t len_ = 0;           // rows in the cache
  int64_t real_len_ = 0;      // rows computed from the target's taps: positions 0 .. real_len_ - 1
  std::vector<int32_t> pos_;  // [chunk]
  std::vector<float> g_, e_, ne_, ng_, u_, q_, att_, h1_, n2_, gate_, up_, act_, h2_, f_;  // [chunk, width]
  std::vector<float> inv_, scores_;                                                        // [chunk], [n_ctx]
  std::vector<float> g_last_;                                                              // [d]
  std::vector<float> logits_;                                                              // [vocab]
  std::vector<int32_t> history_;
};

}  // namespace tandem::speculative
