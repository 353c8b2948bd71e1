#include "tandem/server/jinja/pystr.h"

#include <algorithm>

#include "tandem/server/jinja/builtins.h"
#include "tandem/server/jinja/utf8.h"

namespace tandem::server::jinja {

std::vector<std::string> split(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    const std::vector<char32_t> cps = utf8::decode(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && utf8::is_space(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && utf8::is_space(cps[e - 1])) --e;
        parts.push_back(utf8::encode(cps, i, e));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !utf8::is_space(cps[j])) ++j;
      parts.push_back(utf8::encode(cps, i, j));
      i = j;
    }
    return parts;
  }
  const std::string d = string_arg(sep, "the separator");
  if (d.empty()) value_error("empty separator");
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(d, start);
    if (at == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
      parts.push_back(s.substr(start));
      return parts;
    }
    parts.push_back(s.substr(start, at - start));
    start = at + d.size();
  }
}

std::vector<std::string> rsplit(const std::string& s, const Value& sep, int64_t maxsplit) {
  if (maxsplit < 0 || sep.is_none() || sep.is_undefined()) return split(s, sep, maxsplit);
  const std::string d = string_arg(sep, "the separator");
  if (d.empty()) value_error("empty separator");
  std::vector<std::string> parts;
  size_t end = s.size();
  while (static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < d.size()) break;
    const size_t at = s.rfind(d, end - d.size());
    if (at == std::string::npos) break;
    parts.push_back(s.substr(at + d.size(), end - at - d.size()));
    end = at;
  }
  parts.push_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::string replace(const std::string& s, const std::string& old, const std::string& with, int64_t count,
                    const SizeLimits& limits) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    const std::vector<char32_t> cps = utf8::decode(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i < cps.size()) utf8::append(out, cps[i]);
      if (out.size() > limits.max_string_bytes)
        throw RenderError("MemoryError: replace() built too long a string");
    }
    return out;
  }
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos || (count >= 0 && done >= count)) break;
    out.append(s, start, at - start);
    out += with;
    if (out.size() > limits.max_string_bytes)
      throw RenderError("MemoryError: replace() built too long a string");
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out = utf8::lower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 'a' + 'A');
  return out;
}

std::string title(const std::string& s) {
  std::string out = s;
  bool word_start = true;
  for (char& c : out) {
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (alpha) {
      if (word_start && c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
      if (!word_start && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    word_start = !alpha && !(c >= '0' && c <= '9') && !(static_cast<unsigned char>(c) >= 0x80);
  }
  return out;
}

}  // namespace tandem::server::jinja
