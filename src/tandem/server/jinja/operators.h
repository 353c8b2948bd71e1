// Python's operators on template values, and Jinja2's sandboxed attribute and item access: `a.b` tries the
// attribute (str.split, dict.items, ...) before the item, `a[b]` the item before the attribute, and a
// missing one is undefined (an error only when used). Names starting with "_" are refused, so a template
// reaches nothing beyond its data and the documented methods.
#pragma once

#include <string>

#include "tandem/server/jinja/value.h"

namespace tandem::server::jinja {

// Sizes past which a string or list a template builds is refused, so that doubling in a loop cannot exhaust
// memory before the step limit stops it.
struct SizeLimits {
  size_t max_string_bytes = size_t{64} << 20;
  size_t max_list_items = size_t{1} << 22;
};

Value binary_op(const std::string& op, const Value& a, const Value& b, const SizeLimits& limits);
Value negate(const Value& v, bool minus);
// `item in container`.
bool contains(const Value& container, const Value& item);
// Python iteration: a list's items, a dict's keys, a string's characters; undefined iterates as empty.
List iterate(const Value& v);
// len(): code points for strings.
int64_t length(const Value& v);

Value get_attr(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);
// object[start:stop:step]; an undefined part is omitted.
Value slice(const Value& object, const Value& start, const Value& stop, const Value& step);

}  // namespace tandem::server::jinja
