#include "test_util.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

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
