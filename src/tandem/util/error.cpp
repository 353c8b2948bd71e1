#include "tandem/util/error.h"

namespace tandem {

void fail_check(const char* expr, const char* file, int line, const std::string& message) {
  throw Error("internal check failed: " + message + " (" + expr + " at " + file + ":" + std::to_string(line) +
              ")");
}

}  // namespace tandem
