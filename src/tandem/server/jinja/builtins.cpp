// The tests (value is name), the methods of str, dict and list, and the global functions.
#include "tandem/server/jinja/builtins.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "tandem/server/jinja/interpreter.h"
#include "tandem/server/jinja/operators.h"
#include "tandem/server/jinja/pystr.h"
#include "tandem/server/jinja/utf8.h"

namespace tandem::server::jinja {
namespace {

using Test = bool (*)(Interpreter&, const Value&, const CallArgs&);

const Value kNone = Value::none();

// --- tests

const std::unordered_map<std::string_view, Test>& tests() {
  static const std::unordered_map<std::string_view, Test> table = {
      {"defined", [](Interpreter&, const Value& v, const CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_undefined(); }},
      {"none", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_none(); }},
      {"boolean",
       [](Interpreter&, const Value& v, const CallArgs&) { return v.kind() == Value::Kind::kBool; }},
      {"true", [](Interpreter&, const Value& v,
                  const CallArgs&) { return v.kind() == Value::Kind::kBool && v.as_bool(); }},
      {"false", [](Interpreter&, const Value& v,
                   const CallArgs&) { return v.kind() == Value::Kind::kBool && !v.as_bool(); }},
      {"integer",
       [](Interpreter&, const Value& v, const CallArgs&) { return v.kind() == Value::Kind::kInt; }},
      {"float",
       [](Interpreter&, const Value& v, const CallArgs&) { return v.kind() == Value::Kind::kFloat; }},
      {"number", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_number(); }},
      {"string", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_string(); }},
      {"mapping", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_dict(); }},
      {"iterable",
       [](Interpreter&, const Value& v, const CallArgs&) {
         return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
       }},
      {"sequence",
       [](Interpreter&, const Value& v, const CallArgs&) {
         return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
       }},
      {"callable", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_callable(); }},
      {"sameas",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         const Value& o = first_arg(a, "sameas");
         return v.kind() == o.kind() && equal(v, o) && !v.is_list() && !v.is_dict();
       }},
      {"eq", [](Interpreter&, const Value& v, const CallArgs& a) { return equal(v, first_arg(a, "eq")); }},
      {"equalto",
       [](Interpreter&, const Value& v, const CallArgs& a) { return equal(v, first_arg(a, "equalto")); }},
      {"ne", [](Interpreter&, const Value& v, const CallArgs& a) { return !equal(v, first_arg(a, "ne")); }},
      {"lt", [](Interpreter&, const Value& v, const CallArgs& a) { return less(v, first_arg(a, "lt")); }},
      {"lessthan",
       [](Interpreter&, const Value& v, const CallArgs& a) { return less(v, first_arg(a, "lessthan")); }},
      {"le", [](Interpreter&, const Value& v, const CallArgs& a) { return !less(first_arg(a, "le"), v); }},
      {"gt", [](Interpreter&, const Value& v, const CallArgs& a) { return less(first_arg(a, "gt"), v); }},
      {"greaterthan",
       [](Interpreter&, const Value& v, const CallArgs& a) { return less(first_arg(a, "greaterthan"), v); }},
      {"ge", [](Interpreter&, const Value& v, const CallArgs& a) { return !less(v, first_arg(a, "ge")); }},
      {"in", [](Interpreter&, const Value& v, const CallArgs& a) { return contains(first_arg(a, "in"), v); }},
      {"even",
       [](Interpreter&, const Value& v, const CallArgs&) { return int_arg(v, "the value tested") % 2 == 0; }},
      {"odd",
       [](Interpreter&, const Value& v, const CallArgs&) { return int_arg(v, "the value tested") % 2 != 0; }},
      {"divisibleby",
       [](Interpreter&, const Value& v, const CallArgs& a) {
         const int64_t d = int_arg(first_arg(a, "divisibleby"), "divisibleby's argument");
         if (d == 0) throw RenderError("ZeroDivisionError: integer modulo by zero");
         return int_arg(v, "the value tested") % d == 0;
       }},
      {"lower", [](Interpreter&, const Value& v,
                   const CallArgs&) { return v.is_string() && utf8::lower(v.as_string()) == v.as_string(); }},
      {"upper", [](Interpreter&, const Value& v,
                   const CallArgs&) { return v.is_string() && utf8::upper(v.as_string()) == v.as_string(); }},
      {"escaped", [](Interpreter&, const Value&, const CallArgs&) { return false; }},
      {"filter", [](Interpreter&, const Value& v,
                    const CallArgs&) { return v.is_string() && has_filter(v.as_string()); }},
      {"test", [](Interpreter&, const Value& v,
                  const CallArgs&) { return v.is_string() && has_test(v.as_string()); }},
  };
  return table;
}

int64_t code_point_index(const std::string& s, size_t byte) {
  return static_cast<int64_t>(utf8::length(std::string_view(s).substr(0, byte)));
}

// --- methods

constexpr std::string_view kStringMethods[] = {
    "startswith", "endswith", "strip",   "lstrip",     "rstrip",  "split",   "rsplit", "splitlines",
    "lower",      "upper",    "title",   "capitalize", "replace", "find",    "rfind",  "count",
    "join",       "isdigit",  "isalpha", "isalnum",    "isspace", "islower", "isupper"};
constexpr std::string_view kDictMethods[] = {"items", "keys", "values", "get"};
constexpr std::string_view kListMethods[] = {"index", "count"};
constexpr std::string_view kMutators[] = {"append", "extend",     "insert",  "pop",  "remove", "clear",
                                          "update", "setdefault", "popitem", "sort", "reverse"};

template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

bool affix_matches(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string x = string_arg(a, prefix ? "startswith()'s prefix" : "endswith()'s suffix");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) return std::any_of(affix.as_list().begin(), affix.as_list().end(), one);
  return one(affix);
}

bool all_chars(const std::string& s, bool (*pred)(char32_t)) {
  const std::vector<char32_t> cps = utf8::decode(s);
  return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
}

Value string_method(Interpreter& in, const std::string& s, const std::string& m, const CallArgs& a) {
  if (m == "startswith" || m == "endswith") {
    a.expect(m, 1, {});
    return Value::boolean(affix_matches(s, first_arg(a, m.c_str()), m == "startswith"));
  }
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    a.expect(m, 1, {"chars"});
    const Value chars = a.get(0, "chars", kNone);
    const std::string set = chars.is_none() ? std::string() : string_arg(chars, "the characters to strip");
    return Value::string(utf8::strip(s, chars.is_none() ? nullptr : &set, m != "rstrip", m != "lstrip"));
  }
  if (m == "split" || m == "rsplit") {
    a.expect(m, 2, {"sep", "maxsplit"});
    const int64_t maxsplit = int_arg(a.get(1, "maxsplit", Value::integer(-1)), "maxsplit");
    const std::vector<std::string> parts = m == "split" ? split(s, a.get(0, "sep", kNone), maxsplit)
                                                        : rsplit(s, a.get(0, "sep", kNone), maxsplit);
    List out;
    for (const std::string& p : parts) out.push_back(Value::string(p));
    return Value::list(std::move(out));
  }
  if (m == "splitlines") {
    a.expect(m, 0, {});
    List out;
    for (const std::string& p : utf8::split_lines(s)) out.push_back(Value::string(p));
    return Value::list(std::move(out));
  }
  if (m == "lower" || m == "upper" || m == "title" || m == "capitalize") {
    a.expect(m, 0, {});
    return Value::string(m == "lower"   ? utf8::lower(s)
                         : m == "upper" ? utf8::upper(s)
                         : m == "title" ? title(s)
                                        : capitalize(s));
  }
  if (m == "replace") {
    a.expect(m, 3, {});
    const Value count = a.get(2, "count", Value::integer(-1));
    return Value::string(replace(s, string_arg(a.get(0, "old", kNone), "replace()'s old"),
                                 string_arg(a.get(1, "new", kNone), "replace()'s new"),
                                 int_arg(count, "count"), in.limits()));
  }
  if (m == "find" || m == "rfind") {
    a.expect(m, 1, {});
    const std::string sub = string_arg(first_arg(a, m.c_str()), "the substring");
    const size_t at = m == "find" ? s.find(sub) : s.rfind(sub);
    return Value::integer(at == std::string::npos ? -1 : code_point_index(s, at));
  }
  if (m == "count") {
    a.expect(m, 1, {});
    const std::string sub = string_arg(first_arg(a, "count"), "the substring");
    if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8::length(s)) + 1);
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value::integer(n);
  }
  if (m == "join") {
    a.expect(m, 1, {});
    std::string out;
    bool first = true;
    for (const Value& item : iterate(first_arg(a, "join"))) {
      in.step();
      if (!first) out += s;
      first = false;
      out += string_arg(item, "each item str.join() joins");
      if (out.size() > in.limits().max_string_bytes)
        throw RenderError("MemoryError: join() built too long a string");
    }
    return Value::string(std::move(out));
  }
  a.expect(m, 0, {});
  if (m == "isdigit") return Value::boolean(all_chars(s, [](char32_t c) { return c >= '0' && c <= '9'; }));
  if (m == "isalpha")
    return Value::boolean(all_chars(s, [](char32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }));
  if (m == "isalnum")
    return Value::boolean(all_chars(
        s, [](char32_t c) { return ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c >= '0' && c <= '9'); }));
  if (m == "isspace") return Value::boolean(all_chars(s, utf8::is_space));
  const bool has_cased =
      std::any_of(s.begin(), s.end(), [](char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; });
  if (m == "islower") return Value::boolean(has_cased && utf8::lower(s) == s);
  return Value::boolean(has_cased && utf8::upper(s) == s);  // isupper
}

Value call_method(Interpreter& in, const Value& self, const std::string& m, const CallArgs& a) {
  in.step();
  if (self.is_string()) return string_method(in, self.as_string(), m, a);
  if (self.is_mapping()) {
    const Dict& d = self.as_dict();
    if (m == "get") {
      a.expect("get", 2, {});
      const Value* v = d.find(first_arg(a, "get"));
      return v ? *v : a.get(1, "", kNone);
    }
    a.expect(m, 0, {});
    List out;
    for (const auto& [key, value] : d.entries) {
      if (m == "items")
        out.push_back(Value::tuple({key, value}));
      else
        out.push_back(m == "keys" ? key : value);
    }
    return Value::list(std::move(out));
  }
  const List& items = self.as_list();
  a.expect(m, 1, {});
  const Value& x = first_arg(a, m.c_str());
  if (m == "count")
    return Value::integer(
        std::count_if(items.begin(), items.end(), [&](const Value& v) { return equal(v, x); }));
  for (size_t i = 0; i < items.size(); ++i)
    if (equal(items[i], x)) return Value::integer(static_cast<int64_t>(i));
  value_error(repr(x) + " is not in list");
}

class BoundMethod : public Callable {
 public:
  BoundMethod(Value self, std::string method) : self_(std::move(self)), method_(std::move(method)) {}
  Value call(Interpreter& in, const CallArgs& args) const override {
    return call_method(in, self_, method_, args);
  }
  std::string name() const override { return self_.type_name() + "." + method_; }

 private:
  Value self_;
  std::string method_;
};

// --- globals

class Builtin : public Callable {
 public:
  using Fn = Value (*)(Interpreter&, const CallArgs&);
  Builtin(std::string name, Fn fn) : name_(std::move(name)), fn_(fn) {}
  Value call(Interpreter& in, const CallArgs& args) const override { return fn_(in, args); }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  Fn fn_;
};

Value g_raise_exception(Interpreter&, const CallArgs& a) {
  throw RenderError("TemplateError: " + to_str(a.get(0, "message", Value::string(""))));
}

Value g_strftime_now(Interpreter& in, const CallArgs& a) {
  a.expect("strftime_now", 1, {"format"});
  const std::string format = string_arg(a.get(0, "format", kNone), "strftime_now()'s format");
  const auto now = in.options().now.value_or(std::chrono::system_clock::now());
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
  if (n == 0 && !format.empty())
    value_error("strftime_now(): the format gives no text or more than 511 bytes");
  return Value::string(std::string(buf, n));
}

Value g_namespace(Interpreter&, const CallArgs& a) {
  Dict d;
  if (!a.positional.empty()) {
    if (a.positional.size() > 1 || !a.positional[0].is_dict())
      type_error("namespace() takes one mapping and keyword arguments");
    d = a.positional[0].as_dict();
  }
  for (const auto& [key, value] : a.keyword) d.set(Value::string(key), value);
  return Value::make_namespace(std::move(d));
}

Value g_dict(Interpreter&, const CallArgs& a) {
  Dict d;
  if (!a.positional.empty()) {
    if (a.positional.size() > 1 || !a.positional[0].is_dict())
      type_error("dict() takes one mapping and keyword arguments");
    d = a.positional[0].as_dict();
  }
  for (const auto& [key, value] : a.keyword) d.set(Value::string(key), value);
  return Value::dict(std::move(d));
}

Value g_range(Interpreter& in, const CallArgs& a) {
  a.expect("range", 3, {});
  if (a.positional.empty()) type_error("range expected at least 1 argument, got 0");
  int64_t start = 0, stop = 0, step = 1;
  if (a.positional.size() == 1) {
    stop = int_arg(a.positional[0], "range()'s stop");
  } else {
    start = int_arg(a.positional[0], "range()'s start");
    stop = int_arg(a.positional[1], "range()'s stop");
    if (a.positional.size() == 3) step = int_arg(a.positional[2], "range()'s step");
  }
  if (step == 0) value_error("range() arg 3 must not be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    in.step();
    out.push_back(Value::integer(i));
    if (out.size() > in.limits().max_list_items) throw RenderError("MemoryError: range() is too long");
    if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
  }
  return Value::list(std::move(out));
}

}  // namespace

int64_t int_arg(const Value& v, const char* what) {
  if (!v.is_int()) type_error(std::string(what) + " must be an integer, not " + v.type_name());
  return v.as_int();
}

std::string string_arg(const Value& v, const char* what) {
  if (!v.is_string()) type_error(std::string(what) + " must be a string, not " + v.type_name());
  return v.as_string();
}

const Value& first_arg(const CallArgs& a, const char* what) {
  if (a.positional.empty()) type_error(std::string(what) + " needs an argument");
  return a.positional[0];
}

// Jinja2's attribute getter for map/selectattr/sort/...: "a.b.0" looks up each part as an item, then an
// attribute.
Value attribute_path(const Value& object, const std::string& path) {
  Value v = object;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    int64_t index = 0;
    const bool numeric =
        !part.empty() &&
        std::from_chars(part.data(), part.data() + part.size(), index).ptr == part.data() + part.size();
    if (v.is_undefined()) return v;
    v = get_item(v, numeric ? Value::integer(index) : Value::string(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

bool has_test(std::string_view name) {
  return tests().count(name) > 0;
}

bool apply_test(Interpreter& in, const std::string& name, const Value& value, const CallArgs& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) throw RenderError("TemplateRuntimeError: No test named '" + name + "'.");
  in.step();
  return it->second(in, value, args);
}

bool is_method(const Value& object, const std::string& name) {
  if (object.is_string()) return listed(kStringMethods, name);
  if (object.is_dict()) {
    if (listed(kMutators, name))
      throw RenderError("SecurityError: dict." + name +
                        " would change a value; templates cannot modify their data");
    return listed(kDictMethods, name);
  }
  if (object.is_list()) {
    if (listed(kMutators, name))
      throw RenderError("SecurityError: list." + name +
                        " would change a value; templates cannot modify their data");
    return listed(kListMethods, name);
  }
  return false;
}

Value bound_method(const Value& object, const std::string& name) {
  return Value::callable(std::make_shared<BoundMethod>(object, name));
}

Dict make_globals() {
  Dict d;
  auto add = [&](const char* name, Builtin::Fn fn) {
    d.entries.emplace_back(Value::string(name), Value::callable(std::make_shared<Builtin>(name, fn)));
  };
  add("raise_exception", g_raise_exception);
  add("strftime_now", g_strftime_now);
  add("namespace", g_namespace);
  add("dict", g_dict);
  add("range", g_range);
  return d;
}

}  // namespace tandem::server::jinja
