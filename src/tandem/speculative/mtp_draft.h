// The checkpoint's own next-token-prediction (MTP) layer as a draft source (docs/speculative.md, "The MTP
// drafter"): DeepSeek-V3 / GLM style files carry, after their main layers, a block that reads the main
// model's final hidden state at position t (before the output norm) and the embedding of token t + 1 and
// predicts token t + 2 (model/weights.h, MtpWeights). It runs through model::Forward::run_mtp, the main
// model's own block code, over a latent cache of its own.
//
// State per generation: the target's final hidden states by position (captured during its forwards, the
// last main layer's residual output), and the MTP layer's cache. Cache row p is "real" when it was computed
// from the target's hidden state at p and the committed token p + 1; its output predicts token p + 2. A
// proposal brings the real rows up to the last committed position the target has evaluated, then drafts d
// tokens, each further draft (chained, depth > 1) reading the MTP layer's own output hidden state and its
// own drafted token at the next position. Draft rows are overwritten by the next proposal's rows (the
// cache's length follows each forward), as the target's cache drops its rejected rows; real rows are never
// recomputed but the last, whose logits each proposal needs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/cache/kv_cache.h"
#include "tandem/model/forward.h"
#include "tandem/model/model.h"
#include "tandem/sampling/sampler.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/util/thread_pool.h"

namespace tandem::speculative {

inline constexpr const char* kMtpKind = "mtp";

// Throws tandem::Error, saying what to use instead, unless `target` carries MTP layers (`path` names it).
void check_has_mtp(const model::Model& target, const std::string& path);

class MtpDraftSource;

// The calibration key of a target's MTP drafting cost (Calibration::draft_per_token): the kind and the
// target's file_fingerprint().
std::string mtp_cost_key(const std::string& target_path);

// The cost of one drafted token relative to a target decode step of `decode_seconds`: the median over
// `rounds` of a proposal of `depth` tokens (one real row and depth - 1 chained rows, as each round of
// speculation runs) after a context of `context` positions, divided by depth. The source is begun anew and
// left empty.
double measure_mtp_draft_cost(MtpDraftSource& source, double decode_seconds, int64_t context = 64,
                              int depth = 4, int rounds = 7);

class MtpDraftSource final : public DraftSource {
 public:
  // target: a model with MTP layers (Config::n_mtp > 0; the first one drafts), else tandem::Error.
  // n_ctx: the longest sequence (positions) the source will see; kv: its cache's entry type.
  MtpDraftSource(const model::Model& target, ThreadPool& pool, int64_t n_ctx,
                 cache::KvType kv = cache::KvType::kF16);

  std::string_view kind() const override { return kMtpKind; }
  void begin(std::span<const int32_t> prompt, const DraftSettings& settings) override;
  void propose(std::span<const int32_t> committed, int max_depth, Draft& out) override;
  void accept(std::span<const int32_t> committed, int n_accepted) override;
  std::span<const int64_t> target_layers() const override { return layers_; }
  void on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                        int64_t first_pos) override;

  int64_t n_ctx() const { return n_ctx_; }
  // Rows of the MTP layer's cache: real rows and the latest proposal's draft rows.
  int64_t cache_length() const { return cache_.length(); }
  // The MTP logits of the last row the latest proposal ran (the last draft's distribution), [n_vocab].
  std::span<const float> last_logits() const { return logits_; }

 private:
  // Runs n rows at positions first .. first + n - 1, row i reading hidden [n, d] row i and token
  // next[i]; leaves the last row's output hidden state in g_last_ and, when want_logits, its logits in
  // logits_.
  void forward(int64_t first, int64_t n, const float* hidden, const int32_t* next, bool want_logits);

  int64_t n_ctx_, d_;
  model::Forward forward_;
  cache::KvCache cache_;
  std::vector<int64_t> layers_;  // {n_layer - 1}: the last main layer's residual output
  sampling::Sampler sampler_{sampling::Params{}};
  uint64_t sequence_ = 0;
  int64_t real_len_ = 0;       // rows computed from the target's hidden states: positions 0 .. real_len_ - 1
  std::vector<float> hidden_;  // [n_ctx, d] the target's final hidden states by position
  std::vector<model::Row> rows_;  // [chunk]
  std::vector<float> g_last_;     // [d]
  std::vector<float> g_in_;       // [d] a chained step's input: the previous step's g_last_
  std::vector<float> logits_;     // [n_vocab]
  model::CaptureFn capture_;      // keeps the block output of a forward's last row in g_last_
  std::vector<int32_t> history_;
};

}  // namespace tandem::speculative
