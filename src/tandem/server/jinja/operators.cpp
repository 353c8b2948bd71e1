#include "tandem/server/jinja/operators.h"

#include <cmath>
#include <memory>

#include "tandem/server/jinja/builtins.h"
#include "tandem/server/jinja/utf8.h"

namespace tandem::server::jinja {
namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  type_error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() +
             "'");
}

void check_string(size_t bytes, const SizeLimits& limits) {
  if (bytes > limits.max_string_bytes)
    throw RenderError("MemoryError: the template built a string of " + std::to_string(bytes) +
                      " bytes, past the limit of " + std::to_string(limits.max_string_bytes));
}

void check_list(size_t items, const SizeLimits& limits) {
  if (items > limits.max_list_items)
    throw RenderError("MemoryError: the template built a list of " + std::to_string(items) +
                      " items, past the limit of " + std::to_string(limits.max_list_items));
}

template <typename Op>
int64_t checked(Op op, int64_t a, int64_t b) {
  int64_t r = 0;
  if (op(a, b, &r)) throw RenderError("OverflowError: an integer left the 64-bit range");
  return r;
}
bool add(int64_t a, int64_t b, int64_t* r) {
  return __builtin_add_overflow(a, b, r);
}
bool sub(int64_t a, int64_t b, int64_t* r) {
  return __builtin_sub_overflow(a, b, r);
}
bool mul(int64_t a, int64_t b, int64_t* r) {
  return __builtin_mul_overflow(a, b, r);
}

Value repeat(const Value& seq, int64_t times, const SizeLimits& limits) {
  if (times < 0) times = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && static_cast<uint64_t>(times) > limits.max_string_bytes / s.size())
      check_string(limits.max_string_bytes + 1, limits);
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += s;
    return Value::string(std::move(out));
  }
  const List& items = seq.as_list();
  if (!items.empty() && static_cast<uint64_t>(times) > limits.max_list_items / items.size())
    check_list(limits.max_list_items + 1, limits);
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out));
}

// Python's floor division and modulo: the quotient rounds down and the remainder takes the divisor's sign.
int64_t floor_div(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) throw RenderError("OverflowError: an integer left the 64-bit range");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b, const SizeLimits& limits) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  const bool ints = a.is_int() && b.is_int();
  const bool numbers = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return Value::integer(checked(add, a.as_int(), b.as_int()));
    if (numbers) return Value::number(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      check_string(a.as_string().size() + b.as_string().size(), limits);
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      check_list(a.as_list().size() + b.as_list().size(), limits);
      List out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(out));
    }
    if (a.is_string() || a.is_list())
      type_error("can only concatenate " + a.type_name() + " (not \"" + b.type_name() + "\") to " +
                 a.type_name());
    unsupported(op, a, b);
  }
  if (op == "-") {
    if (ints) return Value::integer(checked(sub, a.as_int(), b.as_int()));
    if (numbers) return Value::number(a.as_double() - b.as_double());
    unsupported(op, a, b);
  }
  if (op == "*") {
    if (ints) return Value::integer(checked(mul, a.as_int(), b.as_int()));
    if (numbers) return Value::number(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_list()) && b.is_int()) return repeat(a, b.as_int(), limits);
    if (a.is_int() && (b.is_string() || b.is_list())) return repeat(b, a.as_int(), limits);
    type_error("can't multiply sequence by non-int of type '" + b.type_name() + "'");
  }
  if (op == "/") {
    if (!numbers) unsupported(op, a, b);
    if (b.as_double() == 0) throw RenderError("ZeroDivisionError: division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (a.is_string() && op == "%")
      type_error("printf-style formatting with '%' is not supported; use ~ or the format of a filter");
    if (!numbers) unsupported(op, a, b);
    if (b.as_double() == 0)
      throw RenderError(std::string("ZeroDivisionError: integer ") + (op == "%" ? "modulo" : "division") +
                        " by zero");
    if (ints) {
      const int64_t q = floor_div(a.as_int(), b.as_int());
      return Value::integer(op == "//" ? q : a.as_int() - q * b.as_int());
    }
    const double x = a.as_double(), y = b.as_double();
    const double q = std::floor(x / y);
    if (op == "//") return Value::number(q);
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value::number(m);
  }
  if (op == "**") {
    if (!numbers) unsupported(op, a, b);
    if (ints && b.as_int() >= 0) {
      int64_t result = 1, base = a.as_int();
      for (int64_t e = b.as_int(); e > 0; --e)
        if (__builtin_mul_overflow(result, base, &result))
          throw RenderError("OverflowError: an integer left the 64-bit range");
      return Value::integer(result);
    }
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  type_error("unknown operator " + op);
}

Value negate(const Value& v, bool minus) {
  if (v.is_undefined()) v.fail_undefined();
  if (!v.is_number())
    type_error(std::string("bad operand type for unary ") + (minus ? "-" : "+") + ": '" + v.type_name() +
               "'");
  if (!minus) return v.kind() == Value::Kind::kBool ? Value::integer(v.as_int()) : v;
  if (v.kind() == Value::Kind::kFloat) return Value::number(-v.as_double());
  if (v.as_int() == INT64_MIN) throw RenderError("OverflowError: an integer left the 64-bit range");
  return Value::integer(-v.as_int());
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string())
        type_error("'in <string>' requires string as left operand, not " + item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.as_list())
        if (equal(v, item)) return true;
      return false;
    case Value::Kind::kDict:
      return container.as_dict().find(item) != nullptr;
    default:
      type_error("argument of type '" + container.type_name() + "' is not iterable");
  }
}

List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.as_list();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& entry : v.as_dict().entries) keys.push_back(entry.first);
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (char32_t cp : utf8::decode(v.as_string())) {
        std::string c;
        utf8::append(c, cp);
        chars.push_back(Value::string(std::move(c)));
      }
      return chars;
    }
    default:
      type_error("'" + v.type_name() + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(utf8::length(v.as_string()));
    case Value::Kind::kList:
      return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.as_dict().entries.size());
    default:
      type_error("object of type '" + v.type_name() + "' has no len()");
  }
}

namespace {

Value no_attribute(const Value& object, const std::string& name) {
  std::string why = "'";  // built by appends: GCC 12 misreads a chain of + here (-Wrestrict)
  why.append(object.object_description()).append("' has no attribute '").append(name).append("'");
  return Value::undefined(std::move(why));
}

}  // namespace

Value get_attr(const Value& object, const std::string& name) {
  if (object.is_undefined()) object.fail_undefined();
  if (!name.empty() && name[0] == '_')
    throw RenderError("SecurityError: access to attribute '" + name + "' of '" + object.type_name() +
                      "' object is unsafe");
  if (is_method(object, name)) return bound_method(object, name);
  if (object.is_mapping()) {
    if (const Value* v = object.as_dict().find(name)) return *v;
    return no_attribute(object, name);
  }
  return no_attribute(object, name);
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) object.fail_undefined();
  if (object.is_mapping()) {
    if (const Value* v = object.as_dict().find(key)) return *v;
  } else if ((object.is_list() || object.is_string()) && key.is_int()) {
    const int64_t n = length(object);
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (object.is_list()) return object.as_list()[static_cast<size_t>(i)];
      const std::vector<char32_t> cps = utf8::decode(object.as_string());
      return Value::string(utf8::encode(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
    }
    return Value::undefined(object.object_description() + " has no element " + repr(key));
  }
  if (key.is_string()) {
    if (!key.as_string().empty() && key.as_string()[0] == '_') return no_attribute(object, key.as_string());
    return get_attr(object, key.as_string());
  }
  if (key.is_undefined()) return Value::undefined(object.object_description() + " has no element Undefined");
  return Value::undefined(object.object_description() + " has no element " + repr(key));
}

Value slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) object.fail_undefined();
  if (!object.is_list() && !object.is_string())
    type_error("'" + object.type_name() + "' object is not subscriptable");
  auto index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int()) type_error(std::string("slice ") + what + " must be an integer or None");
    return v.as_int();
  };
  const int64_t n = length(object);
  const int64_t st = index(step, "step").value_or(1);
  if (st == 0) value_error("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> i, int64_t fallback) {
    if (!i) return fallback;
    int64_t x = *i;
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(index(start, "start"), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(index(stop, "stop"), st > 0 ? n : -1);
  std::vector<int64_t> picks;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) picks.push_back(i);
  if (object.is_list()) {
    List out;
    out.reserve(picks.size());
    for (int64_t i : picks) out.push_back(object.as_list()[static_cast<size_t>(i)]);
    return Value::list(std::move(out));
  }
  const std::vector<char32_t> cps = utf8::decode(object.as_string());
  std::string out;
  for (int64_t i : picks) utf8::append(out, cps[static_cast<size_t>(i)]);
  return Value::string(std::move(out));
}

}  // namespace tandem::server::jinja
