#include "tandem/sampling/json_schema.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tandem/util/error.h"

namespace tandem::sampling {

namespace {

using nlohmann::ordered_json;
using Sequence = GrammarBuilder::Sequence;

// Keywords that constrain a value but are not enforced by the grammar: refused, so that a schema is never
// silently weakened.
const std::set<std::string> kUnsupported = {"pattern",
                                            "patternProperties",
                                            "multipleOf",
                                            "uniqueItems",
                                            "not",
                                            "if",
                                            "then",
                                            "else",
                                            "contains",
                                            "minContains",
                                            "maxContains",
                                            "propertyNames",
                                            "minProperties",
                                            "maxProperties",
                                            "dependentRequired",
                                            "dependentSchemas",
                                            "dependencies",
                                            "unevaluatedItems",
                                            "unevaluatedProperties",
                                            "prefixItems",
                                            "additionalItems",
                                            "contentEncoding",
                                            "contentMediaType"};

// Keywords that decide the value's shape; anyOf/oneOf/$ref beside them would have to be intersected.
const std::set<std::string> kShapeKeywords = {"type",
                                              "properties",
                                              "items",
                                              "enum",
                                              "const",
                                              "minLength",
                                              "maxLength",
                                              "minItems",
                                              "maxItems",
                                              "format",
                                              "minimum",
                                              "maximum",
                                              "required",
                                              "additionalProperties",
                                              "exclusiveMinimum",
                                              "exclusiveMaximum"};

constexpr int kMaxIndent = 20;
constexpr int kMaxNesting = 200;
// Numbers stay within what a 64-bit integer and a double hold, so that every output parses: an unbounded
// run of digits would also let a model loop on digits forever.
constexpr int64_t kMaxIntegerDigits = 18;
constexpr int64_t kMaxInteger = 999'999'999'999'999'999;  // 18 digits
constexpr int64_t kMaxFractionDigits = 16;
constexpr int64_t kMaxExponentDigits = 2;

class SchemaCompiler {
 public:
  SchemaCompiler(const ordered_json& root, GrammarBuilder& builder) : root_(root), b_(builder) {}

  // The rule of one value of the root schema.
  int32_t value() { return schema(root_, "#"); }
  int32_t any_object_value() { return any_object(); }

 private:
  [[noreturn]] static void fail(const std::string& path, const std::string& problem) {
    throw Error("JSON schema at " + path + ": " + problem);
  }

  static std::string quoted(const std::string& s) { return ordered_json(s).dump(); }

  // ---- shared pieces ---------------------------------------------------------------------------------

  int32_t ws() {
    if (ws_ < 0) {
      ByteClass space_or_tab;
      space_or_tab.set(' ');
      space_or_tab.set('\t');
      const int32_t tabs = b_.repeat("indent", {b_.bytes(space_or_tab)}, 0, kMaxIndent);
      ws_ = b_.rule("ws", {{}, b_.literal(" "), {b_.literal("\n")[0], GrammarBuilder::ref(tabs)}});
    }
    return ws_;
  }
  GrammarElement w() { return GrammarBuilder::ref(ws()); }

  // One character of a JSON string: an unescaped code point (well-formed UTF-8, no control character,
  // quote or backslash) or an escape.
  int32_t string_char() {
    if (string_char_ >= 0) return string_char_;
    ByteClass ascii;
    for (int c = 0x20; c < 0x80; ++c) ascii.set(static_cast<size_t>(c));
    ascii.reset('"');
    ascii.reset('\\');
    ByteClass escapes;
    for (char c : std::string("\"\\/bfnrt")) escapes.set(static_cast<uint8_t>(c));
    const GrammarElement hex = hex_digit();
    const int32_t escape = b_.rule("escape", {{b_.bytes(escapes)}, {b_.literal("u")[0], hex, hex, hex, hex}});
    std::vector<Sequence> alts = {{b_.bytes(ascii)}, {b_.literal("\\")[0], GrammarBuilder::ref(escape)}};
    for (Sequence& s : utf8_multibyte()) alts.push_back(std::move(s));
    string_char_ = b_.rule("char", alts);
    return string_char_;
  }

  // Well-formed UTF-8 sequences of two to four bytes (no surrogates, no overlong forms).
  std::vector<Sequence> utf8_multibyte() {
    const GrammarElement tail = b_.byte_range(0x80, 0xBF);
    return {{b_.byte_range(0xC2, 0xDF), tail},
            {b_.byte_range(0xE0, 0xE0), b_.byte_range(0xA0, 0xBF), tail},
            {b_.byte_range(0xE1, 0xEC), tail, tail},
            {b_.byte_range(0xED, 0xED), b_.byte_range(0x80, 0x9F), tail},
            {b_.byte_range(0xEE, 0xEF), tail, tail},
            {b_.byte_range(0xF0, 0xF0), b_.byte_range(0x90, 0xBF), tail, tail},
            {b_.byte_range(0xF1, 0xF3), tail, tail, tail},
            {b_.byte_range(0xF4, 0xF4), b_.byte_range(0x80, 0x8F), tail, tail}};
  }

  GrammarElement hex_digit() {
    ByteClass hex;
    for (int c = '0'; c <= '9'; ++c) hex.set(static_cast<size_t>(c));
    for (int c = 'a'; c <= 'f'; ++c) hex.set(static_cast<size_t>(c));
    for (int c = 'A'; c <= 'F'; ++c) hex.set(static_cast<size_t>(c));
    return b_.bytes(hex);
  }
  GrammarElement digit() { return b_.byte_range('0', '9'); }

  int32_t string_of(int64_t min_length, int64_t max_length) {
    const auto key = std::make_pair(min_length, max_length);
    if (auto it = strings_.find(key); it != strings_.end()) return it->second;
    const int32_t chars = b_.repeat("chars", {GrammarBuilder::ref(string_char())}, min_length, max_length);
    const int32_t id =
        b_.rule("string", {{b_.literal("\"")[0], GrammarBuilder::ref(chars), b_.literal("\"")[0]}});
    strings_[key] = id;
    return id;
  }

  int32_t digits(int64_t min_count, int64_t max_count) {
    return b_.repeat("digits", {digit()}, min_count, max_count);
  }

  // -?(0|[1-9][0-9]*)
  int32_t integer(bool allow_negative) {
    int32_t& cached = allow_negative ? integer_ : natural_;
    if (cached >= 0) return cached;
    const int32_t magnitude = b_.rule(
        "natural",
        {b_.literal("0"), {b_.byte_range('1', '9'), GrammarBuilder::ref(digits(0, kMaxIntegerDigits - 1))}});
    std::vector<Sequence> alts = {{GrammarBuilder::ref(magnitude)}};
    if (allow_negative) alts.push_back({b_.literal("-")[0], GrammarBuilder::ref(magnitude)});
    cached = b_.rule(allow_negative ? "integer" : "natural", alts);
    return cached;
  }

  int32_t number(bool allow_negative) {
    int32_t& cached = allow_negative ? number_ : non_negative_number_;
    if (cached >= 0) return cached;
    const int32_t fraction =
        b_.rule("fraction", {{}, {b_.literal(".")[0], GrammarBuilder::ref(digits(1, kMaxFractionDigits))}});
    ByteClass e;
    e.set('e');
    e.set('E');
    ByteClass sign;
    sign.set('+');
    sign.set('-');
    const int32_t exponent_sign = b_.rule("exponent-sign", {{}, {b_.bytes(sign)}});
    const int32_t exponent = b_.rule("exponent", {{},
                                                  {b_.bytes(e), GrammarBuilder::ref(exponent_sign),
                                                   GrammarBuilder::ref(digits(1, kMaxExponentDigits))}});
    cached = b_.rule("number", {{GrammarBuilder::ref(integer(allow_negative)), GrammarBuilder::ref(fraction),
                                 GrammarBuilder::ref(exponent)}});
    return cached;
  }

  int32_t literal_rule(const std::string& name, const std::string& text) {
    return b_.rule(name, {b_.literal(text)});
  }

  // Any JSON value, object and array.
  int32_t any_value() {
    if (any_value_ >= 0) return any_value_;
    any_value_ = b_.declare("value");
    any_object_ = b_.declare("object");
    const int32_t array = b_.declare("array");
    for (int32_t alt : {any_object_, array, string_of(0, -1), number(true), literal_rule("true", "true"),
                        literal_rule("false", "false"), literal_rule("null", "null")})
      b_.add_alternative(any_value_, {GrammarBuilder::ref(alt)});
    const int32_t member = b_.rule("member", {{GrammarBuilder::ref(string_of(0, -1)), w(), b_.literal(":")[0],
                                               w(), GrammarBuilder::ref(any_value_), w()}});
    const int32_t members =
        b_.repeat("members", {b_.literal(",")[0], w(), GrammarBuilder::ref(member)}, 0, -1);
    b_.add_alternative(any_object_, {b_.literal("{")[0], w(), b_.literal("}")[0]});
    b_.add_alternative(any_object_, {b_.literal("{")[0], w(), GrammarBuilder::ref(member),
                                     GrammarBuilder::ref(members), b_.literal("}")[0]});
    const int32_t element = b_.rule("element", {{GrammarBuilder::ref(any_value_), w()}});
    const int32_t elements =
        b_.repeat("elements", {b_.literal(",")[0], w(), GrammarBuilder::ref(element)}, 0, -1);
    b_.add_alternative(array, {b_.literal("[")[0], w(), b_.literal("]")[0]});
    b_.add_alternative(array, {b_.literal("[")[0], w(), GrammarBuilder::ref(element),
                               GrammarBuilder::ref(elements), b_.literal("]")[0]});
    return any_value_;
  }

  int32_t any_object() {
    any_value();
    return any_object_;
  }

  // ---- integer ranges --------------------------------------------------------------------------------

  // Digit strings of equal length n from x to y (x <= y), as a rule.
  int32_t digit_range(const std::string& x, const std::string& y) {
    if (x.empty()) return b_.rule("digits", {{}});
    if (x[0] == y[0]) {
      return b_.rule("digits", {{b_.byte_range(static_cast<uint8_t>(x[0]), static_cast<uint8_t>(x[0])),
                                 GrammarBuilder::ref(digit_range(x.substr(1), y.substr(1)))}});
    }
    const size_t rest = x.size() - 1;
    const std::string nines(rest, '9');
    const std::string zeros(rest, '0');
    std::vector<Sequence> alts;
    const auto x0 = static_cast<uint8_t>(x[0]);
    const auto y0 = static_cast<uint8_t>(y[0]);
    if (x.substr(1) == zeros && y.substr(1) == nines) {
      return b_.rule("digits",
                     {{b_.byte_range(x0, y0),
                       GrammarBuilder::ref(digits(static_cast<int64_t>(rest), static_cast<int64_t>(rest)))}});
    }
    alts.push_back({b_.byte_range(x0, x0), GrammarBuilder::ref(digit_range(x.substr(1), nines))});
    if (x0 + 1 <= y0 - 1) {
      alts.push_back({b_.byte_range(static_cast<uint8_t>(x0 + 1), static_cast<uint8_t>(y0 - 1)),
                      GrammarBuilder::ref(digits(static_cast<int64_t>(rest), static_cast<int64_t>(rest)))});
    }
    alts.push_back({b_.byte_range(y0, y0), GrammarBuilder::ref(digit_range(zeros, y.substr(1)))});
    return b_.rule("digits", alts);
  }

  // Non-negative integers in [lo, hi] written without leading zeros; hi empty: unbounded.
  void natural_range(uint64_t lo, std::optional<uint64_t> hi, std::vector<Sequence>& alts) {
    const std::string lo_text = std::to_string(lo);
    const size_t max_len = hi ? std::to_string(*hi).size() : lo_text.size();
    for (size_t len = lo_text.size(); len <= max_len; ++len) {
      std::string smallest(len, '0');
      if (len > 1) smallest[0] = '1';
      const std::string largest(len, '9');
      const std::string from = len == lo_text.size() ? lo_text : smallest;
      const std::string to = hi && len == max_len ? std::to_string(*hi) : largest;
      alts.push_back({GrammarBuilder::ref(digit_range(from, to))});
    }
    if (!hi) {
      // Every longer number: [1-9] followed by at least len(lo) digits.
      alts.push_back(
          {b_.byte_range('1', '9'), GrammarBuilder::ref(digits(static_cast<int64_t>(lo_text.size()), -1))});
    }
  }

  int32_t integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi, const std::string& path) {
    if (lo && hi && *lo > *hi) fail(path, "the integer range is empty (minimum above maximum)");
    std::vector<Sequence> alts;
    // Negative part: "-" followed by magnitudes in [max(1, -hi), -lo].
    if (!lo || *lo < 0) {
      const uint64_t mag_lo = hi && *hi < 0 ? static_cast<uint64_t>(-(*hi + 1)) + 1 : 1;
      std::optional<uint64_t> mag_hi;
      if (lo) mag_hi = static_cast<uint64_t>(-(*lo + 1)) + 1;
      std::vector<Sequence> magnitudes;
      natural_range(mag_lo, mag_hi, magnitudes);
      const int32_t negative = b_.rule("negative", magnitudes);
      alts.push_back({b_.literal("-")[0], GrammarBuilder::ref(negative)});
    }
    if (!hi || *hi >= 0) {
      const uint64_t from = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
      std::optional<uint64_t> to;
      if (hi) to = static_cast<uint64_t>(*hi);
      natural_range(from, to, alts);
    }
    return b_.rule("integer-range", alts);
  }

  // ---- schemas ---------------------------------------------------------------------------------------

  static std::string type_name(const ordered_json& v) {
    if (v.is_object()) return "an object";
    if (v.is_array()) return "an array";
    if (v.is_string()) return "a string";
    if (v.is_boolean()) return "a boolean";
    if (v.is_null()) return "null";
    return "a number";
  }

  static int64_t count_keyword(const ordered_json& s, const char* key, const std::string& path) {
    const ordered_json& v = s[key];
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      fail(path + "/" + key, "expected a non-negative integer, got " + type_name(v) + " " + v.dump());
    return v.get<int64_t>();
  }

  int32_t schema(const ordered_json& s, const std::string& path) {
    // Nesting is followed by recursion here; a bound keeps a hostile schema from exhausting the stack.
    if (++depth_ > kMaxNesting)
      fail(path, "the schema nests deeper than " + std::to_string(kMaxNesting) + " levels");
    const int32_t id = schema_at_depth(s, path);
    --depth_;
    return id;
  }

  int32_t schema_at_depth(const ordered_json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(path, "the schema false matches no value, so no output can satisfy it");
      return any_value();
    }
    if (!s.is_object()) fail(path, "expected a schema (an object or a boolean), got " + type_name(s));
    for (const auto& [key, value] : s.items()) {
      if (kUnsupported.count(key)) fail(path + "/" + key, "the keyword " + key + " is not supported");
    }
    if (s.contains("$ref")) return ref_schema(s, path);
    for (const char* key : {"anyOf", "oneOf"}) {
      if (s.contains(key)) return any_of(s, key, path);
    }
    if (s.contains("allOf")) {
      const ordered_json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1)
        fail(path + "/allOf", "only an allOf of exactly one schema is supported");
      check_alone(s, "allOf", path);
      return schema(all[0], path + "/allOf/0");
    }
    if (s.contains("const")) return b_.rule("const", {b_.literal(s["const"].dump())});
    if (s.contains("enum")) {
      const ordered_json& values = s["enum"];
      if (!values.is_array() || values.empty())
        fail(path + "/enum", "expected a non-empty array of values, got " + type_name(values));
      std::vector<Sequence> alts;
      for (const ordered_json& v : values) alts.push_back(b_.literal(v.dump()));
      return b_.rule("enum", alts);
    }
    if (!s.contains("type")) {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        return object(s, path);
      if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return array(s, path);
      if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) return string(s, path);
      return any_value();
    }
    const ordered_json& type = s["type"];
    if (type.is_string()) return typed(s, type.get<std::string>(), path + "/type", path);
    if (!type.is_array() || type.empty())
      fail(path + "/type", "expected a type name or a non-empty array of them, got " + type_name(type));
    std::vector<Sequence> alts;
    for (size_t i = 0; i < type.size(); ++i) {
      const std::string at = path + "/type/" + std::to_string(i);
      if (!type[i].is_string()) fail(at, "expected a type name, got " + type_name(type[i]));
      alts.push_back({GrammarBuilder::ref(typed(s, type[i].get<std::string>(), at, path))});
    }
    return b_.rule("types", alts);
  }

  // A keyword that replaces the schema (anyOf, $ref, ...) beside keywords that would have to be combined.
  static void check_alone(const ordered_json& s, const std::string& keyword, const std::string& path) {
    for (const auto& [key, value] : s.items()) {
      if (key != keyword && kShapeKeywords.count(key))
        fail(path + "/" + key,
             key + " beside " + keyword + " is not supported; move it into the " + keyword + " schema(s)");
    }
  }

  int32_t ref_schema(const ordered_json& s, const std::string& path) {
    const ordered_json& ref = s["$ref"];
    if (!ref.is_string()) fail(path + "/$ref", "expected a string, got " + type_name(ref));
    check_alone(s, "$ref", path);
    const std::string target = ref.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target.empty() || target[0] != '#')
      fail(path + "/$ref",
           "only references within the schema (starting with #) are supported, got " + target);
    const ordered_json* resolved = nullptr;
    try {
      const ordered_json::json_pointer pointer(target.substr(1));
      if (root_.contains(pointer)) resolved = &root_.at(pointer);
    } catch (const nlohmann::json::exception&) {
      fail(path + "/$ref", target + " is not a valid JSON pointer");
    }
    if (resolved == nullptr) fail(path + "/$ref", target + " does not point into the schema");
    // Declared before compiling the target, so that a recursive schema refers back to this rule.
    const int32_t id = b_.declare(target);
    refs_[target] = id;
    b_.add_alternative(id, {GrammarBuilder::ref(schema(*resolved, target))});
    return id;
  }

  int32_t any_of(const ordered_json& s, const char* key, const std::string& path) {
    const ordered_json& list = s[key];
    const std::string at = path + "/" + key;
    if (!list.is_array() || list.empty())
      fail(at, "expected a non-empty array of schemas, got " + type_name(list));
    check_alone(s, key, path);
    std::vector<Sequence> alts;
    for (size_t i = 0; i < list.size(); ++i)
      alts.push_back({GrammarBuilder::ref(schema(list[i], at + "/" + std::to_string(i)))});
    return b_.rule("any-of", alts);
  }

  int32_t typed(const ordered_json& s, const std::string& type, const std::string& type_path,
                const std::string& path) {
    if (type == "object") return object(s, path);
    if (type == "array") return array(s, path);
    if (type == "string") return string(s, path);
    if (type == "integer") return integer_schema(s, path);
    if (type == "number") return number_schema(s, path);
    if (type == "boolean") return b_.rule("boolean", {b_.literal("true"), b_.literal("false")});
    if (type == "null") return literal_rule("null", "null");
    fail(type_path,
         "unknown type \"" + type + "\" (expected object, array, string, integer, number, boolean or null)");
  }

  int32_t string(const ordered_json& s, const std::string& path) {
    int64_t min_length = 0;
    int64_t max_length = -1;
    if (s.contains("minLength")) min_length = count_keyword(s, "minLength", path);
    if (s.contains("maxLength")) max_length = count_keyword(s, "maxLength", path);
    if (max_length >= 0 && max_length < min_length) fail(path, "maxLength is below minLength");
    if (s.contains("format")) {
      const ordered_json& format = s["format"];
      if (!format.is_string()) fail(path + "/format", "expected a string, got " + type_name(format));
      const int32_t formatted = string_format(format.get<std::string>());
      if (formatted >= 0) {
        if (s.contains("minLength") || s.contains("maxLength"))
          fail(path + "/format", "a format together with minLength or maxLength is not supported");
        return formatted;
      }
    }
    return string_of(min_length, max_length);
  }

  // The formats worth enforcing cheaply; -1 for the others (annotations).
  int32_t string_format(const std::string& format) {
    const GrammarElement d = digit();
    const GrammarElement quote = b_.literal("\"")[0];
    auto two_digit = [&](const char* name, std::vector<std::pair<char, char>> firsts) {
      std::vector<Sequence> alts;
      for (auto [first, last] : firsts)
        alts.push_back({b_.byte_range(first, first), b_.byte_range('0', last)});
      return b_.rule(name, alts);
    };
    auto date = [&] {
      const int32_t month = b_.rule("month", {{b_.literal("0")[0], b_.byte_range('1', '9')},
                                              {b_.literal("1")[0], b_.byte_range('0', '2')}});
      const int32_t day = b_.rule("day", {{b_.literal("0")[0], b_.byte_range('1', '9')},
                                          {b_.byte_range('1', '2'), d},
                                          {b_.literal("3")[0], b_.byte_range('0', '1')}});
      return Sequence{d,
                      d,
                      d,
                      d,
                      b_.literal("-")[0],
                      GrammarBuilder::ref(month),
                      b_.literal("-")[0],
                      GrammarBuilder::ref(day)};
    };
    auto time = [&] {
      const int32_t hour = two_digit("hour", {{'0', '9'}, {'1', '9'}, {'2', '3'}});
      const int32_t minute = b_.rule("minute", {{b_.byte_range('0', '5'), d}});
      const int32_t fraction =
          b_.rule("fraction", {{}, {b_.literal(".")[0], GrammarBuilder::ref(digits(1, 9))}});
      ByteClass sign;
      sign.set('+');
      sign.set('-');
      const int32_t offset = b_.rule("offset", {b_.literal("Z"),
                                                {b_.bytes(sign), GrammarBuilder::ref(hour),
                                                 b_.literal(":")[0], GrammarBuilder::ref(minute)}});
      return Sequence{GrammarBuilder::ref(hour),  b_.literal(":")[0],          GrammarBuilder::ref(minute),
                      b_.literal(":")[0],         GrammarBuilder::ref(minute), GrammarBuilder::ref(fraction),
                      GrammarBuilder::ref(offset)};
    };
    Sequence body;
    if (format == "date") {
      body = date();
    } else if (format == "time") {
      body = time();
    } else if (format == "date-time") {
      body = date();
      body.push_back(b_.literal("T")[0]);
      const Sequence t = time();
      body.insert(body.end(), t.begin(), t.end());
    } else if (format == "uuid") {
      const GrammarElement h = hex_digit();
      for (int group : {8, 4, 4, 4, 12}) {
        if (!body.empty()) body.push_back(b_.literal("-")[0]);
        for (int i = 0; i < group; ++i) body.push_back(h);
      }
    } else {
      return -1;
    }
    body.insert(body.begin(), quote);
    body.push_back(quote);
    return b_.rule(format, {body});
  }

  // An integer bound: a number, rounded inward to an integer (and moved past an exclusive bound).
  static std::optional<int64_t> integer_bound(const ordered_json& s, std::string_view inclusive,
                                              std::string_view exclusive, bool lower,
                                              const std::string& path) {
    std::optional<double> bound;
    bool is_exclusive = false;
    for (std::string_view key_view : {inclusive, exclusive}) {
      const std::string key(key_view);
      if (!s.contains(key)) continue;
      const ordered_json& v = s[key];
      if (v.is_boolean()) {  // draft 4: exclusiveMinimum/exclusiveMaximum qualify minimum/maximum
        if (key == exclusive)
          is_exclusive = is_exclusive || v.get<bool>();
        else
          fail(path + "/" + key, "expected a number, got a boolean");
        continue;
      }
      if (!v.is_number()) fail(path + "/" + key, "expected a number, got " + type_name(v));
      const double x = v.get<double>();
      if (!std::isfinite(x) || std::fabs(x) > 1e18)
        fail(path + "/" + key, "the bound is out of range (|x| <= 1e18)");
      if (key == exclusive) {
        const double adjusted = lower ? std::floor(x) + 1 : std::ceil(x) - 1;
        bound = bound ? (lower ? std::max(*bound, adjusted) : std::min(*bound, adjusted)) : adjusted;
      } else {
        bound = bound ? (lower ? std::max(*bound, x) : std::min(*bound, x)) : x;
      }
    }
    if (!bound) return std::nullopt;
    double value = lower ? std::ceil(*bound) : std::floor(*bound);
    const std::string inclusive_key(inclusive);
    if (is_exclusive && s.contains(inclusive_key) && !s[inclusive_key].is_boolean() &&
        value == s[inclusive_key].get<double>())
      value += lower ? 1 : -1;
    return static_cast<int64_t>(value);
  }

  int32_t integer_schema(const ordered_json& s, const std::string& path) {
    const auto lo = integer_bound(s, "minimum", "exclusiveMinimum", true, path);
    const auto hi = integer_bound(s, "maximum", "exclusiveMaximum", false, path);
    if (!lo && !hi) return integer(true);
    return integer_range(lo.value_or(-kMaxInteger), hi.value_or(kMaxInteger), path);
  }

  int32_t number_schema(const ordered_json& s, const std::string& path) {
    for (const char* key : {"maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (s.contains(key))
        fail(path + "/" + key,
             std::string(key) + " on a number is not supported (use type integer, or only minimum 0)");
    }
    if (s.contains("minimum")) {
      const ordered_json& m = s["minimum"];
      if (!m.is_number() || m.get<double>() != 0.0)
        fail(path + "/minimum",
             "only minimum 0 is supported on a number (use type integer for other bounds)");
      return number(false);
    }
    return number(true);
  }

  int32_t array(const ordered_json& s, const std::string& path) {
    int64_t min_items = 0;
    int64_t max_items = -1;
    if (s.contains("minItems")) min_items = count_keyword(s, "minItems", path);
    if (s.contains("maxItems")) max_items = count_keyword(s, "maxItems", path);
    if (max_items >= 0 && max_items < min_items) fail(path, "maxItems is below minItems");
    int32_t item = -1;
    if (s.contains("items")) {
      const ordered_json& items = s["items"];
      if (items.is_array()) fail(path + "/items", "a list of item schemas (tuple) is not supported");
      if (items.is_boolean() && !items.get<bool>()) {
        if (min_items > 0) fail(path + "/items", "items false leaves no item for minItems");
        max_items = 0;
      } else {
        item = schema(items, path + "/items");
      }
    }
    if (item < 0 && max_items != 0) item = any_value();
    const GrammarElement open = b_.literal("[")[0];
    const GrammarElement close = b_.literal("]")[0];
    if (max_items == 0) return b_.rule("array", {{open, w(), close}});
    const int32_t element = b_.rule("element", {{GrammarBuilder::ref(item), w()}});
    const int32_t more = b_.repeat("elements", {b_.literal(",")[0], w(), GrammarBuilder::ref(element)},
                                   std::max<int64_t>(min_items - 1, 0), max_items < 0 ? -1 : max_items - 1);
    std::vector<Sequence> alts = {
        {open, w(), GrammarBuilder::ref(element), GrammarBuilder::ref(more), close}};
    if (min_items == 0) alts.push_back({open, w(), close});
    return b_.rule("array", alts);
  }

  struct Property {
    std::string name;
    int32_t value;
    bool required;
  };

  int32_t object(const ordered_json& s, const std::string& path) {
    std::vector<Property> props;
    std::set<std::string> required;
    if (s.contains("required")) {
      const ordered_json& r = s["required"];
      if (!r.is_array()) fail(path + "/required", "expected an array of property names, got " + type_name(r));
      for (size_t i = 0; i < r.size(); ++i) {
        if (!r[i].is_string())
          fail(path + "/required/" + std::to_string(i), "expected a property name, got " + type_name(r[i]));
        required.insert(r[i].get<std::string>());
      }
    }
    const bool has_properties = s.contains("properties");
    if (has_properties) {
      const ordered_json& p = s["properties"];
      if (!p.is_object()) fail(path + "/properties", "expected an object of schemas, got " + type_name(p));
      for (const auto& [name, sub] : p.items())
        props.push_back(
            {name, schema(sub, path + "/properties/" + escape_pointer(name)), required.count(name) > 0});
    }
    // Extra properties: absent means allowed only for an object without declared properties.
    int32_t extra_value = -1;
    if (s.contains("additionalProperties")) {
      const ordered_json& a = s["additionalProperties"];
      if (a.is_boolean()) {
        if (a.get<bool>()) extra_value = any_value();
      } else {
        extra_value = schema(a, path + "/additionalProperties");
      }
    } else if (!has_properties) {
      extra_value = any_value();
    }
    for (const std::string& name : required) {
      const bool declared =
          std::any_of(props.begin(), props.end(), [&](const Property& p) { return p.name == name; });
      if (declared) continue;
      if (extra_value < 0)
        fail(path + "/required", "required property \"" + name +
                                     "\" is not in properties and additionalProperties does not allow it");
      props.push_back({name, extra_value, true});
    }

    // body(i, comma): the properties from i on (each followed by whitespace), the first one preceded by a
    // comma when `comma`; built from the end so each refers to the next.
    const GrammarElement comma = b_.literal(",")[0];
    int32_t next_no_comma = -1;
    int32_t next_comma = -1;
    if (extra_value >= 0) {
      std::vector<std::string> names;
      for (const Property& p : props) names.push_back(p.name);
      const int32_t key = extra_key(names);
      const int32_t member = b_.rule("extra", {{GrammarBuilder::ref(key), w(), b_.literal(":")[0], w(),
                                                GrammarBuilder::ref(extra_value), w()}});
      const int32_t rest = b_.repeat("extras", {comma, w(), GrammarBuilder::ref(member)}, 0, -1);
      next_no_comma = b_.rule("extras", {{}, {GrammarBuilder::ref(member), GrammarBuilder::ref(rest)}});
      next_comma =
          b_.rule("extras", {{}, {comma, w(), GrammarBuilder::ref(member), GrammarBuilder::ref(rest)}});
    } else {
      next_no_comma = next_comma = b_.rule("end", {{}});
    }
    for (size_t i = props.size(); i-- > 0;) {
      const Property& p = props[i];
      Sequence kv = b_.literal(quoted(p.name));
      for (GrammarElement e : {w(), b_.literal(":")[0], w(), GrammarBuilder::ref(p.value), w()})
        kv.push_back(e);
      Sequence first = kv;
      first.push_back(GrammarBuilder::ref(next_comma));
      Sequence later = {comma, w()};
      later.insert(later.end(), first.begin(), first.end());
      std::vector<Sequence> no_comma_alts = {first};
      std::vector<Sequence> comma_alts = {later};
      if (!p.required) {
        no_comma_alts.push_back({GrammarBuilder::ref(next_no_comma)});
        comma_alts.push_back({GrammarBuilder::ref(next_comma)});
      }
      const int32_t no_comma_rule = b_.rule("props", no_comma_alts);
      next_comma = b_.rule("props", comma_alts);
      next_no_comma = no_comma_rule;
    }
    return b_.rule("object",
                   {{b_.literal("{")[0], w(), GrammarBuilder::ref(next_no_comma), b_.literal("}")[0]}});
  }

  static std::string escape_pointer(const std::string& name) {
    std::string out;
    for (char c : name) {
      if (c == '~')
        out += "~0";
      else if (c == '/')
        out += "~1";
      else
        out += c;
    }
    return out;
  }

  // A quoted property name in printable ASCII without escapes that is none of `declared`: a trie over the
  // declared names, where leaving the trie frees the rest of the name and a quote may close the name
  // only at a node that is not a declared name.
  int32_t extra_key(const std::vector<std::string>& declared) {
    ByteClass printable;
    for (int c = 0x20; c < 0x7F; ++c) printable.set(static_cast<size_t>(c));
    printable.reset('"');
    printable.reset('\\');
    const GrammarElement quote = b_.literal("\"")[0];
    const int32_t free_rest = b_.repeat("name-rest", {b_.bytes(printable)}, 0, -1);
    std::set<std::string> names;
    for (const std::string& name : declared) {
      const bool plain =
          std::all_of(name.begin(), name.end(), [&](char c) { return printable[static_cast<uint8_t>(c)]; });
      if (plain) names.insert(name);
    }
    // node(prefix): the rest of a name that starts with `prefix` (a prefix of some declared name).
    auto node = [&](auto& self, const std::string& prefix) -> int32_t {
      std::set<char> children;
      for (const std::string& n : names)
        if (n.size() > prefix.size() && n.compare(0, prefix.size(), prefix) == 0)
          children.insert(n[prefix.size()]);
      std::vector<Sequence> alts;
      if (!names.count(prefix)) alts.push_back({quote});
      ByteClass others = printable;
      for (char c : children) {
        others.reset(static_cast<uint8_t>(c));
        alts.push_back({b_.literal(std::string(1, c))[0], GrammarBuilder::ref(self(self, prefix + c))});
      }
      if (others.any()) alts.push_back({b_.bytes(others), GrammarBuilder::ref(free_rest), quote});
      return b_.rule("name", alts);
    };
    return b_.rule("extra-key", {{quote, GrammarBuilder::ref(node(node, ""))}});
  }

  const ordered_json& root_;
  GrammarBuilder& b_;
  std::map<std::string, int32_t> refs_;
  std::map<std::pair<int64_t, int64_t>, int32_t> strings_;
  int depth_ = 0;
  int32_t ws_ = -1;
  int32_t string_char_ = -1;
  int32_t integer_ = -1;
  int32_t natural_ = -1;
  int32_t number_ = -1;
  int32_t non_negative_number_ = -1;
  int32_t any_value_ = -1;
  int32_t any_object_ = -1;
};

}  // namespace

Grammar grammar_from_json_schema(std::string_view schema_text) {
  ordered_json schema;
  try {
    schema = ordered_json::parse(schema_text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(std::string("JSON schema is not valid JSON: ") + e.what());
  }
  return grammar_from_parsed_json_schema(schema);
}

Grammar grammar_from_parsed_json_schema(const ordered_json& schema) {
  GrammarBuilder b;
  const int32_t root = b.rule("root", {{GrammarBuilder::ref(add_json_schema_rules(b, schema))}});
  return build_json_grammar(std::move(b), root);
}

int32_t add_json_schema_rules(GrammarBuilder& builder, const ordered_json& schema) {
  return SchemaCompiler(schema, builder).value();
}

Grammar build_json_grammar(GrammarBuilder&& builder, int32_t root) {
  try {
    return std::move(builder).build(root);
  } catch (const Error& e) {
    // The only way a schema yields left recursion: a $ref cycle that writes nothing in between.
    throw Error(std::string("JSON schema refers to itself without any JSON text in between: ") + e.what());
  }
}

Grammar json_object_grammar() {
  const ordered_json empty = ordered_json::object();
  GrammarBuilder b;
  const int32_t root = b.rule("root", {{GrammarBuilder::ref(SchemaCompiler(empty, b).any_object_value())}});
  return std::move(b).build(root);
}

}  // namespace tandem::sampling
