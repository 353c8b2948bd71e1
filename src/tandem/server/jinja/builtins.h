// The filters, tests, methods and global functions a template may use (the subset chat templates use; see
// docs/chat-templates.md), with Jinja2's and Python's semantics.
#pragma once

#include <string>
#include <string_view>

#include "tandem/server/jinja/value.h"

namespace tandem::server::jinja {

class Interpreter;

bool has_filter(std::string_view name);
bool has_test(std::string_view name);
Value apply_filter(Interpreter& in, const std::string& name, const Value& value, const CallArgs& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& value, const CallArgs& args);

// Whether `object.name` is a method (str.split, dict.items, list.count, ...), which Python's attribute lookup
// finds before any dict item of that name.
bool is_method(const Value& object, const std::string& name);
Value bound_method(const Value& object, const std::string& name);

// raise_exception, strftime_now, namespace, range, dict.
Dict make_globals();

// Argument checks shared by filters, tests and methods; each throws a TypeError naming `what`.
int64_t int_arg(const Value& v, const char* what);
std::string string_arg(const Value& v, const char* what);
const Value& first_arg(const CallArgs& a, const char* what);
// Jinja2's attribute getter for map, selectattr, sort, ...: "a.b.0" looks up each part as an item, then as an
// attribute.
Value attribute_path(const Value& object, const std::string& path);

}  // namespace tandem::server::jinja
