#include "tandem/server/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tandem/server/jinja/utf8.h"

namespace tandem::server::jinja {

Value CallArgs::get(size_t index, std::string_view name, const Value& fallback) const {
  for (const auto& [key, value] : keyword)
    if (key == name) return value;
  return index < positional.size() ? positional[index] : fallback;
}

void CallArgs::expect(std::string_view function, size_t max_positional,
                      std::initializer_list<std::string_view> names) const {
  if (positional.size() > max_positional)
    type_error(std::string(function) + "() takes at most " + std::to_string(max_positional) +
               " positional argument(s) (" + std::to_string(positional.size()) + " given)");
  for (const auto& kw : keyword)
    if (std::find(names.begin(), names.end(), kw.first) == names.end())
      type_error(std::string(function) + "() got an unexpected keyword argument '" + kw.first + "'");
}

const Value* Dict::find(const Value& key) const {
  for (const auto& entry : entries)
    if (equal(entry.first, key)) return &entry.second;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& entry : entries)
    if (entry.first.is_string() && entry.first.as_string() == key) return &entry.second;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& entry : entries)
    if (equal(entry.first, key)) {
      entry.second = std::move(value);
      return;
    }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::undefined(std::string why) {
  Value v;
  v.s_ = std::move(why);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}

Value Value::list(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::tuple(List items) {
  Value v = list(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::dict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::make_namespace(Dict d) {
  Value v = dict(std::move(d));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::callable(std::shared_ptr<const Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::move(fn);
  return v;
}

void Value::release() {
  std::vector<Value> pending;
  auto detach = [&pending](Value& v) {
    auto keep = [&pending](Value& child) {
      if (child.list_ || child.dict_) pending.push_back(std::move(child));
    };
    if (v.list_ && v.list_.use_count() == 1)
      for (Value& child : *v.list_) keep(child);
    if (v.dict_ && v.dict_.use_count() == 1)
      for (auto& [key, child] : v.dict_->entries) {
        keep(key);
        keep(child);
      }
    v.list_.reset();
    v.dict_.reset();
  };
  detach(*this);
  while (!pending.empty()) {
    Value v = std::move(pending.back());
    pending.pop_back();
    detach(v);  // v then holds no container, and its destructor returns at once
  }
}

Value Value::from_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return none();
    case Json::value_t::boolean:
      return boolean(j.get<bool>());
    case Json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return integer(static_cast<int64_t>(u));
      return number(static_cast<double>(u));
    }
    case Json::value_t::number_float:
      return number(j.get<double>());
    case Json::value_t::string:
      return string(j.get<std::string>());
    case Json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const Json& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case Json::value_t::object: {
      Dict d;
      d.entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.entries.emplace_back(string(it.key()), from_json(*it));
      return dict(std::move(d));
    }
    default:
      return undefined("a JSON value of type " + std::string(j.type_name()) + " has no template value");
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->entries.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

std::string Value::object_description() const {
  return kind_ == Kind::kNone ? "None" : type_name() + " object";
}

void Value::fail_undefined() const {
  throw RenderError("UndefinedError: " + (s_.empty() ? std::string("a value is undefined") : s_));
}

namespace {

void check_depth(int depth) {
  if (depth > kMaxValueDepth)
    throw RenderError("RecursionError: a value nests deeper than " + std::to_string(kMaxValueDepth) +
                      " levels (a namespace that holds itself?)");
}

}  // namespace

bool equal(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.as_string() == b.as_string();
    case K::kList: {
      const List &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size() || a.is_tuple() != b.is_tuple()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i], depth + 1)) return false;
      return true;
    }
    case K::kDict: {
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [key, value] : x.entries) {
        const Value* other = y.find(key);
        if (!other || !equal(value, *other, depth + 1)) return false;
      }
      return true;
    }
    case K::kNamespace:
      return &a.namespace_dict() == &b.namespace_dict();
    case K::kCallable:
      return &a.as_callable() == &b.as_callable();
    default:
      return false;
  }
}

bool less(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 keeps code point order
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less(x[i], y[i], depth + 1)) return true;
      if (less(y[i], x[i], depth + 1)) return false;
    }
    return x.size() < y.size();
  }
  type_error("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exp10 = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + exp_buf;
}

namespace {

bool printable(char32_t cp) {
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp < 0x7f) return true;
  if (cp <= 0xa0 || cp == 0xad) return false;
  if ((cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) || (cp >= 0x205f && cp <= 0x206f) ||
      cp == 0x3000 || cp == 0xfeff || cp == 0x1680 || (cp >= 0xd800 && cp <= 0xdfff))
    return false;
  return true;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const char quote = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : utf8::decode(s)) {
    char buf[16];
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (printable(cp)) {
      utf8::append(out, cp);
    } else {
      if (cp < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
      else if (cp < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
      out += buf;
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string repr(const Value& v, int depth) {
  check_depth(depth);
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kUndefined:
      return "Undefined";
    case K::kNone:
      return "None";
    case K::kBool:
      return v.as_bool() ? "True" : "False";
    case K::kInt:
      return std::to_string(v.as_int());
    case K::kFloat:
      return float_repr(v.as_double());
    case K::kString:
      return string_repr(v.as_string());
    case K::kList: {
      const List& items = v.as_list();
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + repr(items[i], depth + 1);
      if (v.is_tuple()) return out + (items.size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case K::kDict:
    case K::kNamespace: {
      std::string out = v.kind() == K::kDict ? "{" : "<Namespace {";
      bool first = true;
      for (const auto& [key, value] : v.as_dict().entries) {
        out += (first ? "" : ", ") + repr(key, depth + 1) + ": " + repr(value, depth + 1);
        first = false;
      }
      return out + (v.kind() == K::kDict ? "}" : "}>");
    }
    case K::kCallable:
      return "<function " + v.as_callable().name() + ">";
  }
  return "?";
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.as_string();
  if (v.is_undefined()) return {};
  return repr(v);
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t cp : utf8::decode(s)) {
    char buf[16];
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp > 0x7e)) {
          if (cp >= 0x10000) {
            const char32_t u = cp - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (u >> 10)),
                          static_cast<unsigned>(0xdc00 + (u & 0x3ff)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
          }
          out += buf;
        } else {
          utf8::append(out, cp);
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return float_repr(d);
}

void json_value(std::string& out, const Value& v, const JsonFormat& f, int depth) {
  using K = Value::Kind;
  check_depth(depth);
  auto newline = [&](int level) {
    if (!f.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *f.indent;
  };
  switch (v.kind()) {
    case K::kNone:
      out += "null";
      return;
    case K::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case K::kInt:
      out += std::to_string(v.as_int());
      return;
    case K::kFloat:
      out += json_float(v.as_double());
      return;
    case K::kString:
      json_string(out, v.as_string(), f.ensure_ascii);
      return;
    case K::kList: {
      const List& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += f.item_separator;
        newline(depth + 1);
        json_value(out, items[i], f, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case K::kDict: {
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : v.as_dict().entries) entries.push_back(&e);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (f.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* a, const auto* b) { return less(a->first, b->first); });
      out += '{';
      bool first = true;
      for (const auto* e : entries) {
        if (!first) out += f.item_separator;
        first = false;
        newline(depth + 1);
        const Value& key = e->first;
        if (key.is_string())
          json_string(out, key.as_string(), f.ensure_ascii);
        else if (key.kind() == K::kBool)
          out += key.as_bool() ? "\"true\"" : "\"false\"";
        else if (key.is_none())
          out += "\"null\"";
        else if (key.kind() == K::kInt)
          out += "\"" + std::to_string(key.as_int()) + "\"";
        else if (key.kind() == K::kFloat)
          out += "\"" + json_float(key.as_double()) + "\"";
        else
          type_error("keys must be str, int, float, bool or None, not " + key.type_name());
        out += f.key_separator;
        json_value(out, e->second, f, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      type_error("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonFormat& format) {
  std::string out;
  json_value(out, v, format, 0);
  return out;
}

}  // namespace tandem::server::jinja
