#include "tandem/engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>

#include "tandem/speculative/settle.h"
#include "tandem/speculative/tree_budget.h"
#include "tandem/util/error.h"

namespace tandem::engine {

struct Scheduler::Sequence {
  enum class State { kWaiting, kPrefill, kDecode };

  Sequence(Request r, std::shared_ptr<Stream> st)
      : req(std::move(r)), stream(std::move(st)), sampler(req.sampling), tokens(req.prompt) {}

  Request req;
  std::shared_ptr<Stream> stream;
  sampling::Sampler sampler;
  State state = State::kWaiting;
  std::unique_ptr<cache::KvCache> cache;
  // The prompt, then every committed token. In decode, the last one is not yet in the cache:
  // cache->length() == tokens.size() - 1 and the next forward row feeds it.
  std::vector<int32_t> tokens;
  int64_t evaluated = 0;  // prefill: prompt positions in the cache
  int64_t generated = 0;
  int64_t cached = 0;           // prompt positions reused from the cache pool
  std::vector<int32_t> window;  // this iteration's rows (prompt chunk or verify window)
  int64_t logit_row = 0;        // first row of this sequence's logits in this iteration

  std::unique_ptr<speculative::DraftSource> draft;
  std::optional<speculative::Gate> gate;
  speculative::Draft proposal;
  speculative::Probe probe;
  speculative::Settler settler;
  uint64_t drafted = 0, accepted = 0;
  int want = 0;          // this iteration's proposal depth (0: none); a tree's node limit
  bool probing = false;  // the proposal is a probe, not a window
  // Draft trees (SchedulerOptions::tree_nodes): whether this sequence proposes them, this iteration's depth
  // limit, whether its window is a tree, that window's cache::TreeMask and the budget that cuts its trees.
  bool trees = false;
  int want_depth = 0;
  bool tree_window = false;
  std::vector<int32_t> tree_parent, tree_depth;
  cache::TreeMask tree_mask;
  speculative::TreeBudget tree_budget;
  // The gate's decisions not yet counted in the stats.
  uint64_t drafting = 0, probes = 0, off = 0;
  // Drafters that read the target: the capture of this sequence's groups, and the position of their first
  // row.
  model::CaptureFn capture;
  int64_t capture_pos = 0;
  Finish ending = Finish::kStop;  // why commit() ended the sequence, reported once its round is settled
};

Scheduler::Scheduler(model::Graph& graph, CachePool& caches, std::function<bool(int32_t)> is_eog,
                     const SchedulerOptions& options, DraftFactory drafts)
    : graph_(graph),
      caches_(caches),
      is_eog_(std::move(is_eog)),
      options_(options),
      drafts_(std::move(drafts)),
      costs_(options.costs, static_cast<int>(options.max_rows), options.gate.timing_weight,
             options.gate.timing_samples) {
  if (options_.max_running < 1) throw Error("the scheduler needs at least one running sequence (--parallel)");
  if (options_.max_waiting < 0) throw Error("the request queue bound must be >= 0");
  if (options_.max_rows < options_.max_running)
    throw Error("the row budget (" + std::to_string(options_.max_rows) +
                ") must hold one decode row per running sequence (" + std::to_string(options_.max_running) +
                ")");
  options_.max_draft = std::clamp(options_.max_draft, 0, 15);
  if (options_.tree_nodes < 0) throw Error("--tree-nodes must be 0 (chains) or a positive node budget");
  logits_.resize(static_cast<size_t>(options_.max_rows * graph_.n_vocab()));
  const auto n = static_cast<size_t>(options_.max_running);
  plan_.decode_tokens.reserve(n);
  plan_.decode_caches.reserve(n);
  plan_.decoders.reserve(n);
  plan_.verifiers.reserve(n);
  plan_.prefills.reserve(n);
  plan_.group_caches.reserve(n);
  plan_.groups.reserve(n + 1);
  ended_.reserve(n);
  round_cost_.reserve(static_cast<size_t>(options_.max_draft) + 1);
  tree_cost_.reserve(static_cast<size_t>(std::min<int64_t>(options_.tree_nodes, options_.max_rows)) + 1);
  draft_requests_.reserve(n);
  if (const model::ExpertResidency* r = graph_.expert_residency()) stats_.experts = r->stats();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  stop();
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::drain() {
  {
    std::lock_guard lock(mutex_);
    draining_.store(true);
  }
  wake_.notify_all();
}

bool Scheduler::idle() const {
  return active_.load() == 0;
}

bool Scheduler::full_locked() const {
  const int64_t queued = active_.load() - static_cast<int64_t>(stats_.running);
  return queued >= options_.max_waiting + std::max<int64_t>(0, options_.max_running - stats_.running);
}

bool Scheduler::saturated() const {
  std::lock_guard lock(mutex_);
  return full_locked();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::shared_ptr<Stream> Scheduler::submit(Request request, Admit& status, std::string* error) {
  auto invalid = [&](const std::string& why) -> std::shared_ptr<Stream> {
    status = Admit::kInvalid;
    if (error) *error = why;
    return nullptr;
  };
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  if (n == 0) return invalid("the prompt is empty");
  if (n >= context())
    return invalid("the prompt has " + std::to_string(n) + " tokens but the context holds " +
                   std::to_string(context()) + " (including at least one generated token)");
  if (request.max_tokens < 1) return invalid("max_tokens must be at least 1");
  for (int32_t t : request.prompt)
    if (t < 0 || t >= graph_.n_vocab()) return invalid("token id " + std::to_string(t) + " is out of range");
  std::shared_ptr<Stream> stream = std::make_shared<Stream>();
  std::unique_ptr<Sequence> seq;
  try {
    seq = std::make_unique<Sequence>(std::move(request), stream);
  } catch (const Error& e) {
    return invalid(e.what());
  }
  {
    std::lock_guard lock(mutex_);
    if (stop_ || draining_.load()) {
      status = Admit::kDraining;
      return nullptr;
    }
    if (full_locked()) {
      status = Admit::kQueueFull;
      return nullptr;
    }
    ++active_;
    incoming_.push_back(std::move(seq));
  }
  wake_.notify_one();
  status = Admit::kOk;
  return stream;
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      // Sleeps only when there is no work at all: sequences left in waiting_ after every running one
      // finished must be admitted on the next pass, not when some later submit() happens to wake the loop.
      wake_.wait(lock, [&] { return stop_ || !incoming_.empty() || !running_.empty() || !waiting_.empty(); });
      if (stop_) break;
      while (!incoming_.empty()) {
        waiting_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
    }
    // submit() refuses once draining_ is set, so after this pass nothing waits any more.
    if (draining_.load()) refuse_waiting();
    admit();
    if (!running_.empty()) iterate();
    std::lock_guard lock(mutex_);
    stats_.running = static_cast<int64_t>(running_.size());
    stats_.finishing = 0;
    stats_.waiting = static_cast<int64_t>(waiting_.size() + incoming_.size());
  }
  std::deque<std::unique_ptr<Sequence>> rest;
  {
    std::lock_guard lock(mutex_);
    rest.swap(incoming_);
  }
  for (auto& s : rest) waiting_.push_back(std::move(s));
  refuse_waiting();
  for (auto& s : running_) finish(*s, Finish::kCancelled);
  running_.clear();
}

void Scheduler::refuse_waiting() {
  // A client that already went away hears nothing either way; counting it as cancelled keeps the drained
  // count to requests that were turned away.
  for (auto& s : waiting_) finish(*s, s->stream->cancelled() ? Finish::kCancelled : Finish::kDrained);
  waiting_.clear();
}

void Scheduler::admit() {
  auto cancelled = [&](std::unique_ptr<Sequence>& s) {
    if (!s->stream->cancelled()) return false;
    finish(*s, Finish::kCancelled);
    return true;
  };
  std::erase_if(waiting_, cancelled);
  std::erase_if(running_, cancelled);
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_running) {
    std::unique_ptr<Sequence> s = std::move(waiting_.front());
    waiting_.pop_front();
    try {
      CachePool::Lease lease = caches_.acquire(s->req.prompt);
      s->cache = std::move(lease.cache);
      s->state = Sequence::State::kPrefill;
      start_drafting(*s);
      if (s->capture) {
        // The drafter needs the target's hidden states of every prompt position: none are reused.
        s->cache->truncate(0);
        lease.reused = 0;
      }
      s->cached = s->evaluated = lease.reused;
      running_.push_back(std::move(s));
    } catch (const std::exception& e) {
      finish(*s, Finish::kError, e.what());
    }
  }
}

speculative::Gate::Decision Scheduler::choose_depth(Sequence& s, int64_t budget_left, int64_t base_rows,
                                                    int sharing) {
  int64_t d = std::min<int64_t>(options_.max_draft, budget_left - 1);
  // The window's rows sit at positions tokens.size() - 1 ... + d, inside the context; drafting past
  // max_tokens is wasted.
  d = std::min(d, caches_.capacity() - static_cast<int64_t>(s.tokens.size()));
  d = std::min(d, s.req.max_tokens - s.generated - 1);
  d = std::max<int64_t>(d, 0);
  round_cost_.assign(static_cast<size_t>(d) + 1, 1.0);
  // A deeper window never costs less than a shallower one: the ratios mix timed row counts with calibrated
  // ones, and a dip between them would make the marginal rows look free.
  for (int64_t k = 1; k <= d; ++k)
    round_cost_[static_cast<size_t>(k)] =
        std::max(round_cost_[static_cast<size_t>(k - 1)],
                 costs_.round_cost(static_cast<int>(k), static_cast<int>(base_rows), sharing));
  // With no room for a window the gate still counts the round, so its probes stay on schedule.
  return s.gate->decide_priced(round_cost_);
}

void Scheduler::iterate() {
  plan();
  if (!forward()) return;
  settle();
}

void Scheduler::propose_all() {
  auto& rs = draft_requests_;
  // Requests of one batch group side by side, in running order within it (a stable insertion sort: a few
  // requests, and no allocation).
  auto key = [](const speculative::DraftRequest& r) {
    return reinterpret_cast<uintptr_t>(r.source->batch_group());
  };
  for (size_t i = 1; i < rs.size(); ++i)
    for (size_t j = i; j > 0 && key(rs[j - 1]) > key(rs[j]); --j) std::swap(rs[j - 1], rs[j]);
  for (size_t i = 0; i < rs.size();) {
    const void* group = rs[i].source->batch_group();
    size_t j = i + 1;
    while (group && j < rs.size() && rs[j].source->batch_group() == group) ++j;
    if (group)
      rs[i].source->propose_batch(std::span<const speculative::DraftRequest>(rs).subspan(i, j - i));
    else
      rs[i].source->propose(rs[i].committed, rs[i].max_depth, *rs[i].out);
    i = j;
  }
  // Trees, one sequence at a time (no source drafts trees in batches).
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (s.state == Sequence::State::kDecode && s.trees && s.want > 0)
      s.draft->propose_tree(s.tokens, s.want, s.want_depth, s.proposal);
  }
}

void Scheduler::plan() {
  Plan& p = plan_;
  p.decode_tokens.clear();
  p.decode_caches.clear();
  p.decoders.clear();
  p.verifiers.clear();
  p.prefills.clear();
  p.group_caches.clear();
  p.groups.clear();
  int64_t budget = options_.max_rows;

  // Decode rows first: running streams never wait for prompts. Each has a row whatever happens, so a
  // window may only take rows beyond one per remaining decoder.
  int64_t n_decoding = 0;
  for (auto& s : running_) n_decoding += s->state == Sequence::State::kDecode ? 1 : 0;
  int64_t reserved = n_decoding;
  int64_t planned = 0;  // rows of the decoding sequences already planned
  draft_requests_.clear();
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (s.state != Sequence::State::kDecode) continue;
    --reserved;
    s.want = 0;
    s.probing = false;
    if (s.trees) {
      // The tree's nodes sit at positions tokens.size() ... + nodes, inside the context, and take rows the
      // budget holds; its paths end where max_tokens does.
      const int64_t room = caches_.capacity() - static_cast<int64_t>(s.tokens.size());
      const int64_t nodes = std::min<int64_t>({options_.tree_nodes, budget - reserved - 1, room});
      const int64_t depth = std::min<int64_t>({options_.max_draft, s.req.max_tokens - s.generated - 1, room});
      s.want_depth = static_cast<int>(std::max<int64_t>(depth, 0));
      s.want = nodes > 0 && depth > 0 ? static_cast<int>(nodes) : 0;
    } else if (s.gate) {
      // Priced against the forward as planned so far: earlier windows, this row, a row per later decoder.
      const speculative::Gate::Decision decision =
          choose_depth(s, budget - reserved, planned + 1 + reserved, static_cast<int>(n_decoding));
      if (decision.depth > 0) {
        s.want = decision.depth;
        ++s.drafting;
      } else if (decision.probe && !s.probe.active()) {
        s.want = s.gate->settings().probe_depth;
        s.probing = true;
        ++s.probes;
      } else {
        ++s.off;
      }
    }
    const int64_t rows = 1 + (s.probing ? 0 : s.want);
    planned += rows;
    budget -= rows;
    if (s.want > 0 && !s.trees)
      draft_requests_.push_back(
          {s.draft.get(), s.tokens, s.want, s.probing ? &s.probe.draft() : &s.proposal});
  }
  propose_all();

  budget = options_.max_rows;
  int64_t placed = 0;          // rows of the decoding sequences placed so far
  int64_t later = n_decoding;  // decoding sequences not yet placed
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (s.state != Sequence::State::kDecode) continue;
    --later;
    s.tree_window = false;
    if (s.trees) {
      if (s.want > 0) {
        // Priced against the forward as placed so far: earlier windows, this row, a row per later decoder.
        budget_tree(s, placed + 1 + later, static_cast<int>(n_decoding));
        ++(s.proposal.tokens.empty() ? s.off : s.drafting);
      } else {
        ++s.off;
      }
    } else if (s.probing) {
      s.draft->accept(s.tokens, 0);
      s.probe.start();
    } else if (s.want > 0) {
      if (s.proposal.tokens.size() > static_cast<size_t>(s.want)) s.proposal.tokens.resize(s.want);
      if (s.req.grammar) {
        // Verifying drafts past a token the grammar refuses is wasted rows: cut them. A deterministic draft
        // is cut before that token (its rejection would draw from the masked p, as a plain step does); a
        // sampled one keeps it, as its rejection draws from the residual max(0, p - q), which keeps the
        // output's distribution the target's only if every drafted token goes through verification.
        sampling::GrammarMatcher& g = *s.req.grammar;
        const size_t at = g.position();
        const size_t valid = g.accept_prefix(s.proposal.tokens);
        g.rollback_to(at);
        s.proposal.tokens.resize(std::min(s.proposal.tokens.size(), valid + (s.proposal.sampled ? 1 : 0)));
      }
      // A verified round observes the drafter directly.
      if (!s.proposal.tokens.empty()) s.probe.cancel();
    }
    if (s.draft && (s.probing || s.want == 0)) s.proposal.clear();
    if (s.draft && (!s.proposal.tokens.empty() || s.capture)) {
      // A window, or a plain step that must be captured: a group of its own.
      s.window.assign(1, s.tokens.back());
      s.window.insert(s.window.end(), s.proposal.tokens.begin(), s.proposal.tokens.end());
      if (!s.proposal.tree.empty()) {
        // The pending token is the window tree's node 0, draft node i its node i + 1.
        s.tree_window = true;
        s.tree_parent.assign(1, -1);
        s.tree_depth.assign(1, 0);
        for (size_t i = 0; i < s.proposal.tokens.size(); ++i) {
          s.tree_parent.push_back(s.proposal.tree.parent[i] + 1);
          s.tree_depth.push_back(s.proposal.tree.depth[i]);
        }
        s.tree_mask = {s.cache->length(), s.tree_parent, s.tree_depth};
      }
      p.verifiers.push_back(&s);
      budget -= static_cast<int64_t>(s.window.size());
      placed += static_cast<int64_t>(s.window.size());
    } else {
      p.decode_tokens.push_back(s.tokens.back());
      p.decode_caches.push_back(s.cache.get());
      p.decoders.push_back(&s);
      budget -= 1;
      placed += 1;
    }
  }
  // Then prompt chunks, oldest first, in what the budget leaves.
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (s.state != Sequence::State::kPrefill || budget <= 0) continue;
    const int64_t left = static_cast<int64_t>(s.req.prompt.size()) - s.evaluated;
    const int64_t chunk = std::min(left, budget);
    s.window.assign(s.req.prompt.begin() + s.evaluated, s.req.prompt.begin() + s.evaluated + chunk);
    p.prefills.push_back(&s);
    budget -= chunk;
  }

  int64_t logit_rows = 0;
  p.rows = 0;
  if (!p.decoders.empty()) {
    p.groups.push_back({model::Phase::kDecode, p.decode_tokens, p.decode_caches, nullptr, nullptr});
    for (size_t i = 0; i < p.decoders.size(); ++i) p.decoders[i]->logit_row = static_cast<int64_t>(i);
    logit_rows = p.rows = static_cast<int64_t>(p.decoders.size());
  }
  // group_caches holds at most max_running entries within its reserved capacity, so the spans stay valid.
  auto single = [&](Sequence& s, model::Phase phase) {
    p.group_caches.push_back(s.cache.get());
    s.capture_pos = s.cache->length();
    p.groups.push_back({phase, s.window, std::span<cache::KvCache* const>(&p.group_caches.back(), 1),
                        s.capture ? &s.capture : nullptr,
                        phase == model::Phase::kVerify && s.tree_window ? &s.tree_mask : nullptr});
    s.logit_row = logit_rows;
    p.rows += static_cast<int64_t>(s.window.size());
  };
  for (Sequence* s : p.verifiers) {
    single(*s, model::Phase::kVerify);
    logit_rows += static_cast<int64_t>(s->window.size());
  }
  for (Sequence* s : p.prefills) {
    const bool last =
        s->evaluated + static_cast<int64_t>(s->window.size()) == static_cast<int64_t>(s->req.prompt.size());
    single(*s, last ? model::Phase::kPrompt : model::Phase::kAppendKnown);
    logit_rows += last ? 1 : 0;
  }
}

void Scheduler::budget_tree(Sequence& s, int64_t base_rows, int sharing) {
  speculative::Draft& d = s.proposal;
  if (d.tree.empty()) {
    // A chain (a source without trees, or an empty proposal): verified as one, to the tree's depth.
    d.tokens.resize(std::min(d.tokens.size(), static_cast<size_t>(std::min(s.want, s.want_depth))));
    return;
  }
  if (!speculative::TreeBudget::scored(d)) return;
  // Verifying n nodes adds n rows to the forward; the drafting is spent either way.
  tree_cost_.assign(d.tokens.size() + 1, 1.0);
  const auto base = static_cast<int>(base_rows);
  for (size_t n = 1; n < tree_cost_.size(); ++n)  // never less for more nodes, as for chains
    tree_cost_[n] = std::max(tree_cost_[n - 1], costs_.rows_cost(static_cast<int>(n), base, sharing));
  const size_t keep = s.tree_budget.choose(d, tree_cost_);
  if (keep == 0)
    d.clear();
  else
    s.tree_budget.prune(d, keep);
}

bool Scheduler::forward() {
  try {
    const auto start = std::chrono::steady_clock::now();
    graph_.mixed(plan_.groups, logits_.data());
    costs_.record(static_cast<int>(plan_.rows),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return true;
  } catch (const std::exception& e) {
    // The caches of this batch are in an unknown state: their sequences fail and the caches are dropped.
    for (auto& s : running_) {
      finish(*s, Finish::kError, std::string("forward failed: ") + e.what());
    }
    running_.clear();
    return false;
  }
}

void Scheduler::settle() {
  SchedulerStats delta;
  delta.forwards = 1;
  delta.rows = static_cast<uint64_t>(plan_.rows);
  ended_.clear();
  for (Sequence* s : plan_.decoders)
    if (!settle(*s, {}, true)) ended_.push_back(s);
  for (Sequence* s : plan_.verifiers)
    if (!(s->tree_window ? settle_tree(*s)
                         : settle(*s, std::span<const int32_t>(s->window).subspan(1), true)))
      ended_.push_back(s);
  for (Sequence* s : plan_.prefills) {
    s->evaluated += static_cast<int64_t>(s->window.size());
    delta.evaluated_prompt_tokens += s->window.size();
    if (s->evaluated < static_cast<int64_t>(s->req.prompt.size())) continue;
    s->state = Sequence::State::kDecode;
    // The prompt's last row gives the first token: a round without a window, nothing to teach the gate or
    // the drafter (which has just begun on the prompt).
    if (!settle(*s, {}, false)) ended_.push_back(s);
  }
  if (!ended_.empty())
    std::erase_if(running_, [&](const std::unique_ptr<Sequence>& s) {
      return std::find(ended_.begin(), ended_.end(), s.get()) != ended_.end();
    });

  std::lock_guard lock(mutex_);
  stats_.forwards += delta.forwards;
  stats_.rows += delta.rows;
  for (int b = 0; b < SchedulerStats::kBuckets; ++b)
    stats_.rows_le[b] += plan_.rows <= SchedulerStats::kRowBuckets[b] ? 1 : 0;
  stats_.evaluated_prompt_tokens += delta.evaluated_prompt_tokens;
  if (const model::ExpertResidency* r = graph_.expert_residency()) stats_.experts = r->stats();
}

bool Scheduler::settle(Sequence& s, std::span<const int32_t> drafts, bool speculating) {
  const auto V = static_cast<size_t>(graph_.n_vocab());
  speculative::Window window;
  window.logits =
      std::span<const float>(logits_).subspan(static_cast<size_t>(s.logit_row) * V, (drafts.size() + 1) * V);
  window.drafts = drafts;
  if (!drafts.empty() && s.proposal.sampled)
    window.q = std::span<const sampling::Distribution>(s.proposal.q.data(), drafts.size());
  speculative::Gate* gate = speculating && s.gate ? &*s.gate : nullptr;
  speculative::DraftSource* source = speculating ? s.draft.get() : nullptr;
  try {
    const speculative::SettleOutcome out = s.settler.settle(
        window,
        {s.tokens, s.sampler, s.req.sequence_id, *s.cache, gate, source,
         s.req.grammar ? &*s.req.grammar : nullptr},
        [&](int32_t token, int row) {
          // A plain step's token was drawn from the target's p, which scores a probe.
          if (gate && s.probe.active())
            s.probe.observe(token, drafts.empty() ? &s.settler.target_distribution(0) : nullptr, *gate);
          return commit(s, token, window.logits.data() + static_cast<size_t>(row) * V);
        });
    count_round(s, out, speculating, 0);
    if (!out.stopped) return true;
    finish(s, s.ending);
  } catch (const std::exception& e) {
    finish(s, Finish::kError, e.what());
  }
  return false;
}

bool Scheduler::settle_tree(Sequence& s) {
  const auto V = static_cast<size_t>(graph_.n_vocab());
  const speculative::Draft& d = s.proposal;
  const size_t nodes = d.tokens.size();
  speculative::TreeWindow window;
  window.logits =
      std::span<const float>(logits_).subspan(static_cast<size_t>(s.logit_row) * V, (nodes + 1) * V);
  window.drafts = d.tokens;
  window.parent = d.tree.parent;
  if (d.sampled) window.q = std::span<const sampling::Distribution>(d.q.data(), nodes);
  try {
    // No gate learns from trees, and tree sequences have no grammar.
    const speculative::SettleOutcome out = s.settler.settle_tree(
        window, {s.tokens, s.sampler, s.req.sequence_id, *s.cache, nullptr, s.draft.get(), nullptr},
        [&](int32_t token, int row) {
          return commit(s, token, window.logits.data() + static_cast<size_t>(row) * V);
        });
    s.tree_budget.record(d, out.accepted);
    count_round(s, out, true, nodes);
    if (!out.stopped) return true;
    finish(s, s.ending);
  } catch (const std::exception& e) {
    finish(s, Finish::kError, e.what());
  }
  return false;
}

void Scheduler::count_round(Sequence& s, const speculative::SettleOutcome& out, bool speculating,
                            size_t tree_nodes) {
  s.drafted += static_cast<uint64_t>(out.drafted);
  s.accepted += static_cast<uint64_t>(out.accepted);
  // Counted before the sequence's final event goes out, so a client that reads the metrics after its last
  // token sees its own rounds (the chat page computes a reply's acceptance that way).
  std::lock_guard lock(mutex_);
  ++stats_.steps;
  if (out.drafted > 0) {
    stats_.drafted += static_cast<uint64_t>(out.drafted);
    stats_.accepted += static_cast<uint64_t>(out.accepted);
    ++stats_.verify_windows;
    stats_.verify_tokens += static_cast<uint64_t>(out.committed);
    stats_.tree_nodes += tree_nodes;
  }
  if (s.draft && speculating) {
    SchedulerStats::Drafter& d = drafter_stats(s.draft->kind());
    d.drafted += static_cast<uint64_t>(out.drafted);
    d.accepted += static_cast<uint64_t>(out.accepted);
    d.drafting += std::exchange(s.drafting, 0);
    d.probing += std::exchange(s.probes, 0);
    d.off += std::exchange(s.off, 0);
  }
}

SchedulerStats::Drafter& Scheduler::drafter_stats(std::string_view kind) {
  for (SchedulerStats::Drafter& d : stats_.drafters)
    if (d.kind == kind) return d;
  stats_.drafters.push_back({std::string(kind)});
  return stats_.drafters.back();
}

void Scheduler::start_drafting(Sequence& s) {
  if (!drafts_ || options_.max_draft <= 0) return;
  s.draft = drafts_();
  if (!s.draft) return;
  s.draft->begin(s.req.prompt,
                 {s.req.sampling, s.req.sequence_id, s.req.grammar ? &*s.req.grammar : nullptr});
  const std::span<const int64_t> layers = s.draft->target_layers();
  // A drafter that reads the target follows a tree's rows through the sequence's captures (its tree window
  // is one group with the capture, and settle_tree compacts its taps as the cache), or it cannot draft trees
  // at all: refused whatever the request. Trees are not verified under a grammar: such a request keeps
  // chains.
  if (options_.tree_nodes > 0) speculative::check_tree_source(*s.draft);
  s.trees = options_.tree_nodes > 0 && !s.req.grammar;
  if (s.trees)
    speculative::check_tree_target(s.cache->store().geometry(), s.cache->type());
  else
    s.gate.emplace(options_.gate, options_.costs, options_.max_draft);
  if (layers.empty()) return;
  const auto width = static_cast<size_t>(graph_.model().config().n_embd);
  s.capture = [&s, layers, width](int64_t layer, const float* hidden, int64_t n_rows) {
    if (std::find(layers.begin(), layers.end(), layer) == layers.end()) return;
    s.draft->on_target_hidden(layer, {hidden, width * static_cast<size_t>(n_rows)}, n_rows, s.capture_pos);
  };
}

bool Scheduler::commit(Sequence& s, int32_t token, const float* logits) {
  ++s.generated;
  {
    std::lock_guard lock(mutex_);
    ++stats_.generated_tokens;
  }
  // The settle step drew `token` from the grammar's mask, so the grammar takes it.
  if (s.req.grammar && !s.req.grammar->accept_token(token))
    throw Error("internal: token " + std::to_string(token) + " was committed against the output's grammar");
  if (s.req.stop_at_eog && is_eog_ && is_eog_(token)) {
    s.ending = Finish::kStop;
    return false;
  }
  emit_token(s, token, logits);
  if (s.req.grammar && (s.req.grammar->terminated() || s.req.grammar->must_end())) {
    s.ending = Finish::kStop;
    return false;
  }
  // The next row would sit at position tokens.size() - 1, which must be inside the context.
  if (s.generated >= s.req.max_tokens || static_cast<int64_t>(s.tokens.size()) > caches_.capacity()) {
    s.ending = Finish::kLength;
    return false;
  }
  return true;
}

void Scheduler::emit_token(Sequence& s, int32_t token, const float* logits) {
  Event ev;
  ev.kind = Event::Kind::kToken;
  ev.token.id = token;
  if (s.req.top_logprobs >= 0) {
    const auto V = static_cast<size_t>(graph_.n_vocab());
    logprob_scratch_.resize(V);
    sampling::log_softmax(std::span<const float>(logits, V), logprob_scratch_);
    ev.token.logprob = logprob_scratch_[static_cast<size_t>(token)];
    const auto k = std::min(static_cast<size_t>(s.req.top_logprobs), V);
    if (k > 0) {
      order_scratch_.resize(V);
      std::iota(order_scratch_.begin(), order_scratch_.end(), 0);
      const auto& lp = logprob_scratch_;
      std::partial_sort(order_scratch_.begin(), order_scratch_.begin() + static_cast<std::ptrdiff_t>(k),
                        order_scratch_.end(), [&](int32_t a, int32_t b) {
                          const double x = lp[static_cast<size_t>(a)], y = lp[static_cast<size_t>(b)];
                          return x > y || (x == y && a < b);
                        });
      for (size_t i = 0; i < k; ++i)
        ev.token.top.emplace_back(order_scratch_[i], lp[static_cast<size_t>(order_scratch_[i])]);
    }
  }
  s.stream->push(std::move(ev));
}

void Scheduler::finish(Sequence& s, Finish why, const std::string& error) {
  const bool was_running = s.cache != nullptr;  // a cache is leased on admission
  if (s.cache) {
    // A failed forward leaves the cache in an unknown state: keep none of its positions.
    const size_t keep = why == Finish::kError ? 0 : s.tokens.size();
    caches_.release(std::move(s.cache), std::span<const int32_t>(s.tokens.data(), keep));
  }
  Event ev;
  ev.kind = Event::Kind::kDone;
  ev.finish = why;
  ev.error = error;
  ev.usage.prompt_tokens = static_cast<int64_t>(s.req.prompt.size());
  ev.usage.completion_tokens = s.generated;
  ev.usage.cached_tokens = s.cached;
  {
    std::lock_guard lock(mutex_);
    stats_.finished[static_cast<int>(why)] += 1;
    stats_.prompt_tokens += s.req.prompt.size();
    stats_.cached_tokens += static_cast<uint64_t>(s.cached);
    // Counted before the client hears of the end (the loop recounts `running` after the iteration).
    if (was_running) ++stats_.finishing;
  }
  --active_;
  s.stream->push(std::move(ev));
}

}  // namespace tandem::engine
