// Shared helpers for the test suite.
#pragma once

#include <string>
#include <utility>

namespace tandem::testing {

// Path of a file under ../shared; fails the current test (with a message saying how to get it) when the
// shared folder is missing. Never skips silently.
std::string shared_path(const std::string& relative);

// Runs a shell command; its standard output and exit status (-1 when it did not exit normally).
std::pair<std::string, int> run_command(const std::string& command);

}  // namespace tandem::testing
