#include "tandem/speculative/mtp_draft.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "tandem/speculative/calibration.h"
#include "tandem/util/error.h"

namespace tandem::speculative {
namespace {

constexpr int64_t kChunk = 64;  // real rows per MTP forward when catching up with the target

const model::Model& with_mtp(const model::Model& target) {
  check_has_mtp(target, target.file().path());
  return target;
}

}  // namespace

void check_has_mtp(const model::Model& target, const std::string& path) {
  const model::Config& c = target.config();
  if (c.n_mtp > 0) return;
  throw Error(
      "--draft mtp drafts with the checkpoint's own next-token-prediction (MTP) layers, but '" + path +
      "' (" + c.arch +
      ") has none (no nextn_predict_layers); use --draft ngram, --draft-model FILE or --drafter FILE");
}

MtpDraftSource::MtpDraftSource(const model::Model& target, ThreadPool& pool, int64_t n_ctx, cache::KvType kv)
    : n_ctx_(n_ctx),
      d_(target.config().n_embd),
      forward_(with_mtp(target), pool, kChunk),
      cache_(target.config().mtp_kv_geometry(), std::max<int64_t>(n_ctx, 1), kv, kChunk) {
  if (n_ctx_ < 2) throw Error("the MTP drafter needs a context of at least two positions");
  layers_ = {target.config().n_layer - 1};
  hidden_.assign(static_cast<size_t>(n_ctx_ * d_), 0.0f);
  rows_.resize(static_cast<size_t>(kChunk));
  g_last_.assign(static_cast<size_t>(d_), 0.0f);
  g_in_.assign(static_cast<size_t>(d_), 0.0f);
  logits_.assign(static_cast<size_t>(target.config().n_vocab), 0.0f);
  capture_ = [this](int64_t layer, const float* hidden, int64_t n_rows) {
    if (layer == 0)
      std::memcpy(g_last_.data(), hidden + (n_rows - 1) * d_, static_cast<size_t>(d_) * sizeof(float));
  };
}

void MtpDraftSource::begin(std::span<const int32_t> /*prompt*/, const DraftSettings& settings) {
  sampler_ = sampling::Sampler(settings.sampling);
  sequence_ = settings.sequence_id;
  real_len_ = 0;
  cache_.truncate(0);
}

void MtpDraftSource::on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                                      int64_t first_pos) {
  if (layer != layers_[0]) return;
  for (int64_t r = 0; r < n_rows && first_pos + r < n_ctx_; ++r)
    std::memcpy(hidden_.data() + (first_pos + r) * d_, hidden.data() + r * d_,
                static_cast<size_t>(d_) * sizeof(float));
}

void MtpDraftSource::forward(int64_t first, int64_t n, const float* hidden, const int32_t* next,
                             bool want_logits) {
  for (int64_t i = 0; i < n; ++i) {
    model::Row& row = rows_[static_cast<size_t>(i)];
    row.token = next[i];
    row.pos = first + i;
    row.seq = 0;
    row.logits = want_logits && i == n - 1;
  }
  cache::KvCache* caches[] = {&cache_};
  forward_.run_mtp(0, std::span<const model::Row>(rows_.data(), static_cast<size_t>(n)), hidden, caches,
                   logits_.data(), &capture_);
}

void MtpDraftSource::propose(std::span<const int32_t> committed, int max_depth, Draft& out) {
  out.clear();
  const auto n = static_cast<int64_t>(committed.size());
  // Real rows reach position n - 2 (the target has evaluated every committed token but the last); the draft
  // rows that follow take positions n - 1 .. n + depth - 3.
  const int64_t depth = std::min<int64_t>(max_depth, n_ctx_ - n + 2);
  if (n < 2 || depth < 1) return;
  // The last real row runs in this call (not kept from an earlier one), so that its logits and output
  // hidden state are at hand.
  real_len_ = std::min(real_len_, n - 2);
  while (real_len_ < n - 1) {
    const int64_t rows = std::min(kChunk, n - 1 - real_len_);
    forward(real_len_, rows, hidden_.data() + real_len_ * d_, committed.data() + real_len_ + 1,
            real_len_ + rows == n - 1);
    real_len_ += rows;
  }

  history_.assign(committed.begin(), committed.end());
  const bool sampled = sampler_.params().temperature > 0.0f;
  for (int64_t i = 0; i < depth; ++i) {
    sampling::Distribution& q = out.q_slot(static_cast<size_t>(i));
    sampler_.distribution(logits_, history_, q);
    const int32_t x = sampler_.draw(q, sequence_, static_cast<uint64_t>(n + i), kDrawDraft);
    out.tokens.push_back(x);
    history_.push_back(x);
    // Chained: the MTP layer's own output hidden state stands for the target's at the next position.
    if (i + 1 < depth) {
      g_in_ = g_last_;
      forward(n - 1 + i, 1, g_in_.data(), &x, true);
    }
  }
  out.sampled = sampled;
}

void MtpDraftSource::accept(std::span<const int32_t> /*committed*/, int /*n_accepted*/) {
  // The draft rows past real_len_ are overwritten by the next proposal's forwards (Forward::run_mtp writes
  // from their first position on); the real rows stay.
}

std::string mtp_cost_key(const std::string& target_path) {
  return std::string(kMtpKind) + ":" + file_fingerprint(target_path);
}

double measure_mtp_draft_cost(MtpDraftSource& source, double decode_seconds, int64_t context, int depth,
                              int rounds) {
  return measure_drafting_cost(source, "MTP", source.n_ctx(),
                               static_cast<int64_t>(source.last_logits().size()), decode_seconds, context,
                               depth, rounds);
}

}  // namespace tandem::speculative
