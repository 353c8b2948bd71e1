#include "tandem/speculative/drafter_data.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "tandem/sampling/sampler.h"
#include "tandem/tensor/fp16.h"
#include "tandem/util/error.h"

namespace tandem::speculative {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

DrafterTrainProgress progress(const char* phase, int64_t done, int64_t total, int64_t tokens, double eta) {
  DrafterTrainProgress p;
  p.phase = phase;
  p.done = done;
  p.total = total;
  p.tokens = tokens;
  p.eta_seconds = eta;
  return p;
}

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

void capture(model::Session& s, std::span<const int32_t> taps, int64_t k, DrafterSequence& seq) {
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

}  // namespace

int64_t draft_vocab_size(int64_t requested, int64_t vocab) {
  if (requested < 0) return vocab <= kDraftVocabWholeUpTo ? 0 : kDraftVocabDefault;
  return requested >= vocab ? 0 : requested;
}

std::vector<int32_t> select_draft_vocab(const DrafterData& data, int64_t size, int64_t vocab,
                                        const std::function<bool(int32_t)>& is_eog) {
  if (size <= 0 || size >= vocab) return {};
  const auto V = static_cast<size_t>(vocab);
  std::vector<int64_t> count(V, 0);
  std::vector<double> mass(V, 0.0);
  const int64_t k = data.k;
  for (const DrafterSequence& s : data.sequences) {
    if (s.heldout) continue;
    for (int64_t i = std::max<int64_t>(1, s.prompt); i < s.n(); ++i)
      ++count[static_cast<size_t>(s.tokens[static_cast<size_t>(i)])];
    for (int64_t r = 0; r < s.n(); ++r) {
      if (s.mask[static_cast<size_t>(r)] == 0) continue;
      for (int64_t e = 0; e < k; ++e) {
        const auto id = static_cast<size_t>(s.ids.empty() ? e : s.ids[static_cast<size_t>(r * k + e)]);
        mass[id] += fp16_to_f32(s.probs[static_cast<size_t>(r * k + e)]);
      }
    }
  }
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  // End-of-generation tokens first, then by count, summed probability and id.
  const auto eog = [&](int32_t id) { return is_eog && is_eog(id); };
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const auto ia = static_cast<size_t>(a), ib = static_cast<size_t>(b);
    if (eog(a) != eog(b)) return eog(a);
    if (count[ia] != count[ib]) return count[ia] > count[ib];
    if (mass[ia] != mass[ib]) return mass[ia] > mass[ib];
    return a < b;
  });
  int64_t n = size;
  while (n < vocab && eog(order[static_cast<size_t>(n)])) ++n;  // every end-of-generation token
  if (n >= vocab) return {};
  order.resize(static_cast<size_t>(n));
  std::sort(order.begin(), order.end());
  return order;
}

TargetRows::TargetRows(int64_t max_rows, int64_t k, int64_t vocab, std::span<const int32_t> draft_vocab)
    : k_(k), vocab_(vocab), width_(k), draft_vocab_(draft_vocab.begin(), draft_vocab.end()) {
  if (!draft_vocab_.empty()) {
    draft_of_.assign(static_cast<size_t>(vocab), -1);
    for (size_t i = 0; i < draft_vocab_.size(); ++i) {
      const int32_t id = draft_vocab_[i];
      if (id < 0 || id >= vocab || draft_of_[static_cast<size_t>(id)] >= 0)
        throw Error("a draft vocabulary lists token id " + std::to_string(id) +
                    " outside the vocabulary or twice");
      draft_of_[static_cast<size_t>(id)] = static_cast<int32_t>(i);
    }
    if (k == vocab) width_ = static_cast<int64_t>(draft_vocab_.size());
  }
  probs_.resize(static_cast<size_t>(max_rows * width_));
  rest_.resize(static_cast<size_t>(max_rows));
  if (k < vocab) ids_.resize(static_cast<size_t>(max_rows * k));
  teaches_.assign(static_cast<size_t>(max_rows), 1);
  mask_.assign(static_cast<size_t>(max_rows), 1);
}

void TargetRows::set(int64_t r, const DrafterSequence& s, int64_t pos) {
  const uint16_t* p = s.probs.data() + pos * k_;
  float* dst = probs_.data() + r * width_;
  float& rest = rest_[static_cast<size_t>(r)];
  rest = k_ < vocab_ ? s.rest[static_cast<size_t>(pos)] : 0.0f;
  if (draft_of_.empty()) {
    for (int64_t i = 0; i < k_; ++i) dst[i] = fp16_to_f32(p[i]);
    if (k_ < vocab_)
      std::memcpy(ids_.data() + r * k_, s.ids.data() + pos * k_, static_cast<size_t>(k_) * sizeof(int32_t));
    return;
  }
  // Restricted to the draft vocabulary, over draft ids, and renormalised (see the class comment).
  double kept = rest;
  if (k_ == vocab_) {
    for (int64_t i = 0; i < width_; ++i)
      kept += dst[i] = fp16_to_f32(p[draft_vocab_[static_cast<size_t>(i)]]);
  } else {
    int32_t* ids = ids_.data() + r * k_;
    for (int64_t e = 0; e < k_; ++e) {
      const int32_t draft = draft_of_[static_cast<size_t>(s.ids[static_cast<size_t>(pos * k_ + e)])];
      ids[e] = draft;
      dst[e] = draft >= 0 ? fp16_to_f32(p[e]) : 0.0f;
      kept += dst[e];
    }
  }
  teaches_[static_cast<size_t>(r)] = kept > 0 ? 1 : 0;
  if (!(kept > 0)) return;
  const auto scale = static_cast<float>(1.0 / kept);
  for (int64_t i = 0; i < width_; ++i) dst[i] *= scale;
  rest *= scale;
}

train::SoftTargets TargetRows::view(int64_t rows, const float* weight, const uint8_t* mask) {
  train::SoftTargets t;
  t.rows = rows;
  t.top_k = width_;
  t.probs = probs_.data();
  t.weight = weight;
  t.mask = mask;
  if (k_ < vocab_) {
    t.ids = ids_.data();
    t.rest = rest_.data();
  }
  if (!draft_of_.empty()) {
    for (int64_t r = 0; r < rows; ++r)
      mask_[static_cast<size_t>(r)] =
          (mask == nullptr || mask[r] != 0) && teaches_[static_cast<size_t>(r)] != 0 ? 1 : 0;
    t.mask = mask_.data();
  }
  return t;
}

std::vector<const DrafterSequence*> DrafterData::training() const {
  std::vector<const DrafterSequence*> out;
  for (const DrafterSequence& s : sequences)
    if (!s.heldout) out.push_back(&s);
  return out;
}

DrafterData make_drafter_data(model::Session& session, std::span<const int32_t> taps,
                              const DrafterDataOptions& o, const DrafterProgressFn& on_progress) {
  if (o.prompts.empty()) throw Error("training a drafter needs at least one prompt");
  for (const auto& p : o.prompts)
    if (p.empty()) throw Error("a training prompt is empty: every prompt needs at least one token");
  if (o.tokens < 1 || o.continuation < 2) throw Error("train-drafter: --tokens must be positive");
  const auto report = [&](const DrafterTrainProgress& p) {
    if (on_progress) on_progress(p);
  };
  DrafterData data;
  const int64_t V = session.n_vocab();
  data.k = V <= kDrafterFullVocab ? V : kDrafterTopK;

  // Generate: greedy first for each prompt, then temperature-1 samples, round robin, until enough tokens.
  auto t0 = std::chrono::steady_clock::now();
  std::vector<DrafterSequence>& seqs = data.sequences;
  const size_t n_prompts = o.prompts.size();
  const size_t n_heldout_prompts = n_prompts >= 4 ? std::max<size_t>(1, n_prompts / 8) : 0;
  int64_t generated = 0;
  // The held-out prompts' greedy text comes first and outside the budget; the budget buys training text.
  for (uint64_t round = 0; generated < o.tokens; ++round) {
    for (size_t i = 0; i < n_prompts && generated < o.tokens; ++i) {
      const bool heldout = i >= n_prompts - n_heldout_prompts;
      if (heldout != (round == 0)) continue;
      sampling::Params sp;
      const bool greedy = round <= 1;
      const int64_t sampled =
          greedy ? 0
          : !o.sampled_openings || round % 2 == 0
              ? o.continuation
              : 8 + static_cast<int64_t>((round * n_prompts + i) * 0x9E3779B97F4A7C15ull >> 58);
      sp.temperature = greedy ? 0.0f : 1.0f;
      sp.top_k = 0;
      sp.top_p = 1.0f;
      sp.seed = o.seed;
      const auto& prompt = o.prompts[i];
      if (static_cast<int64_t>(prompt.size()) + 2 > session.n_ctx())
        throw Error("a training prompt of " + std::to_string(prompt.size()) +
                    " tokens leaves no room in the target's context");
      DrafterSequence s;
      s.tokens = generate(session, prompt, o.continuation, sp, sampled, round * n_prompts + i, o.is_eog);
      s.prompt = static_cast<int64_t>(prompt.size());
      s.greedy = greedy;
      s.heldout = heldout;
      if (!heldout) generated += s.n() - s.prompt;
      if (s.n() >= 3) seqs.push_back(std::move(s));
      const double rate = static_cast<double>(generated) / std::max(1e-9, seconds_since(t0));
      report(progress("generate", generated, o.tokens, generated,
                      static_cast<double>(o.tokens - generated) / rate));
      if (o.stop && o.stop()) {
        data.stopped = true;
        return data;
      }
    }
    if (round > static_cast<uint64_t>(64 * o.tokens))
      break;  // prompts that end at once (EOG) cannot fill the budget
  }
  data.generate_seconds = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < seqs.size(); ++i) {
    capture(session, taps, data.k, seqs[i]);
    data.max_n = std::max(data.max_n, seqs[i].n());
    (seqs[i].heldout ? data.heldout_tokens : data.train_tokens) += seqs[i].n();
    report(progress("capture", static_cast<int64_t>(i + 1), static_cast<int64_t>(seqs.size()),
                    data.train_tokens + data.heldout_tokens, -1));
    if (o.stop && o.stop()) {
      data.stopped = true;
      return data;
    }
  }
  data.capture_seconds = seconds_since(t0);
  if (data.train_tokens == 0) throw Error("no training text: give more prompts or a larger --tokens");
  return data;
}

std::vector<float> heldout_acceptance(DraftSource& src,
                                      const std::function<void(std::span<const float>)>& set_taps,
                                      std::span<const DrafterSequence> sequences, int depth,
                                      int64_t max_anchors, const DrafterProgressFn& on_progress) {
  int64_t total = 0;
  for (const DrafterSequence& s : sequences)
    if (s.heldout && s.greedy)
      total += std::max<int64_t>(0, s.n() - depth - std::max<int64_t>(2, s.prompt) + 1);
  const int64_t stride = max_anchors > 0 ? std::max<int64_t>(1, (total + max_anchors - 1) / max_anchors) : 1;
  std::vector<int64_t> hits(static_cast<size_t>(depth), 0);
  int64_t anchors = 0;
  Draft draft;
  DraftSettings ds;
  ds.sampling.temperature = 0.0f;
  std::vector<float> taps;
  for (const DrafterSequence& s : sequences) {
    if (!s.heldout || !s.greedy) continue;
    taps.resize(s.taps.size());
    for (size_t i = 0; i < s.taps.size(); ++i) taps[i] = fp16_to_f32(s.taps[i]);
    src.begin(std::span<const int32_t>(s.tokens).first(1), ds);
    set_taps(taps);
    for (int64_t n = std::max<int64_t>(2, s.prompt); n + depth <= s.n(); n += stride) {
      const auto committed = std::span<const int32_t>(s.tokens).first(static_cast<size_t>(n));
      src.propose(committed, depth, draft);
      for (size_t i = 0; i < draft.tokens.size() && draft.tokens[i] == s.tokens[static_cast<size_t>(n) + i];
           ++i)
        ++hits[i];
      src.accept(committed, 0);
      ++anchors;
    }
    if (on_progress) on_progress(progress("evaluate", anchors, anchors, 0, -1));
  }
  std::vector<float> acceptance;
  if (anchors > 0)
    for (int64_t h : hits) acceptance.push_back(static_cast<float>(h) / static_cast<float>(anchors));
  return acceptance;
}

}  // namespace tandem::speculative
