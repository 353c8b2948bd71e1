// The filters (value|name(args)), with Jinja2 3.1's semantics.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <unordered_map>

#include "tandem/server/jinja/builtins.h"
#include "tandem/server/jinja/interpreter.h"
#include "tandem/server/jinja/operators.h"
#include "tandem/server/jinja/pystr.h"
#include "tandem/server/jinja/utf8.h"

namespace tandem::server::jinja {
namespace {

using Filter = Value (*)(Interpreter&, const Value&, const CallArgs&);

const Value kNone = Value::none();
const Value kUndefined;

std::string text_of(const Value& v) {
  return to_str(v);
}

std::function<Value(const Value&)> key_function(const CallArgs& args, size_t attribute_index,
                                                bool case_sensitive) {
  const Value attribute = args.get(attribute_index, "attribute", kNone);
  return [attribute, case_sensitive](const Value& item) {
    Value v = item;
    if (attribute.is_string()) v = attribute_path(item, attribute.as_string());
    if (!case_sensitive && v.is_string()) return Value::string(utf8::lower(v.as_string()));
    return v;
  };
}

Value f_abs(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("abs", 0, {});
  if (!v.is_number()) type_error("bad operand type for abs(): '" + v.type_name() + "'");
  if (v.kind() == Value::Kind::kFloat) return Value::number(std::fabs(v.as_double()));
  return negate(v, v.as_int() < 0);
}

Value f_attr(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("attr", 1, {"name"});
  return get_attr(v, string_arg(a.get(0, "name", kNone), "attr()'s name"));
}

Value f_capitalize(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("capitalize", 0, {});
  return Value::string(capitalize(text_of(v)));
}

Value f_center(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("center", 1, {"width"});
  const std::string s = text_of(v);
  const int64_t width = int_arg(a.get(0, "width", Value::integer(80)), "center()'s width");
  const auto n = static_cast<int64_t>(utf8::length(s));
  if (width <= n) return Value::string(s);
  const int64_t total = std::min<int64_t>(width - n, 1 << 20);
  const int64_t left = total / 2 + (total & width & 1);
  return Value::string(std::string(static_cast<size_t>(left), ' ') + s +
                       std::string(static_cast<size_t>(total - left), ' '));
}

Value f_default(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("default", 2, {"default_value", "boolean"});
  const bool boolean = a.get(1, "boolean", Value::boolean(false)).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value::string(""));
  return v;
}

Value f_dictsort(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("dictsort", 3, {"case_sensitive", "by", "reverse"});
  if (!v.is_mapping()) type_error("dictsort expects a mapping, not " + v.type_name());
  const bool case_sensitive = a.get(0, "case_sensitive", Value::boolean(false)).truthy();
  const Value by = a.get(1, "by", Value::string("key"));
  const bool reverse = a.get(2, "reverse", Value::boolean(false)).truthy();
  const size_t pos = by.is_string() && by.as_string() == "value" ? 1 : 0;
  List pairs;
  for (const auto& [key, value] : v.as_dict().entries) pairs.push_back(Value::tuple({key, value}));
  auto key = [&](const Value& pair) {
    const Value& k = pair.as_list()[pos];
    return !case_sensitive && k.is_string() ? Value::string(utf8::lower(k.as_string())) : k;
  };
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    return reverse ? less(key(y), key(x)) : less(key(x), key(y));
  });
  return Value::list(std::move(pairs));
}

Value f_escape(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("escape", 0, {});
  std::string out;
  for (char c : text_of(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return Value::string(std::move(out));
}

Value f_first(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("first", 0, {});
  const List items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("last", 0, {});
  const List items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_float(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("float", 1, {"default"});
  const Value fallback = a.get(0, "default", Value::number(0.0));
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    const std::string s = utf8::strip(v.as_string(), nullptr, true, true);
    double d = 0;
    const auto res = std::from_chars(s.data(), s.data() + s.size(), d);
    if (!s.empty() && res.ec == std::errc() && res.ptr == s.data() + s.size()) return Value::number(d);
  }
  return fallback;
}

Value f_int(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("int", 2, {"default", "base"});
  const Value fallback = a.get(0, "default", Value::integer(0));
  int base = static_cast<int>(int_arg(a.get(1, "base", Value::integer(10)), "int()'s base"));
  if (v.is_int()) return Value::integer(v.as_int());
  if (v.kind() == Value::Kind::kFloat) {
    if (!std::isfinite(v.as_double()) || std::fabs(v.as_double()) >= 9.2e18) return fallback;
    return Value::integer(static_cast<int64_t>(v.as_double()));
  }
  if (!v.is_string()) return fallback;
  std::string s = utf8::strip(v.as_string(), nullptr, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  const bool negative = !s.empty() && s[0] == '-';
  std::string digits = !s.empty() && (s[0] == '-' || s[0] == '+') ? s.substr(1) : s;
  if (digits.size() > 2 && digits[0] == '0') {  // Python's 0x / 0o / 0b prefixes, with base 0 or their own
    const char p = static_cast<char>(digits[1] | 0x20);
    const int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed && (base == 0 || base == prefixed)) {
      base = prefixed;
      digits.erase(0, 2);
    }
  }
  if (base == 0) base = 10;
  int64_t i = 0;
  if (base >= 2 && base <= 36 && !digits.empty()) {
    const auto res = std::from_chars(digits.data(), digits.data() + digits.size(), i, base);
    if (res.ec == std::errc() && res.ptr == digits.data() + digits.size())
      return Value::integer(negative ? -i : i);
  }
  double d = 0;
  const auto res = std::from_chars(s.data(), s.data() + s.size(), d);
  if (!s.empty() && res.ec == std::errc() && res.ptr == s.data() + s.size() && std::isfinite(d) &&
      std::fabs(d) < 9.2e18)
    return Value::integer(static_cast<int64_t>(d));
  return fallback;
}

Value f_indent(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("indent", 3, {"width", "first", "blank"});
  const Value width = a.get(0, "width", Value::integer(4));
  const bool first = a.get(1, "first", Value::boolean(false)).truthy();
  const bool blank = a.get(2, "blank", Value::boolean(false)).truthy();
  const std::string indention =
      width.is_string()
          ? width.as_string()
          : std::string(
                static_cast<size_t>(std::clamp<int64_t>(int_arg(width, "indent()'s width"), 0, 1 << 16)),
                ' ');
  const std::vector<std::string> lines = utf8::split_lines(text_of(v) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += '\n';
      if (blank || !lines[i].empty()) out += indention;
    }
    out += lines[i];
  }
  if (first) out = indention + out;
  return Value::string(std::move(out));
}

Value f_items(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("items", 0, {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_mapping()) type_error("Can only get item pairs from a mapping.");
  List pairs;
  for (const auto& [key, value] : v.as_dict().entries) pairs.push_back(Value::tuple({key, value}));
  return Value::list(std::move(pairs));
}

Value f_join(Interpreter& in, const Value& v, const CallArgs& a) {
  a.expect("join", 2, {"d", "attribute"});
  const std::string sep = text_of(a.get(0, "d", Value::string("")));
  const auto key = key_function(a, 1, true);
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    in.step();
    if (!first) out += sep;
    first = false;
    out += text_of(key(item));
    if (out.size() > in.limits().max_string_bytes)
      throw RenderError("MemoryError: join() built too long a string");
  }
  return Value::string(std::move(out));
}

Value f_length(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("length", 0, {});
  return Value::integer(length(v));
}

Value f_list(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("list", 0, {});
  return Value::list(iterate(v));
}

Value f_lower(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("lower", 0, {});
  return Value::string(utf8::lower(text_of(v)));
}

Value f_upper(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("upper", 0, {});
  return Value::string(utf8::upper(text_of(v)));
}

Value f_map(Interpreter& in, const Value& v, const CallArgs& a) {
  List out;
  const Value attribute = a.get(SIZE_MAX, "attribute", kUndefined);
  if (!attribute.is_undefined()) {
    a.expect("map", 0, {"attribute", "default"});
    const Value fallback = a.get(SIZE_MAX, "default", kUndefined);
    for (const Value& item : iterate(v)) {
      in.step();
      Value x = attribute_path(item, text_of(attribute));
      out.push_back(x.is_undefined() && !fallback.is_undefined() ? fallback : x);
    }
    return Value::list(std::move(out));
  }
  if (a.positional.empty()) type_error("map() needs a filter name or attribute=");
  const std::string filter = string_arg(a.positional[0], "map()'s filter name");
  if (!has_filter(filter)) throw RenderError("TemplateRuntimeError: No filter named '" + filter + "'.");
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& item : iterate(v)) {
    in.step();
    out.push_back(apply_filter(in, filter, item, rest));
  }
  return Value::list(std::move(out));
}

Value min_max(Interpreter&, const Value& v, const CallArgs& a, bool want_max, const char* name) {
  a.expect(name, 2, {"case_sensitive", "attribute"});
  const auto key = key_function(a, 1, a.get(0, "case_sensitive", Value::boolean(false)).truthy());
  const List items = iterate(v);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const bool better =
        want_max ? less(key(items[best]), key(items[i])) : less(key(items[i]), key(items[best]));
    if (better) best = i;
  }
  return items[best];
}

Value f_max(Interpreter& in, const Value& v, const CallArgs& a) {
  return min_max(in, v, a, true, "max");
}
Value f_min(Interpreter& in, const Value& v, const CallArgs& a) {
  return min_max(in, v, a, false, "min");
}

Value select_impl(Interpreter& in, const Value& v, const CallArgs& a, bool by_attribute, bool keep) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (a.positional.empty()) type_error("selectattr/rejectattr need an attribute name");
    attribute = string_arg(a.positional[next++], "the attribute name");
  }
  std::string test;
  if (next < a.positional.size()) test = string_arg(a.positional[next++], "the test name");
  if (!test.empty() && !has_test(test))
    throw RenderError("TemplateRuntimeError: No test named '" + test + "'.");
  CallArgs rest;
  rest.positional.assign(
      a.positional.begin() + static_cast<std::ptrdiff_t>(std::min(next, a.positional.size())),
      a.positional.end());
  rest.keyword = a.keyword;
  List out;
  for (const Value& item : iterate(v)) {
    in.step();
    const Value subject = by_attribute ? attribute_path(item, attribute) : item;
    const bool passed = test.empty() ? subject.truthy() : apply_test(in, test, subject, rest);
    if (passed == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(Interpreter& in, const Value& v, const CallArgs& a) {
  return select_impl(in, v, a, false, true);
}
Value f_reject(Interpreter& in, const Value& v, const CallArgs& a) {
  return select_impl(in, v, a, false, false);
}
Value f_selectattr(Interpreter& in, const Value& v, const CallArgs& a) {
  return select_impl(in, v, a, true, true);
}
Value f_rejectattr(Interpreter& in, const Value& v, const CallArgs& a) {
  return select_impl(in, v, a, true, false);
}

Value f_replace(Interpreter& in, const Value& v, const CallArgs& a) {
  a.expect("replace", 3, {"old", "new", "count"});
  const Value count = a.get(2, "count", kNone);
  return Value::string(replace(text_of(v), text_of(a.get(0, "old", kNone)), text_of(a.get(1, "new", kNone)),
                               count.is_none() ? -1 : int_arg(count, "replace()'s count"), in.limits()));
}

Value f_reverse(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("reverse", 0, {});
  if (v.is_string()) {
    std::vector<char32_t> cps = utf8::decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value::string(utf8::encode(cps, 0, cps.size()));
  }
  List items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_round(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("round", 2, {"precision", "method"});
  if (!v.is_number()) type_error("round() needs a number, not " + v.type_name());
  const int64_t precision = int_arg(a.get(0, "precision", Value::integer(0)), "round()'s precision");
  const std::string method = to_str(a.get(1, "method", Value::string("common")));
  if (method != "common" && method != "ceil" && method != "floor")
    throw RenderError("FilterArgumentError: method must be common, ceil or floor");
  if (method == "common" && v.kind() != Value::Kind::kFloat && precision >= 0)
    return Value::integer(v.as_int());
  const double x = v.as_double();
  if (method == "common" && precision >= 0 && precision <= 30 && std::isfinite(x)) {
    // Python rounds the exact binary value to the nearest decimal, halves to even; so does printf.
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
    return Value::number(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = x * scale;
  const double r = method == "ceil"    ? std::ceil(scaled)
                   : method == "floor" ? std::floor(scaled)
                                       : std::nearbyint(scaled);
  return Value::number(r / scale);
}

Value f_safe(Interpreter&, const Value& v, const CallArgs&) {
  return v;
}

Value f_sort(Interpreter& in, const Value& v, const CallArgs& a) {
  a.expect("sort", 3, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = a.get(0, "reverse", Value::boolean(false)).truthy();
  const auto key = key_function(a, 2, a.get(1, "case_sensitive", Value::boolean(false)).truthy());
  List items = iterate(v);
  in.step();
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? less(key(y), key(x)) : less(key(x), key(y));
  });
  return Value::list(std::move(items));
}

Value f_string(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("string", 0, {});
  return Value::string(text_of(v));
}

Value f_sum(Interpreter& in, const Value& v, const CallArgs& a) {
  a.expect("sum", 2, {"attribute", "start"});
  const auto key = key_function(a, 0, true);
  Value total = a.get(1, "start", Value::integer(0));
  for (const Value& item : iterate(v)) {
    in.step();
    total = binary_op("+", total, key(item), in.limits());
  }
  return total;
}

Value f_title(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("title", 0, {});
  return Value::string(title(text_of(v)));
}

Value f_tojson(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("tojson", 1, {"indent", "separators", "sort_keys", "ensure_ascii"});
  JsonFormat f;
  const Value indent = a.get(0, "indent", kNone);
  if (indent.is_string())
    f.indent = indent.as_string();
  else if (!indent.is_none() && !indent.is_undefined())
    f.indent = std::string(
        static_cast<size_t>(std::clamp<int64_t>(int_arg(indent, "tojson()'s indent"), 0, 64)), ' ');
  if (f.indent) f.item_separator = ",";
  const Value separators = a.get(SIZE_MAX, "separators", kNone);
  if (!separators.is_none()) {
    if (!separators.is_list() || separators.as_list().size() != 2)
      type_error("tojson()'s separators must be a pair of strings");
    f.item_separator = string_arg(separators.as_list()[0], "the item separator");
    f.key_separator = string_arg(separators.as_list()[1], "the key separator");
  }
  f.sort_keys = a.get(SIZE_MAX, "sort_keys", Value::boolean(false)).truthy();
  f.ensure_ascii = a.get(SIZE_MAX, "ensure_ascii", Value::boolean(false)).truthy();
  return Value::string(to_json(v, f));
}

Value f_trim(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("trim", 1, {"chars"});
  const Value chars = a.get(0, "chars", kNone);
  const std::string set = chars.is_none() ? std::string() : text_of(chars);
  return Value::string(utf8::strip(text_of(v), chars.is_none() ? nullptr : &set, true, true));
}

Value f_unique(Interpreter& in, const Value& v, const CallArgs& a) {
  a.expect("unique", 2, {"case_sensitive", "attribute"});
  const auto key = key_function(a, 1, a.get(0, "case_sensitive", Value::boolean(false)).truthy());
  List out, seen;
  for (const Value& item : iterate(v)) {
    in.step();
    const Value k = key(item);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); })) continue;
    seen.push_back(k);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, const CallArgs& a) {
  a.expect("wordcount", 0, {});
  return Value::integer(static_cast<int64_t>(split(text_of(v), kNone, -1).size()));
}

const std::unordered_map<std::string_view, Filter>& filters() {
  static const std::unordered_map<std::string_view, Filter> table = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return table;
}

}  // namespace

bool has_filter(std::string_view name) {
  return filters().count(name) > 0;
}

Value apply_filter(Interpreter& in, const std::string& name, const Value& value, const CallArgs& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) throw RenderError("TemplateRuntimeError: No filter named '" + name + "'.");
  in.step();
  return it->second(in, value, args);
}

}  // namespace tandem::server::jinja
