// `tandem bench --json` on the real tiny model: the keys its users script against, and figures that agree
// with each other (the roofline fraction is decode tok/s x bytes per token / bandwidth; the bandwidth is the
// best of the probe passes it lists; the fraction beside the bandwidth is the median of its rounds; the parts
// of a step add up to it).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "tandem/kernels/cpu_target.h"
#include "test_util.h"

namespace {

TEST(BenchCommand, JsonLineHasEveryFigureAndTheyAgree) {
  const std::string tandem(TANDEM_BINARY);
  const auto [out, rc] = tandem::testing::run_command(
      tandem + " bench -m '" + tandem::testing::shared_path("models/stories260K.gguf") +
      "' -t 2 --decode-tokens 16 --json 2>/dev/null");
  ASSERT_EQ(rc, 0) << out;
  const size_t last = out.find_last_of('\n', out.size() - 2);
  const nlohmann::json j = nlohmann::json::parse(out.substr(last == std::string::npos ? 0 : last + 1));
  for (const char* key : {"bandwidth_gbs", "bandwidth_passes_gbs", "decode_tps", "roofline_fraction",
                          "prefill64_tps", "prefill512_tps", "verify_cost", "peak_rss_mb"})
    ASSERT_TRUE(j.contains(key)) << key;
  for (const char* n : {"1", "2", "3", "4", "5", "6", "8", "12", "16"}) {
    ASSERT_TRUE(j["verify_cost"].contains(n)) << n;
    EXPECT_GT(j["verify_cost"][n].get<double>(), 0.0) << n;
  }
  EXPECT_EQ(j["verify_cost"]["1"].get<double>(), 1.0);

  const auto passes = j["bandwidth_passes_gbs"].get<std::vector<double>>();
  ASSERT_EQ(passes.size(), 10u);  // five before decode, five after
  const double bandwidth = j["bandwidth_gbs"].get<double>();
  EXPECT_GT(bandwidth, 0.0);
  EXPECT_EQ(bandwidth, *std::max_element(passes.begin(), passes.end()));

  const double decode = j["decode_tps"].get<double>();
  EXPECT_GT(decode, 0.0);
  EXPECT_NEAR(j["roofline_fraction"].get<double>(),
              decode * j["bytes_per_token"].get<double>() / (bandwidth * 1e9),
              1e-9 * j["roofline_fraction"].get<double>());
  // Decode beside the bandwidth: nine rounds between ten single probe passes, each round's weight bytes per
  // second over the mean of the two passes around it, and their median.
  const auto rounds = j["roofline_beside_rounds"].get<std::vector<double>>();
  const auto beside_passes = j["roofline_beside_passes_gbs"].get<std::vector<double>>();
  ASSERT_EQ(rounds.size(), 9u);
  ASSERT_EQ(beside_passes.size(), rounds.size() + 1);
  for (double r : rounds) EXPECT_GT(r, 0.0);
  auto sorted = rounds;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(j["roofline_beside"].get<double>(), sorted[sorted.size() / 2]);
  // Where decode steps and verify windows spend their time: shares of a step that add up to one, and
  // milliseconds per forward for every width.
  double shares = 0;
  for (const char* part : {"matmul", "attention", "other"}) {
    const double share = j["decode_parts"][part].get<double>();
    EXPECT_GE(share, -1e-9) << part;
    shares += share;
  }
  EXPECT_NEAR(shares, 1.0, 1e-9);
  EXPECT_GT(j["decode_parts"]["matmul"].get<double>(), 0.0);
  for (const char* n : {"1", "2", "3", "4", "5", "6", "8", "12", "16"}) {
    const auto& parts = j["verify_parts_ms"][n];
    EXPECT_GT(parts["matmul"].get<double>(), 0.0) << n;
    EXPECT_GT(parts["attention"].get<double>(), 0.0) << n;
    EXPECT_GE(parts["other"].get<double>(), -1e-9) << n;
  }
  EXPECT_GT(j["prefill64_tps"].get<double>(), 0.0);
  EXPECT_GT(j["prefill512_tps"].get<double>(), 0.0);
  EXPECT_GT(j["peak_rss_mb"].get<double>(), 0.0);
  // The model's weights are all F32: no int8 multiply-adds, so no verify floor (not a floor of zero).
  EXPECT_EQ(j["macs_per_token"].get<double>(), 0.0);
  EXPECT_TRUE(j["verify_cost_floor"].is_null());
}

// TANDEM_KERNELS runs the kernels of the target it names (bench reports which), every target this CPU runs
// included; a name it cannot run is refused before any work, with the names it can.
TEST(BenchCommand, TandemKernelsPicksTheTargetAndRefusesOthers) {
  const std::string tandem(TANDEM_BINARY);
  const std::string model = tandem::testing::shared_path("models/stories260K.gguf");
  for (const tandem::kernels::Target t : tandem::kernels::runnable_targets()) {
    const std::string name(tandem::kernels::target_name(t));
    const auto [out, rc] =
        tandem::testing::run_command("TANDEM_KERNELS=" + name + " " + tandem + " bench -m '" + model +
                                     "' -t 2 --decode-tokens 4 --reps 1 --json 2>&1");
    ASSERT_EQ(rc, 0) << name << "\n" << out;
    const size_t last = out.find_last_of('\n', out.size() - 2);
    const nlohmann::json j = nlohmann::json::parse(out.substr(last == std::string::npos ? 0 : last + 1));
    EXPECT_EQ(j["kernels"].get<std::string>(), name);
    EXPECT_GT(j["decode_tps"].get<double>(), 0.0) << name;
  }
  const auto [out, rc] = tandem::testing::run_command("TANDEM_KERNELS=no-such-target " + tandem +
                                                      " info -m '" + model + "' 2>&1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("TANDEM_KERNELS=no-such-target names no kernel target this CPU runs"), std::string::npos)
      << out;
  EXPECT_NE(out.find(std::string(tandem::kernels::target_name(tandem::kernels::Target::kScalar))),
            std::string::npos)
      << out;
}

}  // namespace
