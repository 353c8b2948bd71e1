#include "test_util.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

namespace tandem::testing {

std::vector<float> normal_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  return x;
}

ChiSquare chi_square(const std::vector<int32_t>& ids, const std::vector<float>& probs,
                     const std::map<int32_t, int>& counts, int runs) {
  ChiSquare r;
  double pooled_expected = 0, pooled_observed = 0;
  int matched = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const double expected = runs * static_cast<double>(probs[i]);
    const auto it = counts.find(ids[i]);
    const double observed = it == counts.end() ? 0 : it->second;
    matched += static_cast<int>(observed);
    if (expected < 5) {
      pooled_expected += expected, pooled_observed += observed;
      continue;
    }
    r.chi2 += (observed - expected) * (observed - expected) / expected;
    ++r.bins;
  }
  if (pooled_expected > 0) {
    r.chi2 += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++r.bins;
  }
  int total = 0;
  for (const auto& [id, n] : counts) total += n;
  r.outside = total - matched;
  return r;
}

double chi2_critical_1e4(int k) {
  const double z = 3.7190;  // the standard normal's upper 1e-4 quantile
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

std::string shared_path(const std::string& relative) {
  std::filesystem::path p = std::filesystem::path(TANDEM_SHARED_DIR) / relative;
  if (!std::filesystem::exists(p)) {
    ADD_FAILURE()
        << "test data '" << p.string()
        << "' is missing: the tests need the shared folder (models, goldens, vocabularies) checked out "
           "beside this repository as ../shared";
  }
  return p.string();
}

std::pair<std::string, int> run_command(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {out, -1};
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

TempDir::TempDir(const std::string& prefix) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  path_ = std::filesystem::temp_directory_path() /
          (prefix + "-" + std::to_string(::getpid()) + "-" + (info ? info->name() : "none"));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace tandem::testing
