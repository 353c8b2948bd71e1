// JSON schema compiler tests: each supported feature accepts its valid examples and refuses invalid ones
// (as text, and token by token on real vocabularies with the mask allowing every token of a valid text);
// random walks that sample only allowed tokens always end in JSON that parses and validates against the
// schema (checked by a small independent validator below); malformed schemas give errors naming their
// place in the schema; JSON mode accepts any object.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/sampling/grammar.h"
#include "tandem/sampling/json_schema.h"
#include "tandem/sampling/token_mask.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace tandem::sampling {
namespace {

using nlohmann::ordered_json;
using testing::shared_path;

bool matches(const Grammar& g, std::string_view text) {
  GrammarStates states(g);
  const int32_t s = states.advance(states.initial(), text);
  return s != GrammarStates::kDead && states.accepting(s);
}

// ---- an independent validator for the keywords the compiler supports ----------------------------------

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool validate(const ordered_json& v, const ordered_json& s, const ordered_json& root);

bool validate_type(const ordered_json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "integer") return v.is_number_integer();
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  return false;
}

bool validate(const ordered_json& v, const ordered_json& s, const ordered_json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return validate(v, root.at(ordered_json::json_pointer(ref.substr(1))), root);
  }
  if (s.contains("anyOf") || s.contains("oneOf")) {
    const ordered_json& list = s.contains("anyOf") ? s["anyOf"] : s["oneOf"];
    bool any = false;
    for (const ordered_json& branch : list) any = any || validate(v, branch, root);
    if (!any) return false;
  }
  if (s.contains("allOf"))
    for (const ordered_json& branch : s["allOf"])
      if (!validate(v, branch, root)) return false;
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum")) {
    bool found = false;
    for (const ordered_json& e : s["enum"]) found = found || v == e;
    if (!found) return false;
  }
  if (s.contains("type")) {
    const ordered_json& t = s["type"];
    bool ok = false;
    if (t.is_string()) ok = validate_type(v, t);
    for (const ordered_json& one : t.is_array() ? t : ordered_json::array()) ok = ok || validate_type(v, one);
    if (!ok) return false;
  }
  if (v.is_object()) {
    const ordered_json props = s.value("properties", ordered_json::object());
    for (const ordered_json& r : s.value("required", ordered_json::array()))
      if (!v.contains(r.get<std::string>())) return false;
    for (const auto& [key, value] : v.items()) {
      if (props.contains(key)) {
        if (!validate(value, props[key], root)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!validate(value, s["additionalProperties"], root)) return false;
      } else if (!props.empty()) {
        return false;  // the compiler's documented default: only declared properties
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.contains("items"))
      for (const ordered_json& item : v)
        if (!validate(item, s["items"], root)) return false;
  }
  if (v.is_string()) {
    const std::string text = v;
    if (s.contains("minLength") && code_points(text) < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && code_points(text) > s["maxLength"].get<size_t>()) return false;
    static const std::map<std::string, std::regex> formats = {
        {"date", std::regex(R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))")},
        {"time", std::regex(R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))")},
        {"date-time",
         std::regex(R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d)"
                    R"((\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))")},
        {"uuid",
         std::regex(R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})")}};
    if (s.contains("format")) {
      auto it = formats.find(s["format"].get<std::string>());
      if (it != formats.end() && !std::regex_match(text, it->second)) return false;
    }
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
    if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return false;
    if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return false;
  }
  return true;
}

// ---- features, as text ----------------------------------------------------------------------------------

struct Feature {
  const char* name;
  const char* schema;
  std::vector<std::string> valid;
  std::vector<std::string> invalid;
};

const std::vector<Feature>& features() {
  static const std::vector<Feature> list = {
      {"RequiredAndOptional",
       R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a"]})",
       {R"({"a":1})", R"({"a":-5,"b":"x"})", "{ \"a\": 1, \"b\": \"\"}", "{\n  \"a\": 1,\n  \"b\": \"q\"\n}"},
       {"{}", R"({"b":"x"})", R"({"b":"x","a":1})", R"({"a":1,"c":2})", R"({"a":"1"})", R"({"a":1,})",
        R"({"a":1} )", R"( {"a":1})"}},
      {"AllOptional",
       R"({"type":"object","properties":{"x":{"type":"boolean"},"y":{"type":"null"}}})",
       {"{}", R"({"y":null})", R"({"x":true,"y":null})", R"({"x":false})"},
       {R"({,"y":null})", R"({"y":null,"x":true})", R"({"x":true,})"}},
      {"ArrayBounds",
       R"({"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":3})",
       {"[true]", "[true, false,true]", "[ false ]"},
       {"[]", "[true,true,true,true]", "[1]", "[true,]"}},
      {"ArrayAny", R"({"type":"array"})", {"[]", R"([1,"a",{"b":[null]}])"}, {"[", "{}"}},
      {"Enum",
       R"({"enum":["red","green",3,null]})",
       {R"("red")", "3", "null"},
       {R"("blue")", R"("RED")", "4", R"("red" )"}},
      {"Const", R"({"const":{"x":[1,2]}})", {R"({"x":[1,2]})"}, {R"({"x":[1]})", R"({"x":[1,2,3]})"}},
      {"StringLength",
       R"({"type":"string","minLength":2,"maxLength":3})",
       {R"("ab")",
        "\"\xC3\xA9\xE2\x82\xAC"
        "x\"",
        R"("a\n")", R"("\u00e9\u00e9")"},
       {R"("a")", R"("abcd")", "\"\xC3\"", "\"a\x01\"", R"("\x")"}},
      {"Date",
       R"({"type":"string","format":"date"})",
       {R"("2024-02-29")"},
       {R"("2024-13-01")", R"("24-01-01")"}},
      {"DateTime",
       R"({"type":"string","format":"date-time"})",
       {R"("2024-01-01T12:30:00Z")", R"("2024-01-01T23:59:59.123+05:30")"},
       {R"("2024-01-01T24:00:00Z")", R"("2024-01-01 12:30:00Z")", R"("2024-01-01T12:30:00")"}},
      {"Uuid",
       R"({"type":"string","format":"uuid"})",
       {R"("123e4567-e89b-12d3-a456-426614174000")"},
       {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"}},
      {"Number",
       R"({"type":"number"})",
       {"0", "-1.5", "2e10", "1.0E-3", "12"},
       {"01", "1.", ".5", "+1", "1e", "--1", "1e123", "1234567890123456789"}},
      {"Integer",
       R"({"type":"integer"})",
       {"-999999999999999999", "0"},
       {"1000000000000000000", "1.5", "1e3"}},
      {"NonNegativeNumber", R"({"type":"number","minimum":0})", {"0", "3.25", "1e-9"}, {"-1", "-0.5"}},
      {"AnyOf",
       R"({"anyOf":[{"type":"string","maxLength":1},{"type":"null"},{"$ref":"#/$defs/n"}],"$defs":{"n":{"type":"integer"}}})",
       {R"("a")", "null", "-7"},
       {R"("ab")", "true", "1.5"}},
      {"TypeList", R"({"type":["integer","null"]})", {"5", "null"}, {R"("5")", "false"}},
      {"RecursiveRef",
       R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
           "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}}})",
       {R"({"v":1})", R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"},
       {R"({"v":1,"kids":[{"v":2},{"v":3},{"v":4}]})", R"({"v":1,"kids":[{}]})"}},
      {"AdditionalProperties",
       R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})",
       {R"({"a":1,"b":true})", R"({"ab":false})", R"({"":true})", R"({"a":1})", "{}"},
       {R"({"a":true})", R"({"b":1})", R"({"a":1,"a":true})"}},
      {"AnyObject", R"({"type":"object"})", {"{}", R"({"k":[1,{"z":null}]})"}, {"[]", R"({"k"})"}},
      {"IntegerRange",
       R"({"type":"integer","minimum":-12,"maximum":345})",
       {"-12", "-1", "0", "7", "99", "345"},
       {"-13", "346", "1000", "01", "3.0"}},
  };
  return list;
}

class SchemaFeature : public ::testing::TestWithParam<Feature> {};

TEST_P(SchemaFeature, AcceptsValidRefusesInvalid) {
  const Feature& f = GetParam();
  const Grammar g = grammar_from_json_schema(f.schema);
  const ordered_json schema = ordered_json::parse(f.schema);
  for (const std::string& text : f.valid) {
    EXPECT_TRUE(matches(g, text)) << text;
    // The examples themselves are checked by the independent validator, so that they test the compiler.
    EXPECT_TRUE(validate(ordered_json::parse(text), schema, schema)) << text;
  }
  for (const std::string& text : f.invalid) EXPECT_FALSE(matches(g, text)) << text;
}

INSTANTIATE_TEST_SUITE_P(Features, SchemaFeature, ::testing::ValuesIn(features()),
                         [](const ::testing::TestParamInfo<Feature>& param_info) {
                           return std::string(param_info.param.name);
                         });

TEST(SchemaIntegers, RangesMatchExactlyTheirIntegers) {
  struct Case {
    const char* schema;
    int64_t lo, hi;  // the range the schema allows, checked over [-1200, 1200]
  };
  const Case cases[] = {
      {R"({"type":"integer","minimum":-12,"maximum":345})", -12, 345},
      {R"({"type":"integer","exclusiveMinimum":0})", 1, 1200},
      {R"({"type":"integer","minimum":100})", 100, 1200},
      {R"({"type":"integer","maximum":-3})", -1200, -3},
      {R"({"type":"integer","minimum":-1000,"exclusiveMaximum":9.5})", -1000, 9},
      {R"({"type":"integer","minimum":5,"maximum":5})", 5, 5},
  };
  for (const Case& c : cases) {
    const Grammar g = grammar_from_json_schema(c.schema);
    for (int64_t n = -1200; n <= 1200; ++n)
      ASSERT_EQ(matches(g, std::to_string(n)), n >= c.lo && n <= c.hi) << c.schema << " at " << n;
  }
  EXPECT_TRUE(matches(grammar_from_json_schema(R"({"type":"integer","minimum":100})"), "123456789012"));
}

TEST(JsonMode, AnyObject) {
  const Grammar g = json_object_grammar();
  for (const char* ok : {"{}", R"({"a":[1,{"b":null}],"c":"\u00e9","d":-0.5e3})", "{\n  \"a\": true\n}"})
    EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"[]", R"("x")", R"({"a"})", R"({"a":1,})", "{}}", R"({'a':1})"})
    EXPECT_FALSE(matches(g, bad)) << bad;
}

// ---- errors -----------------------------------------------------------------------------------------------

TEST(SchemaErrors, NameThePlaceAndTheProblem) {
  const std::pair<const char*, std::vector<const char*>> cases[] = {
      {R"({"type":"intger"})", {"#/type", "unknown type \"intger\""}},
      {R"({"properties":{"age":{"type":"integer","minimum":"x"}}})", {"#/properties/age/minimum", "number"}},
      {R"({"$ref":"#/$defs/missing"})", {"#/$ref", "does not point"}},
      {R"({"type":"string","pattern":"^a"})", {"#/pattern", "not supported"}},
      {R"({"type":"array","minItems":-1})", {"#/minItems", "non-negative integer"}},
      {R"({"type":"array","minItems":3,"maxItems":2})", {"#", "maxItems is below minItems"}},
      {R"({"required":["x"],"properties":{"y":{}},"additionalProperties":false})", {"#/required", "\"x\""}},
      {R"({"anyOf":[]})", {"#/anyOf", "non-empty array"}},
      {R"({"properties":{"a":{"anyOf":[{"type":"string"}],"type":"string"}}})",
       {"#/properties/a/type", "anyOf"}},
      {R"({"type":"integer","minimum":10,"maximum":1})", {"#", "empty"}},
      {R"({"items":{"type":[]}})", {"#/items/type", "non-empty array"}},
      {R"({"properties":{"a/b":false}})", {"#/properties/a~1b", "false"}},
      {R"({"$ref":"#/$defs/a","$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}}})",
       {"refers to itself", "#/$defs/a"}},
      {R"({"type":"object"})", {}},
      {"{", {"not valid JSON"}},
      {"[1]", {"#", "expected a schema"}},
  };
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += R"({"items":)";
  deep += "true" + std::string(100000, '}');
  try {
    grammar_from_json_schema(deep);
    ADD_FAILURE() << "no error for a schema nested 100000 deep";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nests deeper than"), std::string::npos) << e.what();
  }
  for (const auto& [schema, parts] : cases) {
    if (parts.empty()) {
      EXPECT_NO_THROW(grammar_from_json_schema(schema)) << schema;
      continue;
    }
    try {
      grammar_from_json_schema(schema);
      ADD_FAILURE() << "no error for " << schema;
    } catch (const Error& e) {
      for (const char* part : parts)
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }
}

// ---- token level ------------------------------------------------------------------------------------------

const char* kNestedSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string", "format": "email"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    "address": {"$ref": "#/$defs/address"},
    "role": {"enum": ["admin", "user", null]},
    "score": {"type": "number"},
    "active": {"type": "boolean"},
    "birthday": {"type": "string", "format": "date"},
    "id": {"anyOf": [{"type": "string", "format": "uuid"}, {"type": "integer"}]}
  },
  "required": ["name", "age", "address", "role"],
  "$defs": {
    "address": {
      "type": "object",
      "properties": {
        "street": {"type": "string", "maxLength": 20},
        "zip": {"type": "string", "minLength": 5, "maxLength": 5},
        "geo": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
      },
      "required": ["street"]
    }
  }
})";

struct Vocab {
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::shared_ptr<const TokenTrie> trie;
  std::unordered_map<std::string, std::vector<int32_t>> ids_by_piece;
};

const Vocab& vocab(const std::string& relative) {
  static std::map<std::string, Vocab> cache;
  Vocab& v = cache[relative];
  if (!v.tokenizer) {
    v.tokenizer = tokenizer::Tokenizer::from_gguf(gguf::File::open(shared_path(relative)));
    v.trie = TokenTrie::build(*v.tokenizer);
    for (int32_t id = 0; id < v.trie->n_vocab(); ++id)
      if (!v.trie->is_eog(id) && !v.trie->piece(id).empty())
        v.ids_by_piece[std::string(v.trie->piece(id))].push_back(id);
  }
  return v;
}

// Some token sequence whose pieces spell `text`: the longest piece at each point (greedy), or a random
// one of the pieces that fit.
std::vector<int32_t> spell(const Vocab& v, const std::string& text, std::mt19937* rng) {
  std::vector<int32_t> ids;
  for (size_t pos = 0; pos < text.size();) {
    std::vector<int32_t> fits;
    for (size_t len = std::min<size_t>(static_cast<size_t>(v.trie->max_depth()), text.size() - pos); len > 0;
         --len) {
      auto it = v.ids_by_piece.find(text.substr(pos, len));
      if (it != v.ids_by_piece.end()) fits.push_back(it->second.front());
      if (!fits.empty() && rng == nullptr) break;
    }
    if (fits.empty()) return {};
    const int32_t id = rng ? fits[std::uniform_int_distribution<size_t>(0, fits.size() - 1)(*rng)] : fits[0];
    ids.push_back(id);
    pos += v.trie->piece(id).size();
  }
  return ids;
}

const char* kVocabs[] = {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf",
                         "vocab/ggml-vocab-deepseek-llm.gguf", "vocab/ggml-vocab-phi-3.gguf",
                         "models/stories260K.gguf"};

// Every way of spelling a valid text is allowed by the masks token by token, and the end of generation
// comes exactly at its end.
void expect_tokens_allowed(const std::shared_ptr<const Grammar>& g, const Vocab& v,
                           const std::vector<int32_t>& ids, const std::string& text) {
  GrammarMatcher m(g, v.trie);
  TokenMask mask;
  for (size_t i = 0; i < ids.size(); ++i) {
    m.fill_mask(mask);
    ASSERT_TRUE(mask.test(ids[i])) << text << ": token " << i << " '" << v.trie->piece(ids[i])
                                   << "' is masked";
    ASSERT_TRUE(m.accept_token(ids[i]));
    EXPECT_EQ(m.complete(), i + 1 == ids.size()) << text << " after token " << i;
  }
  m.fill_mask(mask);
  for (int32_t eog : v.trie->eog_tokens()) EXPECT_TRUE(mask.test(eog)) << text;
}

TEST(SchemaTokens, MasksAllowEverySpellingOfValidTexts) {
  const std::vector<std::pair<const char*, std::vector<std::string>>> cases = {
      {kNestedSchema,
       {R"({"name":"Ann","age":42,"address":{"street":"1 Main St"},"role":"admin"})",
        "{\n  \"name\": \"Bo \\\"B\\\"\",\n  \"age\": 0,\n  \"tags\": [\"x\", \"y\"],\n  \"address\": "
        "{\"street\": "
        "\"\", \"zip\": \"12345\", \"geo\": [1.5, -2e3]},\n  \"role\": null,\n  \"active\": true,\n  "
        "\"birthday\": "
        "\"1999-12-31\",\n  \"id\": \"123e4567-e89b-12d3-a456-426614174000\"\n}",
        "{\"name\":\"\xC3\xA9t\xC3\xA9\",\"age\":150,\"address\":{\"street\":\"\\u00e9\"},\"role\":\"user\","
        "\"id\":-3}"}},
      {R"({"type":"array","items":{"type":"string"}})", {R"(["hello world", "", "a\tb"])"}},
  };
  for (const char* path : kVocabs) {
    const Vocab& v = vocab(path);
    for (const auto& [schema, texts] : cases) {
      const auto g = std::make_shared<const Grammar>(grammar_from_json_schema(schema));
      std::mt19937 rng(11);
      for (const std::string& text : texts) {
        SCOPED_TRACE(path);
        ASSERT_TRUE(matches(*g, text)) << text;
        const std::vector<int32_t> greedy = spell(v, text, nullptr);
        ASSERT_FALSE(greedy.empty()) << "cannot spell " << text;
        expect_tokens_allowed(g, v, greedy, text);
        for (int trial = 0; trial < 3; ++trial) expect_tokens_allowed(g, v, spell(v, text, &rng), text);
        // The tokenizer's own encoding, where its pieces spell the text (no added leading space).
        const std::vector<int32_t> encoded = v.tokenizer->encode(text, false, false);
        std::string spelled;
        for (int32_t id : encoded) spelled += v.trie->piece(id);
        if (spelled == text) expect_tokens_allowed(g, v, encoded, text);
      }
    }
  }
}

// Samples only allowed tokens: half the time any of them, otherwise one whose piece is a single byte (so
// that strings close and structures end within the step budget), ending generation when allowed.
std::string random_walk(GrammarMatcher& m, const Vocab& v, std::mt19937& rng, int max_steps) {
  TokenMask mask;
  std::string text;
  for (int step = 0; step < max_steps; ++step) {
    m.fill_mask(mask);
    const std::vector<int32_t> allowed = mask.allowed_ids();
    if (allowed.empty()) {
      ADD_FAILURE() << "no token allowed after " << text;
      return text;
    }
    if (m.complete() && rng() % 2 == 0) {
      EXPECT_TRUE(m.accept_token(v.trie->eog_tokens().front()));
      return text;
    }
    std::vector<int32_t> short_ids;
    if (rng() % 4 != 0)
      for (int32_t id : allowed)
        if (v.trie->piece(id).size() == 1) short_ids.push_back(id);
    const std::vector<int32_t>& pool = short_ids.empty() ? allowed : short_ids;
    const int32_t id = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
    EXPECT_TRUE(m.accept_token(id));
    if (!v.trie->is_eog(id)) text += v.trie->piece(id);
    if (m.terminated()) return text;
  }
  ADD_FAILURE() << "the walk did not end within " << max_steps << " steps: " << text;
  return text;
}

TEST(SchemaTokens, RandomWalksYieldValidJson) {
  const std::vector<const char*> schemas = {
      kNestedSchema,
      R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"v":{"type":"integer","minimum":-5,
          "maximum":5},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}}})",
      R"({"type":"object","properties":{"k":{"enum":["a","b"]}},"additionalProperties":{"type":"integer"}})",
  };
  for (const char* path : {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf"}) {
    const Vocab& v = vocab(path);
    for (const char* schema_text : schemas) {
      const auto g = std::make_shared<const Grammar>(grammar_from_json_schema(schema_text));
      const ordered_json schema = ordered_json::parse(schema_text);
      GrammarMatcher base(g, v.trie);
      for (uint32_t seed = 0; seed < 8; ++seed) {
        std::mt19937 rng(seed);
        GrammarMatcher m = base.clone();
        const std::string text = random_walk(m, v, rng, 3000);
        ASSERT_TRUE(m.terminated()) << path << " seed " << seed << ": " << text;
        ordered_json value;
        ASSERT_NO_THROW(value = ordered_json::parse(text)) << text;
        EXPECT_TRUE(validate(value, schema, schema)) << path << " seed " << seed << ": " << text;
      }
    }
  }
}

TEST(SchemaTokens, JsonModeWalksYieldObjects) {
  const Vocab& v = vocab("vocab/ggml-vocab-phi-3.gguf");
  const auto g = std::make_shared<const Grammar>(json_object_grammar());
  for (uint32_t seed = 0; seed < 8; ++seed) {
    std::mt19937 rng(seed);
    GrammarMatcher m(g, v.trie);
    const std::string text = random_walk(m, v, rng, 3000);
    ordered_json value;
    ASSERT_NO_THROW(value = ordered_json::parse(text)) << text;
    EXPECT_TRUE(value.is_object()) << text;
  }
}

}  // namespace
}  // namespace tandem::sampling
