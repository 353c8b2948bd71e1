// Continuous batching: many requests share one model, one forward per iteration.
//
// Requests come in through submit() from any thread; one thread (owned by the Scheduler) runs iterations.
// Each iteration is one Graph::mixed() forward holding, within a budget of max_rows rows:
//   - one decode row per running sequence, or its verify window when it speculates (a drafted window of
//     depth d is d + 1 rows; each sequence's speculative::Gate chooses d from its acceptance history and what
//     d more rows cost the forward the step already carries, capped by the rows the budget still holds after
//     one row per other running sequence);
//   - then chunks of waiting prompts (chunked prefill: a long prompt takes several iterations and never
//     stalls the running streams, which always get their rows first).
// Per-sequence state machine: waiting -> prefill -> decode -> finished | cancelled, or waiting -> drained
// when the scheduler drains or stops before the sequence started. A sequence enters prefill when one of
// max_running slots is free and takes its cache from the CachePool (which may hand back a prefix evaluated by
// an earlier request); it leaves by returning the cache.
//
// Speculation. Every sequence that drafts in an iteration proposes before the forward, and sources of one
// batch group (DraftSource::batch_group: a draft model shared by the sequences) propose in one batched
// drafter call. A gate that drafts nothing asks for probes on its schedule (gate.h): the drafter proposes
// without verification, plain steps score the proposal, and a drafter whose acceptance recovers drafts
// again. Rounds are priced by speculative::BatchCosts: every forward is timed by its row count, and adding d
// verify rows to a forward of R rows that B decoding sequences wait for costs 1 + B * (T(R + d) / T(R) - 1)
// (plus drafting) of a plain step, from live timings where they exist and the machine's calibrated curve
// elsewhere. Drafters that read the target's hidden states (DraftSource::target_layers) have their
// sequences' rows captured: prompt chunks and decode rows run as single-sequence groups with a capture, and
// such a sequence starts from an empty cache (reused positions were never captured).
//
// Draft trees (SchedulerOptions::tree_nodes). A sequence whose request has no grammar proposes a token tree
// each iteration instead of asking a gate for a depth (DraftSource::propose_tree, one sequence at a time); a
// tree whose nodes carry scores is cut to the subtree that promises the most tokens per unit of what its rows
// add to the forward (speculative::TreeBudget, priced by the same BatchCosts as chains, the drafting already
// spent), none meaning a plain step. The forward verifies every sequence's tree beside the other groups
// (model::Group::tree), and Settler::settle_tree commits the accepted path and moves its cache rows into
// place. A drafter that reads the target's hidden states (EAGLE-3, DFlash) has its tree window captured as
// its chains are, a row per node at consecutive positions, and settle_tree moves its taps along the accepted
// path as the cache's rows (DraftSource::on_tree_kept); one that does not follow a tree's rows (the MTP
// layer, DraftSource::follows_tree_rows) is refused: its requests fail with speculative::check_tree_source's
// error.
//
// Rows are batch-invariant and randomness is keyed by (seed, sequence id, position), so a request's tokens do
// not depend on what else was running: N concurrent greedy requests produce exactly what each produces alone.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tandem/engine/cache_pool.h"
#include "tandem/engine/stream.h"
#include "tandem/model/graph.h"
#include "tandem/sampling/sampler.h"
#include "tandem/sampling/token_mask.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/speculative/gate.h"
#include "tandem/speculative/settle.h"

namespace tandem::engine {

struct SchedulerOptions {
  int max_running = 4;    // sequences decoding or prefilling at once
  int max_waiting = 64;   // admitted requests not yet running; past it submit() answers kQueueFull
  int64_t max_rows = 64;  // rows per forward (<= the graph's capacity)
  int max_draft = 0;      // deepest verify window drafted per sequence; 0 disables speculation
  // Each speculating sequence has its own gate (its acceptance history) over these settings.
  speculative::GateSettings gate;
  // The machine's calibrated forward costs by row count (speculative/calibration.h) and the drafter's cost
  // per token; live timings replace the curve row count by row count. Empty: a forward of an untimed row
  // count is priced as free until timed (speculative::BatchCosts), so the scheduler measures what it has no
  // curve for instead of guessing.
  speculative::CostModel costs;
  // > 0: sequences that can (see "Draft trees" above) propose token trees of at most this many drafts,
  // max_draft deep at most, instead of chains; 0: chains only. A tree sequence's cache must be able to move
  // an accepted path and its drafter must follow a tree's rows (speculative::check_tree_target and
  // check_tree_source: its request fails with that error otherwise).
  int tree_nodes = 0;
};

struct Request {
  std::vector<int32_t> prompt;  // non-empty; prompt.size() < the cache capacity
  int64_t max_tokens = 16;      // >= 1
  sampling::Params sampling;
  uint64_t sequence_id = 0;  // keys the sampler's randomness together with seed and position
  int top_logprobs = -1;     // < 0: no logprobs; 0: the chosen token's; k > 0: also the k most likely
  bool stop_at_eog = true;
  // Constrained output: the matcher at the start of the output, used by the scheduler's thread only from
  // submit() on. Every step's logits are masked by it (verify windows row by row, drafts cut at the first
  // token it refuses), it advances with each committed token, and the sequence ends with kStop once the
  // grammar is complete and nothing can extend it (or an end-of-generation token it allowed was chosen).
  std::optional<sampling::GrammarMatcher> grammar;
};

// Counters since construction; gauges as of the last iteration.
struct SchedulerStats {
  int64_t waiting = 0, running = 0;
  // Of `running`, sequences already finished in the current iteration (their clients have been told) but not
  // yet removed; `running - finishing` is what a client observes right after its last token.
  int64_t finishing = 0;
  uint64_t forwards = 0, rows = 0;  // rows summed over forwards
  // Forwards by row count: [i] counts those with at most kRowBuckets[i] rows (cumulative, as Prometheus).
  static constexpr int kBuckets = 9;
  static constexpr int64_t kRowBuckets[kBuckets] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  uint64_t rows_le[kBuckets] = {};
  uint64_t prompt_tokens = 0, cached_tokens = 0;  // prompt positions requested, of which reused
  uint64_t evaluated_prompt_tokens = 0;
  uint64_t generated_tokens = 0;
  uint64_t drafted = 0, accepted = 0;  // speculation
  // Verify windows (sequence rounds with drafts) and the tokens they committed (accepted drafts plus the
  // target's own); their ratio is the tokens per verify forward of a sequence.
  uint64_t verify_windows = 0, verify_tokens = 0;
  uint64_t tree_nodes = 0;  // draft-tree nodes verified (SchedulerOptions::tree_nodes), also in `drafted`
  // Sequence steps: a sequence's rows in one forward that give it tokens (a decode row, a verify window or
  // the last prompt chunk); generated_tokens / steps is the tokens per target forward of a sequence.
  uint64_t steps = 0;
  // The gates' decisions per drafter kind, one per speculating sequence and iteration.
  struct Drafter {
    std::string kind;
    uint64_t drafting = 0, probing = 0, off = 0;
    uint64_t drafted = 0, accepted = 0;
  };
  std::vector<Drafter> drafters;
  uint64_t finished[kFinishReasons] = {};  // by Finish
  // The graph's expert residency (--expert-budget) as of the last forward; none without one. The residency
  // is the scheduler thread's (its forwards read and rebalance it): other threads see this copy, taken
  // under the stats' lock after each forward.
  std::optional<model::ResidencyStats> experts;
};

// Creates a drafter for one sequence (null: this sequence does not speculate).
using DraftFactory = std::function<std::unique_ptr<speculative::DraftSource>()>;

class Scheduler {
 public:
  enum class Admit { kOk, kQueueFull, kDraining, kInvalid };

  // graph, caches and is_eog must outlive the scheduler. The iteration thread starts here. An expert
  // residency the graph has (Graph::set_expert_residency) must be set before and is used by this thread only
  // from here on.
  Scheduler(model::Graph& graph, CachePool& caches, std::function<bool(int32_t)> is_eog,
            const SchedulerOptions& options, DraftFactory drafts = {});
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. On kOk returns its stream; otherwise null, with `error` saying why for kInvalid.
  std::shared_ptr<Stream> submit(Request request, Admit& status, std::string* error = nullptr);

  // Stops admitting, and ends every request that has not started with Finish::kDrained (within one
  // iteration; it generated nothing, so its client can retry elsewhere). Running requests continue.
  // Irreversible.
  void drain();
  bool draining() const { return draining_.load(); }
  // No request queued or running.
  bool idle() const;
  // A submit() now would answer kQueueFull: every running slot and queue place is taken.
  bool saturated() const;
  // Ends everything, pushes the final events (kCancelled for running requests, kDrained for those that never
  // started) and joins the thread (the destructor calls it).
  void stop();

  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return options_; }
  int64_t context() const { return caches_.capacity(); }

 private:
  struct Sequence;
  void loop();
  // submit()'s admission test; mutex_ held.
  bool full_locked() const;
  void admit();
  // Ends every waiting sequence with kDrained.
  void refuse_waiting();
  // One iteration: plan() the rows, run them in one forward(), settle() every sequence that had rows.
  void iterate();
  void plan();
  bool forward();  // false: the forward failed and every running sequence has finished with an error
  void settle();
  // Settles s's window (its logits from s.logit_row; drafts empty: a plain step) through its
  // speculative::Settler; with `speculating`, its gate and drafter learn the round. Returns false when s
  // finished (its final event pushed).
  bool settle(Sequence& s, std::span<const int32_t> drafts, bool speculating);
  // Settles s's tree window (its proposal's tree) through Settler::settle_tree; as settle() otherwise.
  bool settle_tree(Sequence& s);
  // Counts a settled round of s in the stats (`tree_nodes`: the nodes of a tree round, 0 otherwise).
  void count_round(Sequence& s, const speculative::SettleOutcome& out, bool speculating, size_t tree_nodes);
  void finish(Sequence& s, Finish why, const std::string& error = {});
  void emit_token(Sequence& s, int32_t token, const float* logits);
  // Counts and emits `token`, which the settle step has just appended to s.tokens; returns false when s ends
  // here (the reason left in s.ending, reported by finish() once the round is settled).
  bool commit(Sequence& s, int32_t token, const float* logits);
  // Gives s its drafter, gate and capture (when speculation is on), before its prompt runs.
  void start_drafting(Sequence& s);
  // The gate's decision for s: depth (0: a plain step) and whether to probe. base_rows: the rows the forward
  // carries with s's own row; sharing: the decoding sequences waiting for it.
  speculative::Gate::Decision choose_depth(Sequence& s, int64_t budget_left, int64_t base_rows, int sharing);
  // Proposes for every request in draft_requests_, batching sources of one batch group, and a tree for every
  // tree sequence that wants one.
  void propose_all();
  // Cuts s's proposed tree to the nodes worth verifying when the forward already carries base_rows rows
  // (s's own included) that `sharing` decoding sequences wait for (TreeBudget); a chain to s's depth.
  void budget_tree(Sequence& s, int64_t base_rows, int sharing);
  // The per-kind counters of `kind` in stats_ (mutex_ held).
  SchedulerStats::Drafter& drafter_stats(std::string_view kind);

  model::Graph& graph_;
  CachePool& caches_;
  std::function<bool(int32_t)> is_eog_;
  SchedulerOptions options_;
  DraftFactory drafts_;

  mutable std::mutex mutex_;  // guards incoming_, stats_ and stop_
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> incoming_;
  SchedulerStats stats_;
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_{0};  // queued + running

  // Iteration thread only.
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<float> logits_;  // [max_rows, n_vocab]
  // One iteration's plan, rebuilt every iteration in buffers reserved for max_running sequences, so a steady
  // state allocates none.
  struct Plan {
    std::vector<int32_t> decode_tokens;          // [decoders]
    std::vector<cache::KvCache*> decode_caches;  // [decoders]
    std::vector<Sequence*> decoders, verifiers, prefills;
    std::vector<cache::KvCache*> group_caches;  // one per verify or prompt group; groups borrow spans of it
    std::vector<model::Group> groups;
    int64_t rows = 0;
  };
  Plan plan_;
  std::vector<Sequence*> ended_;  // sequences finished while settling
  speculative::BatchCosts costs_;
  std::vector<double> round_cost_;                         // [max_draft + 1]
  std::vector<double> tree_cost_;                          // [tree_nodes + 1]
  std::vector<speculative::DraftRequest> draft_requests_;  // [max_running]
  std::vector<double> logprob_scratch_;
  std::vector<int32_t> order_scratch_;
  std::thread thread_;
};

}  // namespace tandem::engine
