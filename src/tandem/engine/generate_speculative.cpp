#include "tandem/engine/generate_speculative.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "tandem/speculative/settle.h"
#include "tandem/speculative/verify.h"
#include "tandem/util/error.h"

namespace tandem::engine {
namespace {

using speculative::CostModel;
using speculative::DraftSource;
using speculative::Gate;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// An unverified proposal the gate asked for while idle, compared with the tokens the target then commits.
struct Probe {
  speculative::Draft draft;
  size_t next = 0;  // the draft position the next committed token is compared with
  std::vector<double> outcomes;
  bool active = false;
};

// One generation's state. The target cache holds every committed token but the last (the "pending" token),
// which opens the next window.
class Run {
 public:
  Run(model::Session& target, DraftSource& source, const SpecOptions& options, const TokenFn& on_token,
      const EogFn& is_eog)
      : target_(target),
        source_(source),
        o_(options),
        on_token_(on_token),
        is_eog_(is_eog),
        sampler_(options.generate.sampling),
        grammar_(options.generate.grammar) {
    if (o_.draft_max < 1) throw Error("the draft depth (--draft-max) must be at least 1");
    if (o_.draft_min < 1 || o_.draft_min > o_.draft_max)
      throw Error("--draft-min must be between 1 and --draft-max (" + std::to_string(o_.draft_max) + ")");
    if (o_.use_gate) {
      CostModel costs = o_.costs.verify.empty() ? CostModel::linear(0.25, 0.0) : o_.costs;
      gate_.emplace(o_.gate, std::move(costs), o_.draft_max, o_.draft_min);
    }
    const auto layers = source_.target_layers();
    if (!layers.empty()) {
      capture_ = [this, layers](int64_t layer, const float* hidden, int64_t n_rows) {
        if (std::find(layers.begin(), layers.end(), layer) == layers.end()) return;
        const auto width = static_cast<size_t>(target_.model().config().n_embd);
        source_.on_target_hidden(layer, {hidden, width * static_cast<size_t>(n_rows)}, n_rows, capture_pos_);
      };
    }
    stats_.depth_histogram.assign(static_cast<size_t>(o_.draft_max) + 1, 0);
  }

  SpecStats run(std::span<const int32_t> prompt) {
    if (prompt.empty()) throw Error("the prompt is empty: nothing to continue");
    // The window opens with the prompt's last token, so the cache may hold at most the rest.
    const auto cached = static_cast<size_t>(target_.length());
    if (cached >= prompt.size())
      throw Error("the target session already holds " + std::to_string(cached) +
                  " tokens; generation needs a prompt longer than what is cached");
    history_.assign(prompt.begin(), prompt.end());
    history_.reserve(prompt.size() + static_cast<size_t>(std::max<int64_t>(0, o_.generate.max_tokens)) +
                     static_cast<size_t>(o_.draft_max) + 1);
    window_.reserve(static_cast<size_t>(o_.draft_max) + 1);

    auto t0 = std::chrono::steady_clock::now();
    speculative::DraftSettings settings;
    settings.sampling = o_.generate.sampling;
    settings.sequence_id = o_.generate.sequence_id;
    if (grammar_) settings.grammar = &*grammar_;
    source_.begin(prompt, settings);
    if (prompt.size() - 1 > cached) eval(prompt.subspan(cached, prompt.size() - 1 - cached), false);
    stats_.prompt_tokens = static_cast<int64_t>(prompt.size() - cached);
    stats_.prompt_seconds = seconds_since(t0);

    t0 = std::chrono::steady_clock::now();
    while (stats_.generated < o_.generate.max_tokens && !done_) {
      if (target_.length() >= target_.n_ctx()) {
        stats_.stopped_by_context = true;
        break;
      }
      round();
    }
    stats_.generate_seconds = seconds_since(t0);
    return stats_;
  }

 private:
  std::span<const float> eval(std::span<const int32_t> tokens, bool all_logits) {
    capture_pos_ = target_.length();
    return target_.eval(tokens, all_logits, capture_ ? &capture_ : nullptr);
  }

  // How many drafts this round may verify: the generation's remaining tokens (the target adds one) and the
  // context (the window is the pending token plus the drafts).
  int depth_limit() const {
    const int64_t remaining = o_.generate.max_tokens - stats_.generated - 1;
    const int64_t room = target_.n_ctx() - target_.length() - 1;
    return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>({o_.draft_max, remaining, room})));
  }

  void round() {
    const int limit = depth_limit();
    int depth = limit;
    if (gate_) {
      const Gate::Decision decision = gate_->decide(limit);
      depth = decision.depth;
      if (decision.probe && !probe_.active) start_probe();
    }
    int drafted = 0;
    if (depth > 0) {
      source_.propose(history_, depth, draft_);
      drafted = std::min(depth, static_cast<int>(draft_.tokens.size()));
      if (grammar_ && drafted > 0) drafted = cut_at_grammar(drafted);
      if (drafted < o_.draft_min) drafted = 0;
      if (drafted > 0) probe_.active = false;  // verified rounds observe the drafter directly
    }
    window_.assign(1, history_.back());
    window_.insert(window_.end(), draft_.tokens.begin(), draft_.tokens.begin() + drafted);
    const auto forward_start = std::chrono::steady_clock::now();
    const std::span<const float> logits = eval(window_, drafted > 0);
    if (gate_) gate_->record_forward(drafted + 1, seconds_since(forward_start));
    ++stats_.target_forwards;
    ++stats_.depth_histogram[static_cast<size_t>(drafted)];

    speculative::Window window;
    window.logits = logits;
    window.drafts = std::span<const int32_t>(window_).subspan(1);
    if (drafted > 0 && draft_.sampled)
      window.q = std::span<const sampling::Distribution>(draft_.q.data(), static_cast<size_t>(drafted));
    const speculative::SettleOutcome outcome =
        settler_.settle(window,
                        {history_, sampler_, o_.generate.sequence_id, target_.cache(),
                         gate_ ? &*gate_ : nullptr, &source_, grammar_ ? &*grammar_ : nullptr},
                        [&](int32_t token, int) {
                          // A plain step's token was drawn from the target's p, which scores a running probe.
                          commit(token, drafted == 0 ? &settler_.target_distribution(0) : nullptr);
                          return !done_;
                        });
    if (drafted > 0) {
      ++stats_.rounds;
      stats_.drafted += drafted;
      stats_.accepted += outcome.accepted;
    }
  }

  // Verifying drafts past a token the grammar refuses wastes rows: as the scheduler does, a deterministic
  // draft is cut before that token (its rejection would draw from the masked p, as a plain step does), a
  // sampled one keeps it, since the residual draw max(0, p - q) after its rejection keeps the output's
  // distribution the target's only if every drafted token is verified.
  int cut_at_grammar(int drafted) {
    const size_t at = grammar_->position();
    const size_t valid =
        grammar_->accept_prefix(std::span<const int32_t>(draft_.tokens.data(), static_cast<size_t>(drafted)));
    grammar_->rollback_to(at);
    return static_cast<int>(std::min(static_cast<size_t>(drafted), valid + (draft_.sampled ? 1 : 0)));
  }

  // `token` was just appended to history_ by the settle step.
  void commit(int32_t token, const sampling::Distribution* p) {
    ++stats_.generated;
    // The settle step drew `token` from the grammar's mask, so the grammar takes it.
    if (grammar_ && !grammar_->accept_token(token))
      throw Error("internal: token " + std::to_string(token) + " was committed against the output's grammar");
    if (probe_.active) observe_probe(token, p);
    const bool keep_going = on_token_(token);
    if (is_eog_ && is_eog_(token)) {
      stats_.stopped_by_eog = true;
      done_ = true;
    } else if (!keep_going || stats_.generated >= o_.generate.max_tokens) {
      done_ = true;
    } else if (grammar_ && (grammar_->terminated() || grammar_->must_end())) {
      stats_.stopped_by_grammar = true;
      done_ = true;
    }
  }

  void start_probe() {
    source_.propose(history_, gate_->settings().probe_depth, probe_.draft);
    source_.accept(history_, 0);
    ++stats_.probes;
    probe_.next = 0;
    probe_.outcomes.clear();
    probe_.active = !probe_.draft.tokens.empty();
  }

  // A plain step committed `token`, drawn from p: score the probe's draft at that position as a verify round
  // would have (the probability of accepting it), and stop at the first draft the text did not follow.
  void observe_probe(int32_t token, const sampling::Distribution* p) {
    if (!p) {
      probe_.active = false;
      return;
    }
    const size_t i = probe_.next++;
    const int32_t x = probe_.draft.tokens[i];
    const sampling::Distribution* q = probe_.draft.sampled ? &probe_.draft.q[i] : nullptr;
    probe_.outcomes.push_back(speculative::acceptance_probability(x, *p, q));
    if (token != x || probe_.next == probe_.draft.tokens.size()) {
      gate_->record(probe_.outcomes);
      probe_.active = false;
    }
  }

  model::Session& target_;
  DraftSource& source_;
  const SpecOptions& o_;
  const TokenFn& on_token_;
  const EogFn& is_eog_;
  sampling::Sampler sampler_;
  std::optional<sampling::GrammarMatcher> grammar_;  // at the committed text's state
  std::optional<Gate> gate_;
  model::CaptureFn capture_;
  int64_t capture_pos_ = 0;

  std::vector<int32_t> history_;  // prompt and committed tokens
  std::vector<int32_t> window_;   // this round's forward: pending token, drafts
  speculative::Draft draft_;
  speculative::Settler settler_;
  Probe probe_;
  SpecStats stats_;
  bool done_ = false;
};

}  // namespace

void SpecStats::add(const SpecStats& o) {
  prompt_tokens += o.prompt_tokens;
  generated += o.generated;
  prompt_seconds += o.prompt_seconds;
  generate_seconds += o.generate_seconds;
  target_forwards += o.target_forwards;
  rounds += o.rounds;
  drafted += o.drafted;
  accepted += o.accepted;
  probes += o.probes;
  if (depth_histogram.size() < o.depth_histogram.size()) depth_histogram.resize(o.depth_histogram.size(), 0);
  for (size_t i = 0; i < o.depth_histogram.size(); ++i) depth_histogram[i] += o.depth_histogram[i];
}

SpecStats generate_speculative(model::Session& target, DraftSource& source, std::span<const int32_t> prompt,
                               const SpecOptions& options, const TokenFn& on_token, const EogFn& is_eog) {
  Run run(target, source, options, on_token, is_eog);
  return run.run(prompt);
}

}  // namespace tandem::engine
