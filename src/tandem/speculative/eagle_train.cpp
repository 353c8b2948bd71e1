#include "tandem/speculative/eagle_train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "tandem/model/session.h"
#include "tandem/speculative/drafter_data.h"
#include "tandem/tensor/fp16.h"
#include "tandem/train/attention.h"
#include "tandem/train/optimizer.h"
#include "tandem/util/error.h"

namespace tandem::speculative {
namespace {

constexpr const char* kPrompts[] = {
    "Tim and his mom went to the store.",
    "There was a big tree in the garden.",
    "Lily wanted to bake a cake.",
    "A small bird sat on a branch.",
    "The sun was shining and",
    "Ben had a new toy car.",
    "One morning, a little cat",
    "Sara and her friend played in the sand.",
    "The boy looked at the sky and",
    "Mom said, \"It is time for bed.\"",
    "In a small house lived an old man",
    "Max the dog liked to run.",
    "Anna found a shiny stone.",
    "The girl was happy because",
    "It was a cold day, and",
    "Sam saw a big box.",
    "The bunny hopped to the river.",
    "Jack and Jill climbed the hill.",
    "A little fish swam in the pond.",
    "Dad made a kite for",
    "The princess had a red dress.",
    "Lucy heard a noise outside.",
    "The bear was very hungry.",
    "Tom found a map in the",
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The rows of one training step: `unroll` blocks, block j holding positions q = j .. n - 2 (row base[j] +
// q - j). Row (j, q) reads taps at q (j = 0) or the output hidden state of row (j - 1, q - 1), the token
// q + 1, and learns the target's distribution at q + 1 (for token q + 2). It sees block 0's rows 0 .. q - j
// and, in each block i = 1 .. j, the row at position q - j + i: exactly the cache an inference draft of
// step j sees. The sequence's f16 taps and distributions are widened to f32 here, once per step.
class UnrolledBatch {
 public:
  UnrolledBatch(int unroll, int64_t max_n, int64_t d, int64_t width, int64_t k, int64_t vocab,
                std::span<const int32_t> draft_vocab)
      : unroll_(unroll), d_(d), width_(width), targets_(unroll * max_n, k, vocab, draft_vocab) {
    const auto R = static_cast<size_t>(unroll * max_n);
    next_ids_.resize(R);
    pos_.resize(R);
    weight_.resize(R);
    mask_rows_.resize(R);
    given_g_.resize(R * static_cast<size_t>(d));
    taps_.resize(static_cast<size_t>(max_n * width));
  }

  int64_t rows(int blocks) const { return base_[static_cast<size_t>(blocks)]; }

  void set(const DrafterSequence& s) {
    seq_ = &s;
    const int64_t n = s.n();
    for (size_t i = 0; i < s.taps.size(); ++i) taps_[i] = fp16_to_f32(s.taps[i]);
    base_.assign(1, 0);
    for (int j = 0; j < unroll_; ++j) base_.push_back(base_.back() + std::max<int64_t>(0, n - 1 - j));
    for (int j = 0; j < unroll_; ++j)
      for (int64_t q = j; q <= n - 2; ++q) {
        const auto r = static_cast<size_t>(base_[static_cast<size_t>(j)] + q - j);
        next_ids_[r] = s.tokens[static_cast<size_t>(q + 1)];
        pos_[r] = static_cast<int32_t>(q);
        weight_[r] = static_cast<float>(std::pow(0.8, j));
        mask_rows_[r] = s.mask[static_cast<size_t>(q + 1)];
        targets_.set(static_cast<int64_t>(r), s, q + 1);
      }
  }

  // The batch of blocks 0 .. blocks - 1.
  train::EagleBatch view(int blocks) {
    const int64_t R = rows(blocks), n = seq_->n();
    mask_ = train::AttentionMask(R);
    std::vector<train::AttentionMask::Interval> iv;
    for (int j = 0; j < blocks; ++j)
      for (int64_t q = j; q <= n - 2; ++q) {
        iv.assign(1, {0, q - j + 1});
        for (int i = 1; i <= j; ++i) {
          const int64_t r = base_[static_cast<size_t>(i)] + q - j;
          iv.push_back({r, r + 1});
        }
        mask_.add_row(iv);
      }
    train::EagleBatch b;
    b.rows = R;
    b.taps = taps_.data();
    b.tap_rows = rows(1);
    b.given_g = given_g_.data();
    b.next_ids = next_ids_.data();
    b.pos = pos_.data();
    b.mask = &mask_;
    b.targets = targets_.view(R, weight_.data(), mask_rows_.data());
    return b;
  }

  // After a pass over blocks 0 .. j - 1: block j's given g from block j - 1's output hidden states.
  void feed(int j, const float* hidden) {
    const int64_t n = seq_->n();
    for (int64_t q = j; q <= n - 2; ++q) {
      const int64_t src = base_[static_cast<size_t>(j - 1)] + q - j;
      const int64_t dst = base_[static_cast<size_t>(j)] - base_[1] + q - j;
      std::memcpy(given_g_.data() + dst * d_, hidden + src * d_, static_cast<size_t>(d_) * sizeof(float));
    }
  }

 private:
  int unroll_;
  int64_t d_, width_;
  TargetRows targets_;
  const DrafterSequence* seq_ = nullptr;
  std::vector<int64_t> base_;
  std::vector<int32_t> next_ids_, pos_;
  std::vector<uint8_t> mask_rows_;
  std::vector<float> weight_, given_g_, taps_;
  train::AttentionMask mask_{0};
};

}  // namespace

std::span<const char* const> default_training_prompts() {
  return kPrompts;
}

EagleTrainResult train_eagle(const model::Model& target, ThreadPool& pool, const EagleTrainOptions& o) {
  if (o.unroll < 1 || o.steps < 0 || o.tokens < 1 || o.continuation < 2 || o.eval_depth < 1 || o.ffn < 0 ||
      o.layers < 1)
    throw Error(
        "train-drafter: --tokens must be positive, --unroll and --layers at least 1, --steps and --ffn not "
        "negative");
  const auto report = [&](const EagleTrainProgress& p) {
    if (o.on_progress) o.on_progress(p);
  };
  EagleTrainResult res;
  const model::Config& mc = target.config();
  const std::vector<int32_t> taps = default_eagle_taps(mc.n_layer);
  const int64_t V = mc.n_vocab;
  model::SessionOptions so;
  so.kv_type = cache::KvType::kF32;
  model::Session session(target, pool, so);
  DrafterDataOptions data_options;
  data_options.prompts = o.prompts;
  data_options.tokens = o.tokens;
  data_options.continuation = o.continuation;
  data_options.seed = o.seed;
  data_options.sampled_openings = true;
  data_options.is_eog = o.is_eog;
  data_options.stop = o.stop;
  const DrafterData data = make_drafter_data(session, taps, data_options, o.on_progress);
  res.generate_seconds = data.generate_seconds;
  res.capture_seconds = data.capture_seconds;
  res.train_tokens = data.train_tokens;
  res.heldout_tokens = data.heldout_tokens;
  if (data.stopped) {
    res.stopped = true;
    return res;
  }
  const std::vector<const DrafterSequence*> train_set = data.training();
  const int64_t k = data.k, max_n = data.max_n;
  const auto heldout = [&](int64_t max_anchors) {
    EagleDraftSource& src = *res.source;
    return heldout_acceptance(
        src, [&src](std::span<const float> t) { src.set_taps(0, t); }, data.sequences, o.eval_depth,
        max_anchors, nullptr);
  };

  // Train.
  auto t0 = std::chrono::steady_clock::now();
  const int64_t width = static_cast<int64_t>(taps.size()) * mc.n_embd;
  train::EagleConfig cfg = eagle_config_for(target, static_cast<int64_t>(taps.size()));
  if (o.ffn > 0) cfg.ffn = o.ffn;
  cfg.n_layer = o.layers;
  cfg.draft_vocab = select_draft_vocab(data, draft_vocab_size(o.draft_vocab, V), V, o.is_eog);
  auto owned = std::make_unique<train::EagleDrafter>(cfg, o.unroll * max_n);
  train::EagleDrafter& drafter = *owned;
  drafter.init(o.seed);
  copy_target_weights(target, drafter);
  res.source = std::make_unique<EagleDraftSource>(std::move(owned), taps, pool, session.n_ctx(), target);
  std::vector<train::Param*> params = drafter.params();
  train::AdamWConfig ac;
  ac.weight_decay = 0.01;
  train::AdamW opt(params, ac);
  train::LrSchedule lr;
  lr.peak = o.lr;
  lr.floor = o.lr * 0.05;
  lr.warmup = std::min<int64_t>(50, std::max<int64_t>(1, o.steps / 10));
  lr.total = std::max<int64_t>(1, o.steps);
  train::Compute c(pool);
  UnrolledBatch batch(o.unroll, max_n, cfg.d, width, k, V, cfg.draft_vocab);

  res.info.target_file_hash = o.target_file_hash;
  res.info.target_vocab_hash = vocabulary_hash(target.file());
  res.info.tap_layers = taps;
  set_eagle_shape(res.info, cfg);
  res.info.seed = o.seed;
  res.info.total_steps = o.steps;
  uint64_t rng = o.seed ^ 0x5eed5eedull;
  int64_t first_step = 0;
  if (o.resume) {
    // The metadata first: a drafter of another shape would fail on its tensors with a less useful message.
    const train::DrafterInfo saved = train::load_drafter(o.checkpoint, {});
    const auto refuse = [&](const std::string& what) {
      throw Error("cannot resume from " + o.checkpoint + ": " + what);
    };
    if (saved.kind != kEagleKind) refuse("it is a " + saved.kind + " drafter, not " + kEagleKind);
    if (saved.target_vocab_hash != res.info.target_vocab_hash || saved.tap_layers != taps ||
        (!o.target_file_hash.empty() && saved.target_file_hash != o.target_file_hash))
      refuse("it was trained for another target (file, vocabulary or tap layers differ)");
    if (saved.seed != o.seed || saved.total_steps != o.steps)
      refuse("it was started with --seed " + std::to_string(saved.seed) + " and --steps " +
             std::to_string(saved.total_steps) + "; resume with the options it was started with");
    if (saved.layer_count != cfg.n_layer || saved.ffn != cfg.ffn)
      refuse("it was started with --layers " + std::to_string(saved.layer_count) + " and --ffn " +
             std::to_string(saved.ffn) + "; resume with the options it was started with");
    if (saved.draft_vocab != cfg.draft_vocab)
      refuse("its draft vocabulary (" + std::to_string(saved.draft_vocab.size()) +
             " tokens, 0: the whole) is not this run's (" + std::to_string(cfg.draft_vocab.size()) +
             "); resume with the --draft-vocab and --tokens it was started with");
    train::load_drafter(o.checkpoint, params, &opt);
    first_step = saved.step;
    rng = saved.data_position;
  }

  std::vector<float> acceptance;
  const int64_t eval_every = o.eval_every > 0 ? o.eval_every : std::max<int64_t>(1, o.steps / 10);
  double recent = 0;
  int64_t trained_rows = 0;
  t0 = std::chrono::steady_clock::now();
  for (int64_t step = first_step; step < o.steps; ++step) {
    if (o.stop && o.stop()) {
      res.info.step = step;
      res.info.data_position = rng;
      if (!o.checkpoint.empty()) train::save_drafter(o.checkpoint, res.info, params, &opt);
      res.stopped = true;
      res.source.reset();
      res.train_seconds = seconds_since(t0);
      return res;
    }
    const DrafterSequence& s = *train_set[next_random(rng) % train_set.size()];
    const int blocks = static_cast<int>(std::min<int64_t>(o.unroll, s.n() - 1));
    batch.set(s);
    for (int j = 1; j < blocks; ++j) {
      drafter.forward_backward(batch.view(j), c, false);
      batch.feed(j, drafter.output_hidden());
    }
    drafter.zero_grad();
    const train::LossStats st = drafter.forward_backward(batch.view(blocks), c, true);
    train::clip_grad_norm(params, o.clip);
    opt.step(lr.at(step));
    trained_rows += st.counted;
    recent = step == first_step ? st.loss : 0.95 * recent + 0.05 * st.loss;
    if ((step + 1) % eval_every == 0 && step + 1 < o.steps) acceptance = heldout(o.eval_anchors);
    const double per_step = seconds_since(t0) / static_cast<double>(step + 1 - first_step);
    report({.phase = "train",
            .done = step + 1,
            .total = o.steps,
            .tokens = trained_rows,
            .loss = recent,
            .acceptance = acceptance,
            .eta_seconds = per_step * static_cast<double>(o.steps - step - 1)});
  }
  res.train_seconds = seconds_since(t0);
  res.final_loss = recent;
  res.info.step = o.steps;
  res.info.data_position = rng;

  // Evaluate: greedy drafts from every position of the held-out greedy text.
  t0 = std::chrono::steady_clock::now();
  res.info.acceptance = heldout(0);
  report({.phase = "evaluate", .done = 1, .total = 1, .acceptance = res.info.acceptance});
  res.eval_seconds = seconds_since(t0);
  return res;
}

}  // namespace tandem::speculative
