#include "tandem/speculative/dflash_train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "tandem/model/session.h"
#include "tandem/speculative/eagle_draft.h"
#include "tandem/tensor/fp16.h"
#include "tandem/train/optimizer.h"
#include "tandem/util/error.h"

namespace tandem::speculative {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One step's batch: the whole sequence as context and blocks at distinct random anchors a in [1, n - 1],
// block row k at position a + k learning the target's distribution there (for token a + k + 1); rows past
// the sequence's last distribution count for nothing. The sequence's f16 taps and distributions are widened
// to f32 here, once per step.
class BlockBatch {
 public:
  BlockBatch(int64_t max_n, int64_t max_anchors, int64_t block, int64_t width, int64_t k, int64_t vocab,
             std::span<const int32_t> draft_vocab, double gamma)
      : block_(block), targets_(max_anchors * block, k, vocab, draft_vocab) {
    const auto R = static_cast<size_t>(max_anchors * block);
    taps_.resize(static_cast<size_t>(max_n * width));
    ctx_pos_.resize(static_cast<size_t>(max_n));
    std::iota(ctx_pos_.begin(), ctx_pos_.end(), 0);
    order_.resize(static_cast<size_t>(max_n));
    ids_.assign(R, 0);
    pos_.assign(R, 0);
    visible_.assign(static_cast<size_t>(max_anchors), 0);
    weight_.resize(R);
    for (size_t r = 0; r < R; ++r)
      weight_[r] =
          static_cast<float>(std::exp(-static_cast<double>(static_cast<int64_t>(r) % block) / gamma));
    mask_.assign(R, 0);
  }

  train::DflashBatch set(const DrafterSequence& s, int64_t max_anchors, uint64_t& rng) {
    const int64_t n = s.n(), A = std::min(max_anchors, n - 1), B = block_;
    for (size_t i = 0; i < s.taps.size(); ++i) taps_[i] = fp16_to_f32(s.taps[i]);
    // A distinct anchors: the first A of a seeded shuffle of 1 .. n - 1.
    for (int64_t i = 0; i < n - 1; ++i) order_[static_cast<size_t>(i)] = i + 1;
    for (int64_t i = 0; i < A; ++i)
      std::swap(order_[static_cast<size_t>(i)],
                order_[static_cast<size_t>(
                    i + static_cast<int64_t>(next_random(rng) % static_cast<uint64_t>(n - 1 - i)))]);
    for (int64_t b = 0; b < A; ++b) {
      const int64_t a = order_[static_cast<size_t>(b)];
      visible_[static_cast<size_t>(b)] = a;
      ids_[static_cast<size_t>(b * B)] = s.tokens[static_cast<size_t>(a)];
      for (int64_t j = 0; j < B; ++j) {
        const auto r = static_cast<size_t>(b * B + j);
        const int64_t p = a + j;
        pos_[r] = static_cast<int32_t>(p);
        mask_[r] = p < n ? 1 : 0;
        targets_.set(static_cast<int64_t>(r), s, std::min(p, n - 1));
      }
    }
    train::DflashBatch batch;
    batch.context_rows = n;
    batch.taps = taps_.data();
    batch.context_pos = ctx_pos_.data();
    batch.rows = A * B;
    batch.block_ids = ids_.data();
    batch.block_pos = pos_.data();
    batch.context_visible = visible_.data();
    batch.targets = targets_.view(A * B, weight_.data(), mask_.data());
    return batch;
  }

 private:
  int64_t block_;
  TargetRows targets_;
  std::vector<int32_t> ctx_pos_, ids_, pos_;
  std::vector<int64_t> order_, visible_;
  std::vector<float> taps_, weight_;
  std::vector<uint8_t> mask_;
};

}  // namespace

DflashTrainResult train_dflash(const model::Model& target, ThreadPool& pool, const DflashTrainOptions& o) {
  if (o.steps < 0 || o.block < 1 || o.layers < 1 || o.anchors < 1 || !(o.gamma > 0))
    throw Error(
        "train-drafter: --steps must not be negative; --block, --layers and --anchors must be positive, "
        "--gamma above 0");
  DflashTrainResult res;
  const model::Config& mc = target.config();
  const std::vector<int32_t> taps = default_eagle_taps(mc.n_layer);
  const int64_t V = mc.n_vocab;
  model::SessionOptions so;
  so.kv_type = cache::KvType::kF32;
  model::Session session(target, pool, so);
  const DrafterData data = make_drafter_data(session, taps, o.data, o.on_progress);
  res.generate_seconds = data.generate_seconds;
  res.capture_seconds = data.capture_seconds;
  res.train_tokens = data.train_tokens;
  res.heldout_tokens = data.heldout_tokens;
  const std::vector<const DrafterSequence*> train_set = data.training();

  train::DflashConfig cfg = dflash_config_for(target, static_cast<int64_t>(taps.size()), o.layers, o.block);
  cfg.draft_vocab = select_draft_vocab(data, draft_vocab_size(o.draft_vocab, V), V, o.data.is_eog);
  const int64_t max_anchors = std::min(o.anchors, data.max_n - 1);
  auto drafter = std::make_unique<train::DflashDrafter>(cfg, data.max_n, max_anchors * o.block);
  drafter->init(o.seed);
  copy_target_weights(target, *drafter);
  std::vector<train::Param*> params = drafter->params();
  train::AdamWConfig ac;
  ac.weight_decay = 0.01;
  train::AdamW opt(params, ac);
  train::LrSchedule lr;
  lr.peak = o.lr;
  lr.floor = o.lr * 0.05;
  lr.warmup = std::min<int64_t>(50, std::max<int64_t>(1, o.steps / 25));
  lr.total = std::max<int64_t>(1, o.steps);
  train::Compute c(pool);
  BlockBatch batch(data.max_n, max_anchors, o.block, cfg.n_taps * cfg.d, data.k, V, cfg.draft_vocab, o.gamma);
  uint64_t rng = o.seed ^ 0xdf1a5bull;
  double recent = 0;
  int64_t trained_rows = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < o.steps; ++step) {
    const DrafterSequence& s = *train_set[next_random(rng) % train_set.size()];
    const train::DflashBatch b = batch.set(s, max_anchors, rng);
    drafter->zero_grad();
    const train::LossStats st = drafter->forward_backward(b, c, true);
    train::clip_grad_norm(params, o.clip);
    opt.step(lr.at(step));
    recent = step == 0 ? st.loss : 0.95 * recent + 0.05 * st.loss;
    trained_rows += st.counted;
    if (o.on_progress) {
      DrafterTrainProgress p;
      p.phase = "train";
      p.done = step + 1;
      p.total = o.steps;
      p.tokens = trained_rows;
      p.loss = recent;
      p.eta_seconds =
          seconds_since(t0) / static_cast<double>(step + 1) * static_cast<double>(o.steps - step - 1);
      o.on_progress(p);
    }
  }
  res.train_seconds = seconds_since(t0);
  res.final_loss = recent;

  res.info.target_vocab_hash = vocabulary_hash(target.file());
  res.info.tap_layers = taps;
  set_dflash_shape(res.info, cfg);
  res.info.step = o.steps;
  res.info.seed = o.seed;
  res.source = std::make_unique<DflashDraftSource>(std::move(drafter), taps, pool, session.n_ctx(), target);

  t0 = std::chrono::steady_clock::now();
  DflashDraftSource& src = *res.source;
  res.info.acceptance = heldout_acceptance(
      src, [&src](std::span<const float> rows) { src.set_taps(0, rows); }, data.sequences,
      static_cast<int>(o.block), 0, o.on_progress);
  res.eval_seconds = seconds_since(t0);
  return res;
}

}  // namespace tandem::speculative
