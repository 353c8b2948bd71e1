// --expert-budget beyond bench: `tandem run` gives the same tokens with and without a budget and prints the
// residency's summary; the server's scheduler keeps the residency on its own thread, gives the tokens of a
// scheduler without one, and publishes the residency's counters in its stats, which /metrics renders.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tandem/engine/cache_pool.h"
#include "tandem/engine/scheduler.h"
#include "tandem/model/expert_residency.h"
#include "tandem/model/graph.h"
#include "tandem/model/moe.h"
#include "tandem/server/metrics.h"
#include "test_util.h"

namespace tandem {
namespace {

std::string qwen2moe() {
  return testing::shared_path("models/synth/synth-qwen2moe-d128-Q8_0.gguf");
}

// `tandem run` greedy on the synth qwen2moe file; extra: more flags. Returns stdout, stderr and the status.
struct RunResult {
  std::string out, err;
  int status = 0;
};

RunResult run(const std::string& model, const std::string& extra, const testing::TempDir& dir) {
  const std::string err_file = dir.file("stderr.txt");
  const auto [out, status] = testing::run_command(std::string(TANDEM_BINARY) + " run -t 1 -m '" + model +
                                                  "' --prompt-ids 1,40,41,42,7,9 --no-bos -n 40 --temp 0 " +
                                                  extra + " 2>'" + err_file + "'");
  std::ifstream in(err_file);
  std::stringstream err;
  err << in.rdbuf();
  return {out, err.str(), status};
}

TEST(ExpertBudgetRun, SameTokensWithAndWithoutABudget) {
  testing::TempDir dir("expert-budget-run");
  const RunResult plain = run(qwen2moe(), "", dir);
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(plain.err.find("expert budget"), std::string::npos) << plain.err;
  // Half the experts' bytes, then a quarter: copies come and go as the routing counts change during the 40
  // tokens, and the text stays the same.
  for (const std::string budget : {"50%", "25%"}) {
    SCOPED_TRACE(budget);
    const RunResult with = run(qwen2moe(), "--expert-budget " + budget, dir);
    ASSERT_EQ(with.status, 0) << with.err;
    EXPECT_EQ(with.out, plain.out);
    // "expert budget: B MB: R MB resident (r of n experts); the run read P% of its expert bytes from
    // resident copies"
    const std::regex line(
        R"(expert budget: [0-9.]+ MB: [0-9.]+ MB resident \(([0-9]+) of ([0-9]+) experts\); the run read )"
        R"(([0-9.]+)% of its expert bytes from resident copies)");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(with.err, m, line)) << with.err;
    const int resident = std::stoi(m[1].str()), experts = std::stoi(m[2].str());
    EXPECT_GT(resident, 0);
    EXPECT_LT(resident, experts);
    EXPECT_GT(std::stod(m[3].str()), 0.0);
    EXPECT_LT(std::stod(m[3].str()), 100.0);
  }
}

TEST(ExpertBudgetRun, BadSizesAndDenseModelsAreRefusedClearly) {
  testing::TempDir dir("expert-budget-bad");
  const RunResult bad = run(qwen2moe(), "--expert-budget 5X", dir);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--expert-budget '5X': expected a size such as 4G, 512M or 50%"), std::string::npos)
      << bad.err;
  const RunResult over = run(qwen2moe(), "--expert-budget 150%", dir);
  EXPECT_NE(over.status, 0);
  EXPECT_NE(over.err.find("--expert-budget '150%'"), std::string::npos) << over.err;
  const RunResult dense = run(testing::shared_path("models/stories260K.gguf"), "--expert-budget 50%", dir);
  EXPECT_NE(dense.status, 0);
  EXPECT_NE(dense.err.find("--expert-budget applies to mixture-of-experts models; 'llama' has no routed "
                           "experts"),
            std::string::npos)
      << dense.err;
  // The other commands that load a target take the same flag with the same checks.
  for (const char* command : {"chat", "serve", "bench-spec --draft ngram"}) {
    const auto [out, status] = testing::run_command(std::string(TANDEM_BINARY) + " " + command + " -m '" +
                                                    testing::shared_path("models/stories260K.gguf") +
                                                    "' --expert-budget 1G 2>&1 </dev/null");
    EXPECT_NE(status, 0) << command;
    EXPECT_NE(out.find("--expert-budget applies to mixture-of-experts models"), std::string::npos)
        << command << ": " << out;
  }
}

// A budget beyond every expert takes a slot per routed expert, not the memory it names.
TEST(ExpertBudgetResidency, BudgetBeyondEveryExpertHoldsThemAll) {
  auto model = model::Model::load(qwen2moe());
  model::ExpertResidency all(*model, size_t{1} << 40);
  EXPECT_EQ(all.slots(), all.stats().experts);
  for (int64_t e = 0; e < model->config().moe.n_expert; ++e) all.record(0, e);
  all.rebalance();
  EXPECT_EQ(all.stats().resident_experts, all.stats().experts);
  EXPECT_EQ(all.stats().resident_bytes, model::expert_bytes(*model).routed_all);
}

// A metric's value in Prometheus text ("NAME VALUE" lines); -1 when absent.
double metric(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + key.size()));
}

engine::Request greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  engine::Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.stop_at_eog = false;
  return r;
}

std::vector<int32_t> collect(engine::Stream& s) {
  std::vector<int32_t> tokens;
  engine::Event ev;
  for (;;) {
    if (!s.next(ev, std::chrono::milliseconds(60000))) {
      ADD_FAILURE() << "no event within a minute";
      return tokens;
    }
    if (ev.kind == engine::Event::Kind::kToken) {
      tokens.push_back(ev.token.id);
      continue;
    }
    EXPECT_EQ(ev.finish, engine::Finish::kLength) << ev.error;
    return tokens;
  }
}

// Three concurrent greedy requests through the scheduler, with `residency` on the graph (null: none).
// Returns each request's tokens and the scheduler's stats after them; while they run, another thread reads
// the stats and renders them, as /metrics does from the HTTP threads.
std::vector<std::vector<int32_t>> serve(const model::Model& model, ThreadPool& pool,
                                        model::ExpertResidency* residency, engine::SchedulerStats& stats) {
  model::Graph graph(model, pool, model::GraphOptions{32, 16});
  graph.set_expert_residency(residency);
  engine::SlotCachePool caches(model.config(), 256, cache::KvType::kF16, 3);
  engine::SchedulerOptions so;
  so.max_running = 3;
  so.max_waiting = 4;
  so.max_rows = 32;
  engine::Scheduler scheduler(graph, caches, nullptr, so);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    server::Metrics metrics;
    while (!done.load()) {
      const std::string text = metrics.render(scheduler.stats());
      EXPECT_NE(text.find("tandem_expert_reads_total"), std::string::npos);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<std::shared_ptr<engine::Stream>> streams;
  for (int i = 0; i < 3; ++i) {
    engine::Scheduler::Admit admit{};
    std::vector<int32_t> prompt = {1};
    for (int j = 0; j < 5 + 3 * i; ++j) prompt.push_back((j * 37 + i * 11) % 200 + 3);
    streams.push_back(scheduler.submit(greedy(prompt, 30), admit));
    EXPECT_EQ(admit, engine::Scheduler::Admit::kOk);
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) out.push_back(collect(*s));
  done.store(true);
  reader.join();
  stats = scheduler.stats();
  return out;
}

TEST(ExpertBudgetServe, SchedulerPublishesTheResidencyAndKeepsTheTokens) {
  auto model = model::Model::load(qwen2moe());
  ThreadPool pool(2);
  engine::SchedulerStats plain_stats, stats;
  const auto plain = serve(*model, pool, nullptr, plain_stats);
  EXPECT_FALSE(plain_stats.experts.has_value());
  const std::string plain_text = server::Metrics().render(plain_stats);
  EXPECT_EQ(metric(plain_text, "tandem_expert_budget_bytes"), 0) << plain_text;
  EXPECT_EQ(metric(plain_text, "tandem_expert_read_bytes_total"), 0);
  EXPECT_EQ(metric(plain_text, "tandem_expert_read_bytes_resident_fraction"), 0);

  // Half the experts' bytes, the copies moving every 16 reads.
  const size_t budget = model::expert_bytes(*model).routed_all / 2;
  model::ExpertResidency residency(*model, budget, /*rebalance_every=*/16);
  const auto with = serve(*model, pool, &residency, stats);
  EXPECT_EQ(with, plain);
  ASSERT_TRUE(stats.experts.has_value());
  // The stats are the residency's as of the last forward (the scheduler has gone; its thread is joined).
  const model::ResidencyStats now = residency.stats();
  const model::ResidencyStats& x = *stats.experts;
  EXPECT_EQ(x.reads, now.reads);
  EXPECT_EQ(x.resident_reads, now.resident_reads);
  EXPECT_EQ(x.resident_bytes, now.resident_bytes);
  EXPECT_EQ(x.budget_bytes, budget);
  EXPECT_GT(x.resident_experts, 0);
  EXPECT_LT(x.resident_experts, x.experts);
  EXPECT_GT(x.resident_reads, 0u);
  EXPECT_LT(x.resident_reads, x.reads);

  const std::string text = server::Metrics().render(stats);
  EXPECT_EQ(metric(text, "tandem_expert_budget_bytes"), static_cast<double>(budget)) << text;
  EXPECT_EQ(metric(text, "tandem_expert_resident_bytes"), static_cast<double>(x.resident_bytes));
  EXPECT_EQ(metric(text, "tandem_expert_resident_experts"), static_cast<double>(x.resident_experts));
  EXPECT_EQ(metric(text, "tandem_expert_routed_experts"), static_cast<double>(x.experts));
  EXPECT_EQ(metric(text, "tandem_expert_reads_total"), static_cast<double>(x.reads));
  EXPECT_EQ(metric(text, "tandem_expert_reads_resident_total"), static_cast<double>(x.resident_reads));
  const double bytes = metric(text, "tandem_expert_read_bytes_total");
  const double resident = metric(text, "tandem_expert_read_bytes_resident_total");
  EXPECT_EQ(bytes, x.bytes_read);
  EXPECT_EQ(resident, x.resident_bytes_read);
  EXPECT_GT(resident, 0);
  EXPECT_NEAR(metric(text, "tandem_expert_read_bytes_resident_fraction"), resident / bytes, 1e-5);
  EXPECT_NE(text.find("# TYPE tandem_expert_read_bytes_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE tandem_expert_resident_bytes gauge\n"), std::string::npos);
}

}  // namespace
}  // namespace tandem
