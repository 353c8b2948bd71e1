// Python str methods that filters and methods share: split, rsplit, replace, capitalize, title.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/server/jinja/operators.h"
#include "tandem/server/jinja/value.h"

namespace tandem::server::jinja {

// str.split / str.rsplit: on runs of whitespace when `sep` is none or undefined; maxsplit < 0: no limit.
std::vector<std::string> split(const std::string& s, const Value& sep, int64_t maxsplit);
std::vector<std::string> rsplit(const std::string& s, const Value& sep, int64_t maxsplit);
// str.replace; count < 0: every occurrence. Throws past limits.max_string_bytes.
std::string replace(const std::string& s, const std::string& old, const std::string& with, int64_t count,
                    const SizeLimits& limits);
// ASCII letters change case; other code points stay as they are.
std::string capitalize(const std::string& s);
std::string title(const std::string& s);

}  // namespace tandem::server::jinja
