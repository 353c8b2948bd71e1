#include "tandem/server/metrics.h"

#include <sstream>

namespace tandem::server {

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::first_token(double seconds) {
  std::lock_guard lock(mutex_);
  for (int i = 0; i < kTtftBuckets; ++i) ttft_le_[i] += seconds <= kTtftLe[i] ? 1 : 0;
  ++ttft_count_;
  ttft_sum_ += seconds;
}

std::string Metrics::render(const engine::SchedulerStats& s, const engine::EmbeddingStats& e) const {
  std::ostringstream o;
  auto family = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    family(name, "counter", help);
    o << name << ' ' << v << '\n';
  };
  auto gauge = [&](const char* name, const char* help, int64_t v) {
    family(name, "gauge", help);
    o << name << ' ' << v << '\n';
  };
  {
    std::lock_guard lock(mutex_);
    family("tandem_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
    for (const auto& [key, n] : requests_)
      o << "tandem_requests_total{endpoint=\"" << key.first << "\",status=\"" << key.second << "\"} " << n
        << '\n';
    family("tandem_time_to_first_token_seconds", "histogram",
           "Time from a generation request's arrival to its first token.");
    for (int i = 0; i < kTtftBuckets; ++i)
      o << "tandem_time_to_first_token_seconds_bucket{le=\"" << kTtftLe[i] << "\"} " << ttft_le_[i] << '\n';
    o << "tandem_time_to_first_token_seconds_bucket{le=\"+Inf\"} " << ttft_count_ << '\n'
      << "tandem_time_to_first_token_seconds_sum " << ttft_sum_ << '\n'
      << "tandem_time_to_first_token_seconds_count " << ttft_count_ << '\n';
  }
  counter("tandem_prompt_tokens_total", "Prompt tokens of finished requests.", s.prompt_tokens);
  counter("tandem_prompt_tokens_cached_total", "Prompt tokens reused from the prefix cache.",
          s.cached_tokens);
  counter("tandem_prompt_tokens_evaluated_total", "Prompt tokens run through the model.",
          s.evaluated_prompt_tokens);
  counter("tandem_generated_tokens_total", "Tokens generated (end-of-generation tokens included).",
          s.generated_tokens);
  gauge("tandem_queue_depth", "Requests waiting for a running slot.", s.waiting);
  gauge("tandem_running_sequences", "Sequences prefilling or decoding.", s.running - s.finishing);
  family("tandem_forward_rows", "histogram",
         "Rows per model forward (decode rows, prompt chunks, verify windows).");
  for (int i = 0; i < engine::SchedulerStats::kBuckets; ++i)
    o << "tandem_forward_rows_bucket{le=\"" << engine::SchedulerStats::kRowBuckets[i] << "\"} "
      << s.rows_le[i] << '\n';
  o << "tandem_forward_rows_bucket{le=\"+Inf\"} " << s.forwards << '\n'
    << "tandem_forward_rows_sum " << s.rows << '\n'
    << "tandem_forward_rows_count " << s.forwards << '\n';
  counter("tandem_draft_tokens_total", "Tokens proposed by drafters and verified.", s.drafted);
  counter("tandem_draft_accepted_total", "Drafted tokens the target accepted.", s.accepted);
  counter("tandem_verify_windows_total", "Verify windows: sequence rounds that verified drafts.",
          s.verify_windows);
  counter("tandem_verify_tokens_total",
          "Tokens committed by verify windows (accepted drafts and the target's).", s.verify_tokens);
  family("tandem_tokens_per_verify_forward", "gauge",
         "Tokens a sequence committed per verify window since start (verify tokens / verify windows).");
  o << "tandem_tokens_per_verify_forward "
    << (s.verify_windows > 0 ? static_cast<double>(s.verify_tokens) / static_cast<double>(s.verify_windows)
                             : 0.0)
    << '\n';
  counter("tandem_tree_nodes_verified_total",
          "Draft-tree nodes verified (--tree-nodes; 0 while drafts are chains).", s.tree_nodes);
  family("tandem_gate_decisions_total", "counter",
         "The adaptive gate's round decisions per speculating sequence, by drafter kind and decision "
         "(drafting: a verify window; probing: an unverified proposal while idle; off: a plain step).");
  for (const auto& d : s.drafters)
    for (const auto& [decision, n] :
         {std::pair<const char*, uint64_t>{"drafting", d.drafting}, {"probing", d.probing}, {"off", d.off}})
      o << "tandem_gate_decisions_total{drafter=\"" << d.kind << "\",decision=\"" << decision << "\"} " << n
        << '\n';
  family("tandem_drafter_tokens_total", "counter", "Drafted tokens verified, by drafter kind.");
  for (const auto& d : s.drafters)
    o << "tandem_drafter_tokens_total{drafter=\"" << d.kind << "\"} " << d.drafted << '\n';
  family("tandem_drafter_accepted_total", "counter", "Drafted tokens accepted, by drafter kind.");
  for (const auto& d : s.drafters)
    o << "tandem_drafter_accepted_total{drafter=\"" << d.kind << "\"} " << d.accepted << '\n';
  family("tandem_finished_requests_total", "counter", "Generations finished, by reason.");
  for (auto f : {engine::Finish::kStop, engine::Finish::kLength, engine::Finish::kCancelled,
                 engine::Finish::kError, engine::Finish::kDrained})
    o << "tandem_finished_requests_total{reason=\"" << engine::finish_name(f) << "\"} "
      << s.finished[static_cast<int>(f)] << '\n';
  counter("tandem_embedding_requests_total", "Embedding requests answered.", e.requests);
  counter("tandem_embedding_inputs_total", "Inputs embedded (several per request where it sent a list).",
          e.inputs);
  counter("tandem_embedding_tokens_total", "Tokens of the inputs embedded.", e.tokens);
  counter("tandem_embedding_batches_total", "Embedding batches run (each holds one or more requests).",
          e.rounds);
  gauge("tandem_embedding_queue_depth", "Embedding requests waiting for the next batch.", e.waiting);
  // Expert residency (serve --expert-budget): zeros without a budget, as the speculation counters are
  // without a drafter.
  const model::ResidencyStats x = s.experts.value_or(model::ResidencyStats{});
  gauge("tandem_expert_budget_bytes",
        "Bytes --expert-budget lets resident expert copies take (0: no budget).",
        static_cast<int64_t>(x.budget_bytes));
  gauge("tandem_expert_resident_bytes", "Bytes of the routed experts resident (copied) now.",
        static_cast<int64_t>(x.resident_bytes));
  gauge("tandem_expert_resident_experts", "Routed experts resident now.", x.resident_experts);
  gauge("tandem_expert_routed_experts", "Routed experts of all mixture-of-experts layers (0: no budget).",
        x.experts);
  counter("tandem_expert_reads_total", "Routed expert reads by generation forwards (one per expert run).",
          x.reads);
  counter("tandem_expert_reads_resident_total", "Of those, reads served from a resident copy.",
          x.resident_reads);
  counter("tandem_expert_read_bytes_total", "Expert bytes those reads took.",
          static_cast<uint64_t>(x.bytes_read));
  counter("tandem_expert_read_bytes_resident_total", "Of those, bytes read from resident copies.",
          static_cast<uint64_t>(x.resident_bytes_read));
  family("tandem_expert_read_bytes_resident_fraction", "gauge",
         "Expert bytes read from resident copies over all expert bytes read since start (0 before any).");
  o << "tandem_expert_read_bytes_resident_fraction " << x.served_resident() << '\n';
  return o.str();
}

}  // namespace tandem::server
