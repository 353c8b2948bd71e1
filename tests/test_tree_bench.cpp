// `tandem bench-spec --tree-nodes N`: the tree figures its users script against, and --cost-model, which
// prices the same forwards at another calibrated model's verify costs (the tokens generated over the summed
// cost of the forwards, by their rows).
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

// The cost the printed curve of `label` gives k rows ("verify cost curve of FILE: 1:1.000 2:1.046 ...").
double printed_cost(const std::string& out, const std::string& label, int k) {
  const size_t line = out.find(label);
  if (line == std::string::npos) return -1.0;
  std::istringstream in(out.substr(line + label.size(), out.find('\n', line) - line - label.size()));
  std::string item;
  while (in >> item) {
    const size_t colon = item.find(':');
    if (colon != std::string::npos && std::stoi(item.substr(0, colon)) == k)
      return std::stod(item.substr(colon + 1));
  }
  return -1.0;
}

TEST(TreeBench, ReportsTreeFiguresAndPricesThemAtAnotherModelsCosts) {
  const tandem::testing::TempDir dir("tree_bench");
  const std::string env = "XDG_CACHE_HOME='" + dir.file("cache") + "' ";
  const std::string tandem(TANDEM_BINARY);
  const std::string target = tandem::testing::shared_path("models/stories260K.gguf");
  const std::string draft = tandem::testing::shared_path("models/llama2xs-tok512.gguf");
  const std::string bench = env + tandem + " bench-spec -m '" + target + "' --draft-model '" + draft +
                            "' --tree-nodes 4 --no-gate --draft-max 6 -n 24 -t 1 --json --cost-model '" +
                            draft + "'";

  // No calibration of the pricing model yet: a message saying how to make one, before any work.
  {
    const auto [out, rc] = tandem::testing::run_command(bench + " 2>&1");
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find("tandem calibrate -m " + draft + " -t 1 --max-rows 5"), std::string::npos) << out;
  }

  const auto [cal_out, cal_rc] = tandem::testing::run_command(env + tandem + " calibrate -m '" + draft +
                                                              "' -t 1 --max-rows 5 --repeats 1 2>&1");
  ASSERT_EQ(cal_rc, 0) << cal_out;
  const auto [out, rc] = tandem::testing::run_command(bench + " 2>/dev/null");
  ASSERT_EQ(rc, 0) << out;
  const size_t last = out.find_last_of('\n', out.size() - 2);
  const nlohmann::json j = nlohmann::json::parse(out.substr(last == std::string::npos ? 0 : last + 1));
  EXPECT_EQ(j["tree_nodes"].get<int>(), 4);
  EXPECT_GT(j["tree_rounds"].get<int64_t>(), 0);
  EXPECT_EQ(j["greedy_mismatches"].get<int64_t>(), 0);
  const double nodes = j["nodes_per_round"].get<double>();
  EXPECT_GT(nodes, 1.0);
  EXPECT_LE(nodes, 4.0);
  const double tokens = j["tokens_per_forward"].get<double>();
  EXPECT_GT(tokens, 1.0);
  EXPECT_LE(tokens, 5.0);  // a 4-node tree commits at most its deepest path and the target's token

  // Both prices are the tokens over the forwards' summed cost, each on its own curve.
  const auto rows = j["rows_histogram"].get<std::vector<int64_t>>();
  ASSERT_EQ(rows.size(), 8u);  // rows 0..max(draft_max, tree_nodes) + 1
  EXPECT_EQ(rows[0], 0);
  int64_t forwards = 0;
  double own = 0.0, other = 0.0;
  for (int k = 1; k <= 5; ++k) {
    forwards += rows[static_cast<size_t>(k)];
    own += static_cast<double>(rows[static_cast<size_t>(k)]) *
           printed_cost(out, "verify cost curve (a forward of k rows / one row):", k);
    other += static_cast<double>(rows[static_cast<size_t>(k)]) *
             printed_cost(out, "verify cost curve of " + draft + ":", k);
  }
  EXPECT_EQ(rows[6] + rows[7], 0) << "a 4-node tree verifies 5 rows at most";
  ASSERT_GT(forwards, 0);
  EXPECT_NEAR(tokens, 24.0 * 4 / static_cast<double>(forwards), 1e-9)
      << "four default prompts, 24 tokens each";
  EXPECT_NEAR(j["expected_speedup"].get<double>(), tokens * forwards / own, 2e-3 * tokens * forwards / own);
  EXPECT_NEAR(j["expected_speedup_cost_model"].get<double>(), tokens * forwards / other,
              2e-3 * tokens * forwards / other);
}

}  // namespace
