// Errors a user can act on. Library code throws tandem::Error for bad input, I/O and loading failures;
// the CLI catches it and prints the message. Invariant violations inside the engine use TANDEM_CHECK.
#pragma once

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] void fail_check(const char* expr, const char* file, int line, const std::string& message);

}  // namespace tandem

// Always-on invariant check: throws tandem::Error naming the failed condition.
#define TANDEM_CHECK(cond, msg)                                          \
  do {                                                                   \
    if (!(cond)) ::tandem::fail_check(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
