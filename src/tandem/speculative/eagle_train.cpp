#include "tandem/speculative/eagle_train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "tandem/model/session.h"
#include "tandem/sampling/sampler.h"
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

uint64_t next_u64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One sequence of training text and what the target said about it.
struct Sequence {
  std::vector<int32_t> tokens;  // [n] prompt and continuation
  int64_t prompt = 0;           // prompt tokens
  bool greedy = false;
  bool heldout = false;
  std::vector<uint16_t> taps;   // [n, n_taps * d] f16 bits
  std::vector<int32_t> ids;     // [n, kTopK] when the vocabulary is large, else empty
  std::vector<uint16_t> probs;  // [n, k] f16 bits (k: the vocabulary, or kTopK) the target's next-token
                                // distribution at each position
  std::vector<float> rest;      // [n] mass outside ids (top-k only)
  // [n] 1 where the target's distribution at the position teaches: it predicts a token the target
  // generated. The prompt's own tokens are the user's, and a drafter never drafts them.
  std::vector<uint8_t> mask;
  int64_t n() const { return static_cast<int64_t>(tokens.size()); }
};

// The target's continuation of `prompt`: its first `sampled` tokens drawn with `params`, the rest greedy.
std::vector<int32_t> generate(model::Session& s, std::span<const int32_t> prompt, int64_t max_tokens,
                              const sampling::Params& params, int64_t sampled, uint64_t sequence,
                              const std::function<bool(int32_t)>& is_eog) {
  s.truncate(0);
  std::vector<int32_t> text(prompt.begin(), prompt.end());
  sampling::Sampler sampler(params);
  sampling::Params greedy_params = params;
  greedy_params.temperature = 0.0f;
  sampling::Sampler greedy(greedy_params);
  std::span<const float> logits = s.eval(prompt);
  for (int64_t i = 0; i < max_tokens && s.length() < s.n_ctx(); ++i) {
    const int32_t x = (i < sampled ? sampler : greedy).sample(logits, text, sequence, text.size());
    text.push_back(x);
    if (is_eog && is_eog(x)) break;
    logits = s.eval(std::span<const int32_t>(&x, 1));
  }
  return text;
}

void capture(model::Session& s, const std::vector<int32_t>& taps, int64_t k, Sequence& seq) {
  const int64_t d = s.model().config().n_embd, width = static_cast<int64_t>(taps.size()) * d, V = s.n_vocab(),
                n = seq.n();
  seq.taps.assign(static_cast<size_t>(n * width), 0);
  std::vector<int64_t> next_row(taps.size(), 0);
  const model::CaptureFn fn = [&](int64_t layer, const float* hidden, int64_t rows) {
    for (size_t t = 0; t < taps.size(); ++t) {
      if (taps[t] != layer) continue;
      for (int64_t r = 0; r < rows; ++r) {
        uint16_t* dst = seq.taps.data() + (next_row[t] + r) * width + static_cast<int64_t>(t) * d;
        for (int64_t i = 0; i < d; ++i) dst[i] = f32_to_fp16(hidden[r * d + i]);
      }
      next_row[t] += rows;
    }
  };
  s.truncate(0);
  const std::span<const float> logits = s.eval(seq.tokens, true, &fn);
  seq.probs.assign(static_cast<size_t>(n * k), 0);
  seq.mask.assign(static_cast<size_t>(n), 0);
  for (int64_t r = std::max<int64_t>(0, seq.prompt - 1); r < n; ++r) seq.mask[static_cast<size_t>(r)] = 1;
  if (k < V) {
    seq.ids.assign(static_cast<size_t>(n * k), 0);
    seq.rest.assign(static_cast<size_t>(n), 0.0f);
  }
  std::vector<double> p(static_cast<size_t>(V));
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int64_t r = 0; r < n; ++r) {
    const float* z = logits.data() + r * V;
    const float top = *std::max_element(z, z + V);
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += p[static_cast<size_t>(i)] = std::exp(double(z[i]) - top);
    uint16_t* out = seq.probs.data() + r * k;
    if (k == V) {
      for (int64_t i = 0; i < V; ++i)
        out[i] = f32_to_fp16(static_cast<float>(p[static_cast<size_t>(i)] / sum));
      continue;
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)] ||
             (p[static_cast<size_t>(a)] == p[static_cast<size_t>(b)] && a < b);
    });
    std::sort(order.begin(), order.begin() + k);  // ids ascending within a row
    double kept = 0;
    for (int64_t i = 0; i < k; ++i) {
      const double q = p[static_cast<size_t>(order[static_cast<size_t>(i)])] / sum;
      seq.ids[static_cast<size_t>(r * k + i)] = order[static_cast<size_t>(i)];
      out[i] = f32_to_fp16(static_cast<float>(q));
      kept += q;
    }
    seq.rest[static_cast<size_t>(r)] = static_cast<float>(std::max(0.0, 1.0 - kept));
  }
}

// The rows of one training step: `unroll` blocks, block j holding positions q = j .. n - 2 (row base[j] +
// q - j). Row (j, q) reads taps at q (j = 0) or the output hidden state of row (j - 1, q - 1), the token
// q + 1, and learns the target's distribution at q + 1 (for token q + 2). It sees block 0's rows 0 .. q - j
// and, in each block i = 1 .. j, the row at position q - j + i: exactly the cache an inference draft of
// step j sees. The sequence's f16 taps and distributions are widened to f32 here, once per step.
class UnrolledBatch {
 public:
  UnrolledBatch(int unroll, int64_t max_n, int64_t d, int64_t width, int64_t k)
      : unroll_(unroll), d_(d), width_(width), k_(k) {
    const auto R = static_cast<size_t>(unroll * max_n);
    next_ids_.resize(R);
    pos_.resize(R);
    weight_.resize(R);
    mask_rows_.resize(R);
    given_g_.resize(R * static_cast<size_t>(d));
    taps_.resize(static_cast<size_t>(max_n * width));
    probs_.resize(R * static_cast<size_t>(k));
    ids_.resize(R * static_cast<size_t>(k));
    rest_.resize(R);
  }

  int64_t rows(int blocks) const { return base_[static_cast<size_t>(blocks)]; }

  void set(const Sequence& s, int64_t vocab) {
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
        const uint16_t* p = s.probs.data() + (q + 1) * k_;
        float* dst = probs_.data() + r * static_cast<size_t>(k_);
        for (int64_t i = 0; i < k_; ++i) dst[i] = fp16_to_f32(p[i]);
        if (k_ < vocab) {
          std::memcpy(ids_.data() + r * static_cast<size_t>(k_), s.ids.data() + (q + 1) * k_,
                      static_cast<size_t>(k_) * sizeof(int32_t));
          rest_[r] = s.rest[static_cast<size_t>(q + 1)];
        }
      }
  }

  // The batch of blocks 0 .. blocks - 1.
  train::EagleBatch view(int blocks, int64_t vocab) {
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
    b.targets.rows = R;
    b.targets.top_k = k_;
    b.targets.probs = probs_.data();
    b.targets.weight = weight_.data();
    b.targets.mask = mask_rows_.data();
    if (k_ < vocab) {
      b.targets.ids = ids_.data();
      b.targets.rest = rest_.data();
    }
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
  int64_t d_, width_, k_;
  const Sequence* seq_ = nullptr;
  std::vector<int64_t> base_;
  std::vector<int32_t> next_ids_, pos_, ids_;
  std::vector<uint8_t> mask_rows_;
  std::vector<float> weight_, given_g_, taps_, probs_, rest_;
  train::AttentionMask mask_{0};
};

// Greedy drafts of `depth` tokens from positions of the held-out greedy text (all of them, or at most
// max_anchors spread evenly when max_anchors > 0): entry k is the fraction of those positions whose first
// k + 1 drafts equal the text. taps_f32 is scratch.
std::vector<float> heldout_acceptance(EagleDraftSource& src, const std::vector<Sequence>& seqs, int depth,
                                      int64_t max_anchors, std::vector<float>& taps_f32) {
  int64_t total = 0;
  for (const Sequence& s : seqs)
    if (s.heldout && s.greedy)
      total += std::max<int64_t>(0, s.n() - depth - std::max<int64_t>(2, s.prompt) + 1);
  const int64_t stride = max_anchors > 0 ? std::max<int64_t>(1, (total + max_anchors - 1) / max_anchors) : 1;
  std::vector<int64_t> hits(static_cast<size_t>(depth), 0);
  int64_t anchors = 0;
  Draft draft;
  DraftSettings ds;
  ds.sampling.temperature = 0.0f;
  for (const Sequence& s : seqs) {
    if (!s.heldout || !s.greedy) continue;
    taps_f32.resize(s.taps.size());
    for (size_t i = 0; i < s.taps.size(); ++i) taps_f32[i] = fp16_to_f32(s.taps[i]);
    src.begin(std::span<const int32_t>(s.tokens).first(1), ds);
    src.set_taps(0, taps_f32);
    for (int64_t n = std::max<int64_t>(2, s.prompt); n + depth <= s.n(); n += stride) {
      const auto committed = std::span<const int32_t>(s.tokens).first(static_cast<size_t>(n));
      src.propose(committed, depth, draft);
      for (size_t i = 0; i < draft.tokens.size() && draft.tokens[i] == s.tokens[static_cast<size_t>(n) + i];
           ++i)
        ++hits[i];
      src.accept(committed, 0);
      ++anchors;
    }
  }
  std::vector<float> curve;
  if (anchors > 0)
    for (int64_t h : hits) curve.push_back(static_cast<float>(h) / static_cast<float>(anchors));
  return curve;
}

}  // namespace

std::span<const char* const> default_training_prompts() {
  return kPrompts;
}

EagleTrainResult train_eagle(const model::Model& target, ThreadPool& pool, const EagleTrainOptions& o) {
  if (o.prompts.empty()) throw Error("training a drafter needs at least one prompt");
  for (const auto& p : o.prompts)
    if (p.empty()) throw Error("a training prompt is empty: every prompt needs at least one token");
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
  const int64_t V = mc.n_vocab, k = V <= kFullVocab ? V : kTopK;
  model::SessionOptions so;
  so.kv_type = cache::KvType::kF32;
  model::Session session(target, pool, so);

  // Generate: greedy first for each prompt, then temperature-1 samples, round robin, until enough tokens.
  auto t0 = std::chrono::steady_clock::now();
  std::vector<Sequence> seqs;
  const size_t n_prompts = o.prompts.size();
  const size_t n_heldout_prompts = n_prompts >= 4 ? std::max<size_t>(1, n_prompts / 8) : 0;
  int64_t generated = 0;
  // The held-out prompts' greedy text comes first and outside the budget; the budget buys training text.
  for (uint64_t round = 0; generated < o.tokens; ++round) {
    for (size_t i = 0; i < n_prompts && generated < o.tokens; ++i) {
      const bool heldout = i >= n_prompts - n_heldout_prompts;
      if (heldout != (round == 0)) continue;
      sampling::Params sp;
      // Rounds past the first two alternate between whole temperature-1 samples and greedy text after a
      // sampled opening of 8 to 71 tokens: greedy text from many more starts than there are prompts.
      const bool greedy = round <= 1;
      const int64_t sampled =
          greedy           ? 0
          : round % 2 == 0 ? o.continuation
                           : 8 + static_cast<int64_t>((round * n_prompts + i) * 0x9E3779B97F4A7C15ull >> 58);
      sp.temperature = greedy ? 0.0f : 1.0f;
      sp.top_k = 0;
      sp.top_p = 1.0f;
      sp.seed = o.seed;
      const auto& prompt = o.prompts[i];
      if (static_cast<int64_t>(prompt.size()) + 2 > session.n_ctx())
        throw Error("a training prompt of " + std::to_string(prompt.size()) +
                    " tokens leaves no room in the target's context");
      Sequence s;
      s.tokens = generate(session, prompt, o.continuation, sp, sampled, round * n_prompts + i, o.is_eog);
      s.prompt = static_cast<int64_t>(prompt.size());
      s.greedy = greedy;
      s.heldout = heldout;
      if (!heldout) generated += s.n() - s.prompt;
      if (s.n() >= 3) seqs.push_back(std::move(s));
      const double rate = static_cast<double>(generated) / std::max(1e-9, seconds_since(t0));
      report({"generate",
              generated,
              o.tokens,
              generated,
              0,
              {},
              static_cast<double>(o.tokens - generated) / rate});
      if (o.stop && o.stop()) {
        res.stopped = true;
        return res;
      }
    }
    if (round > static_cast<uint64_t>(64 * o.tokens))
      break;  // prompts that end at once (EOG) cannot fill the budget
  }
  res.generate_seconds = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  int64_t max_n = 2;
  for (size_t i = 0; i < seqs.size(); ++i) {
    capture(session, taps, k, seqs[i]);
    max_n = std::max(max_n, seqs[i].n());
    (seqs[i].heldout ? res.heldout_tokens : res.train_tokens) += seqs[i].n();
    report({"capture",
            static_cast<int64_t>(i + 1),
            static_cast<int64_t>(seqs.size()),
            res.train_tokens + res.heldout_tokens,
            0,
            {},
            -1});
    if (o.stop && o.stop()) {
      res.stopped = true;
      return res;
    }
  }
  res.capture_seconds = seconds_since(t0);
  std::vector<const Sequence*> train_set;
  for (const Sequence& s : seqs)
    if (!s.heldout) train_set.push_back(&s);
  if (train_set.empty()) throw Error("no training text: give more prompts or a larger --tokens");

  // Train.
  const int64_t width = static_cast<int64_t>(taps.size()) * mc.n_embd;
  train::EagleConfig cfg = eagle_config_for(target, static_cast<int64_t>(taps.size()));
  if (o.ffn > 0) cfg.ffn = o.ffn;
  cfg.n_layer = o.layers;
  auto owned = std::make_unique<train::EagleDrafter>(cfg, o.unroll * max_n);
  train::EagleDrafter& drafter = *owned;
  drafter.init(o.seed);
  copy_target_weights(target, drafter);
  res.source = std::make_unique<EagleDraftSource>(std::move(owned), taps, pool, session.n_ctx());
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
  UnrolledBatch batch(o.unroll, max_n, cfg.d, width, k);

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
    train::load_drafter(o.checkpoint, params, &opt);
    first_step = saved.step;
    rng = saved.data_position;
  }

  std::vector<float> taps_f32;
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
    const Sequence& s = *train_set[next_u64(rng) % train_set.size()];
    const int blocks = static_cast<int>(std::min<int64_t>(o.unroll, s.n() - 1));
    batch.set(s, V);
    for (int j = 1; j < blocks; ++j) {
      drafter.forward_backward(batch.view(j, V), c, false);
      batch.feed(j, drafter.output_hidden());
    }
    drafter.zero_grad();
    const train::LossStats st = drafter.forward_backward(batch.view(blocks, V), c, true);
    train::clip_grad_norm(params, o.clip);
    opt.step(lr.at(step));
    trained_rows += st.counted;
    recent = step == first_step ? st.loss : 0.95 * recent + 0.05 * st.loss;
    if ((step + 1) % eval_every == 0 && step + 1 < o.steps)
      acceptance = heldout_acceptance(*res.source, seqs, o.eval_depth, o.eval_anchors, taps_f32);
    const double per_step = seconds_since(t0) / static_cast<double>(step + 1 - first_step);
    report({"train", step + 1, o.steps, trained_rows, recent, acceptance,
            per_step * static_cast<double>(o.steps - step - 1)});
  }
  res.train_seconds = seconds_since(t0);
  res.final_loss = recent;
  res.info.step = o.steps;
  res.info.data_position = rng;

  // Evaluate: greedy drafts from every position of the held-out greedy text.
  t0 = std::chrono::steady_clock::now();
  res.info.acceptance = heldout_acceptance(*res.source, seqs, o.eval_depth, 0, taps_f32);
  report({"evaluate", 1, 1, 0, 0, res.info.acceptance, -1});
  res.eval_seconds = seconds_since(t0);
  return res;
}

}  // namespace tandem::speculative
