#include "test_util.h"

#include <gtest/gtest.h>

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

}  // namespace tandem::testing
