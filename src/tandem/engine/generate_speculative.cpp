#include "tandem/engine/generate_speculative.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "tandem/speculative/settle.h"
#include "tandem/speculative/tree_budget.h"
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
    if (o_.tree_nodes < 0) throw Error("--tree-nodes must be 0 (chains) or a positive node budget");
    if (o_.tree_nodes > 0) {
      speculative::check_tree_target(target_.cache().store().geometry(), target_.cache().type());
      speculative::check_tree_source(source_);
      if (options.generate.grammar)
        throw Error(
            "draft trees are not verified under an output grammar yet; use chains (--tree-nodes 0) with "
            "--json-schema or --grammar");
    }
    if (o_.use_gate) {
      CostModel costs = o_.costs.verify.empty() ? CostModel::linear(0.25, 0.0) : o_.costs;
      if (o_.tree_nodes > 0)
        tree_costs_.emplace(std::move(costs));
      else
        gate_.emplace(o_.gate, std::move(costs), o_.draft_max, o_.draft_min);
    }
    const auto layers = source_.target_layers();
    if (!layers.empty()) {
      // Session::eval runs a long span (a prompt) in several forwards, each capturing its own rows: a layer's
      // rows continue where its previous capture in this eval ended.
      capture_rows_.assign(layers.size(), 0);
      capture_ = [this, layers](int64_t layer, const float* hidden, int64_t n_rows) {
        const auto it = std::find(layers.begin(), layers.end(), layer);
        if (it == layers.end()) return;
        int64_t& done = capture_rows_[static_cast<size_t>(it - layers.begin())];
        const auto width = static_cast<size_t>(target_.model().config().n_embd);
        source_.on_target_hidden(layer, {hidden, width * static_cast<size_t>(n_rows)}, n_rows,
                                 capture_pos_ + done);
        done += n_rows;
      };
    }
    stats_.depth_histogram.assign(static_cast<size_t>(o_.draft_max) + 1, 0);
    stats_.rows_histogram.assign(static_cast<size_t>(std::max(o_.draft_max, o_.tree_nodes)) + 2, 0);
    stats_.proposed_by_position.assign(static_cast<size_t>(o_.draft_max), 0);
    stats_.accepted_by_position.assign(static_cast<size_t>(o_.draft_max), 0);
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
    window_.reserve(static_cast<size_t>(std::max(o_.draft_max, o_.tree_nodes)) + 1);

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
    std::fill(capture_rows_.begin(), capture_rows_.end(), 0);
    return target_.eval(tokens, all_logits, capture_ ? &capture_ : nullptr);
  }

  // How many drafts this round may verify: the generation's remaining tokens (the target adds one) and the
  // context (the window is the pending token plus the drafts).
  int depth_limit() const {
    const int64_t remaining = o_.generate.max_tokens - stats_.generated - 1;
    const int64_t room = target_.n_ctx() - target_.length() - 1;
    return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>({o_.draft_max, remaining, room})));
  }

  // How many tree nodes this round may verify: the node budget and the context.
  int node_limit() const {
    const int64_t room = target_.n_ctx() - target_.length() - 1;
    return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(o_.tree_nodes, room)));
  }

  void round() {
    const int limit = depth_limit();
    if (o_.tree_nodes > 0) {
      const int nodes = node_limit();
      if (limit > 0 && nodes > 0) {
        source_.propose_tree(history_, nodes, limit, draft_);
        if (tree_costs_ && speculative::TreeBudget::scored(draft_)) {
          // Verifying n nodes costs a forward of n + 1 rows.
          tree_cost_.assign(draft_.tokens.size() + 1, 1.0);
          for (size_t n = 1; n < tree_cost_.size(); ++n)
            tree_cost_[n] = tree_costs_->verify_cost(static_cast<int>(n) + 1);
          const size_t keep = tree_budget_.choose(draft_, tree_cost_);
          if (keep == 0) return chain_round(0);
          tree_budget_.prune(draft_, keep);
        }
        if (!draft_.tree.empty()) return tree_round();
      } else {
        draft_.clear();
      }
      // A chain (a source without trees, or an empty proposal): verified as one.
      return chain_round(std::min({limit, nodes, static_cast<int>(draft_.tokens.size())}));
    }
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
    }
    chain_round(drafted);
  }

  // Verifies the first `drafted` tokens of draft_ as a chain (fewer than draft_min: a plain step).
  void chain_round(int drafted) {
    if (drafted < o_.draft_min) drafted = 0;
    if (drafted > 0) probe_.active = false;  // verified rounds observe the drafter directly
    window_.assign(1, history_.back());
    window_.insert(window_.end(), draft_.tokens.begin(), draft_.tokens.begin() + drafted);
    const auto forward_start = std::chrono::steady_clock::now();
    const std::span<const float> logits = eval(window_, drafted > 0);
    if (gate_) gate_->record_forward(drafted + 1, seconds_since(forward_start));
    ++stats_.target_forwards;
    ++stats_.depth_histogram[static_cast<size_t>(drafted)];
    ++stats_.rows_histogram[static_cast<size_t>(drafted) + 1];

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
    if (drafted > 0) stats_.record_round(drafted, drafted, outcome.accepted);
  }

  // Verifies draft_'s tree in one target forward: the pending token is node 0 of the window's tree, draft
  // node i its node i + 1.
  void tree_round() {
    const size_t d = draft_.tokens.size();
    window_.assign(1, history_.back());
    window_.insert(window_.end(), draft_.tokens.begin(), draft_.tokens.end());
    tree_parent_.assign(1, -1);
    tree_depth_.assign(1, 0);
    for (size_t i = 0; i < d; ++i) {
      tree_parent_.push_back(draft_.tree.parent[i] + 1);
      tree_depth_.push_back(draft_.tree.depth[i]);
    }
    // A drafter that reads the target receives a row per window row (DraftSource::follows_tree_rows).
    capture_pos_ = target_.length();
    std::fill(capture_rows_.begin(), capture_rows_.end(), 0);
    const std::span<const float> logits =
        target_.eval_tree(window_, cache::TreeMask{target_.length(), tree_parent_, tree_depth_},
                          capture_ ? &capture_ : nullptr);
    ++stats_.target_forwards;
    const auto depth = static_cast<size_t>(std::min<int32_t>(draft_.tree.max_depth(), o_.draft_max));
    ++stats_.depth_histogram[depth];
    ++stats_.rows_histogram[d + 1];

    speculative::TreeWindow window;
    window.logits = logits;
    window.drafts = draft_.tokens;
    window.parent = draft_.tree.parent;
    if (draft_.sampled) window.q = std::span<const sampling::Distribution>(draft_.q.data(), d);
    const speculative::SettleOutcome outcome = settler_.settle_tree(
        window, {history_, sampler_, o_.generate.sequence_id, target_.cache(), nullptr, &source_},
        [&](int32_t token, int) {
          commit(token, nullptr);
          return !done_;
        });
    tree_budget_.record(draft_, outcome.accepted);
    ++stats_.tree_rounds;
    stats_.record_round(static_cast<int64_t>(d), static_cast<int>(depth), outcome.accepted);
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
  std::optional<CostModel> tree_costs_;  // trees with the gate on: the costs their budget is chosen from
  speculative::TreeBudget tree_budget_;
  std::vector<double> tree_cost_;  // [nodes + 1]: the cost of verifying n nodes
  model::CaptureFn capture_;
  int64_t capture_pos_ = 0;            // the position of the first row of the current eval
  std::vector<int64_t> capture_rows_;  // [tapped layer]: rows captured so far in the current eval

  std::vector<int32_t> history_;                   // prompt and committed tokens
  std::vector<int32_t> window_;                    // this round's forward: pending token, drafts
  std::vector<int32_t> tree_parent_, tree_depth_;  // a tree round's cache::TreeMask over window_
  speculative::Draft draft_;
  speculative::Settler settler_;
  Probe probe_;
  SpecStats stats_;
  bool done_ = false;
};

}  // namespace

void SpecStats::record_round(int64_t n_drafted, int depth, int n_accepted) {
  ++rounds;
  drafted += n_drafted;
  accepted += n_accepted;
  const auto deep = static_cast<size_t>(std::max(depth, 0));
  if (proposed_by_position.size() < deep) {
    proposed_by_position.resize(deep, 0);
    accepted_by_position.resize(deep, 0);
  }
  for (size_t k = 0; k < deep; ++k) {
    ++proposed_by_position[k];
    if (static_cast<int>(k) < n_accepted) ++accepted_by_position[k];
  }
}

std::vector<double> SpecStats::acceptance_by_position() const {
  std::vector<double> out;
  for (size_t k = 0; k < proposed_by_position.size() && proposed_by_position[k] > 0; ++k)
    out.push_back(static_cast<double>(accepted_by_position[k]) /
                  static_cast<double>(proposed_by_position[k]));
  return out;
}

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
  tree_rounds += o.tree_rounds;
  if (depth_histogram.size() < o.depth_histogram.size()) depth_histogram.resize(o.depth_histogram.size(), 0);
  for (size_t i = 0; i < o.depth_histogram.size(); ++i) depth_histogram[i] += o.depth_histogram[i];
  if (rows_histogram.size() < o.rows_histogram.size()) rows_histogram.resize(o.rows_histogram.size(), 0);
  for (size_t i = 0; i < o.rows_histogram.size(); ++i) rows_histogram[i] += o.rows_histogram[i];
  if (proposed_by_position.size() < o.proposed_by_position.size()) {
    proposed_by_position.resize(o.proposed_by_position.size(), 0);
    accepted_by_position.resize(o.proposed_by_position.size(), 0);
  }
  for (size_t k = 0; k < o.proposed_by_position.size(); ++k) {
    proposed_by_position[k] += o.proposed_by_position[k];
    accepted_by_position[k] += o.accepted_by_position[k];
  }
}

SpecStats generate_speculative(model::Session& target, DraftSource& source, std::span<const int32_t> prompt,
                               const SpecOptions& options, const TokenFn& on_token, const EogFn& is_eog) {
  Run run(target, source, options, on_token, is_eog);
  return run.run(prompt);
}

}  // namespace tandem::engine
