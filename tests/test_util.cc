#include "test_util.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>

namespace tandem::testing {

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

}  // namespace tandem::testing
