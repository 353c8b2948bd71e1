// Template values: JSON-like data (none, bool, int, float, string, list, dict) plus what a template makes
// itself (namespaces, macros, bound methods, builtin functions) and Jinja's "undefined".
//
// The operations follow Python's, since the templates were written against Jinja2: truthiness, ==, <, str()
// and repr(), integers apart from floats, strings indexed by code point. Lists and dicts are shared and never
// changed once built (the sandbox forbids mutation); a namespace is the one mutable object, shared by
// reference as in Jinja2.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/server/jinja/error.h"

namespace tandem::server::jinja {

using Json = nlohmann::ordered_json;

class Value;
class Interpreter;

// Arguments of a call: positional, then keyword in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`; `fallback` when neither was passed. Returns a copy, so that a
  // temporary fallback is never referred to after it is gone.
  Value get(size_t index, std::string_view name, const Value& fallback) const;
  // Fails naming `function` when more than `max_positional` positional arguments or a keyword outside
  // `names` were passed.
  void expect(std::string_view function, size_t max_positional,
              std::initializer_list<std::string_view> names) const;
};

// Something a template can call: a macro, a builtin function or a bound method such as str.split.
class Callable {
 public:
  virtual ~Callable() = default;
  virtual Value call(Interpreter& interpreter, const CallArgs& args) const = 0;
  virtual std::string name() const = 0;
};

using List = std::vector<Value>;

// An insertion-ordered mapping (Python dicts keep insertion order, and tojson writes keys in that order).
// Lookup is linear: template dicts are small.
struct Dict {
  std::vector<std::pair<Value, Value>> entries;

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };

  Value() = default;  // undefined, with no account of why
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  // Releases nested containers without recursing once per level, so that a deeply nested value a template
  // built cannot exhaust the stack when it goes.
  ~Value() {
    if (list_ || dict_) release();
  }

  // An undefined value that remembers why, for the error raised when it is used (Jinja2's wording).
  static Value undefined(std::string why);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  static Value list(List items);
  // A list that prints as a Python tuple, (a, b); it compares unequal to a list, as in Python.
  static Value tuple(List items);
  static Value dict(Dict d);
  static Value make_namespace(Dict d);
  static Value callable(std::shared_ptr<const Callable> fn);
  static Value from_json(const Json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_int() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }  // Python: bool is an int
  bool is_number() const { return is_int() || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(as_int()); }
  const std::string& as_string() const { return s_; }
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& namespace_dict() const { return *dict_; }  // namespaces alone are changed in place
  const Callable& as_callable() const { return *fn_; }
  // Why an undefined value is undefined ("'x' is undefined" when nothing better is known).
  const std::string& undefined_reason() const { return s_; }

  // Python's bool(x); undefined is false.
  bool truthy() const;
  // Python's type name, as TypeError messages print it: str, int, float, bool, NoneType, list, dict.
  std::string type_name() const;
  // Jinja2's object_type_repr: "dict object", "None", ... (for "has no attribute" messages).
  std::string object_description() const;
  // Throws the UndefinedError this undefined value stands for.
  [[noreturn]] void fail_undefined() const;

 private:
  void release();

  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;               // a string's text, or why a value is undefined
  std::shared_ptr<List> list_;  // never changed once built (but taken apart by its last owner)
  std::shared_ptr<Dict> dict_;  // a dict (never changed) or a namespace (changed in place)
  std::shared_ptr<const Callable> fn_;
};

// Values nested deeper than this are refused by the operations that walk them (==, <, repr, tojson): a
// namespace can hold itself, and walking it would never end.
constexpr int kMaxValueDepth = 256;

// Python ==, across ints, floats and bools; containers compare element by element.
bool equal(const Value& a, const Value& b, int depth = 0);
// Python <; throws a TypeError for values that do not order.
bool less(const Value& a, const Value& b, int depth = 0);
// Python str(x) (undefined prints as nothing).
std::string to_str(const Value& v);
// Python repr(x).
std::string repr(const Value& v, int depth = 0);
// Python's repr of a float ("1.0", "1e-05", "inf").
std::string float_repr(double d);

struct JsonFormat {
  std::optional<std::string> indent;  // none: one line
  std::string item_separator = ", ", key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python json.dumps with the given format; throws a TypeError for values JSON cannot hold.
std::string to_json(const Value& v, const JsonFormat& format);

}  // namespace tandem::server::jinja
