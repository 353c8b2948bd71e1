// Shared helpers for the test suite.
#pragma once

#include <string>

namespace tandem::testing {

// Path of a file under ../shared; fails the current test (with a message saying how to get it) when the
// shared folder is missing. Never skips silently.
std::string shared_path(const std::string& relative);

}  // namespace tandem::testing
