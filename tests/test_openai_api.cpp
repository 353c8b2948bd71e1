// OpenAI request validation (each bad input -> the right status and an error object naming the field),
// response shapes, and the text assembler's stop-sequence handling.
#include <gtest/gtest.h>

#include "tandem/server/openai_api.h"
#include "tandem/server/text_assembler.h"
#include "tandem/tokenizer/tokenizer.h"
#include "test_util.h"

namespace {

using namespace tandem::server;
using nlohmann::json;

const ApiLimits kLimits{"m", 512};

// The ApiError a body raises (status 0 when it parses).
ApiError error_of(const std::string& body, bool chat) {
  try {
    parse_request(body, chat, kLimits);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "", "parsed");
}

TEST(OpenAiApi, ParsesCompletion) {
  auto r = parse_request(
      R"({"model":"m","prompt":"Once","max_tokens":5,"temperature":0,"top_p":0.5,"seed":7,"stop":["a","b"],
          "logprobs":2,"stream":true,"stream_options":{"include_usage":true},"user":"x","echo":false})",
      false, kLimits);
  EXPECT_EQ(r.prompt, "Once");
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_EQ(r.temperature, 0);
  EXPECT_EQ(r.top_p, 0.5);
  EXPECT_EQ(*r.seed, 7u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.user, "x");
  auto ids = parse_request(R"({"model":"m","prompt":[1,2,3]})", false, kLimits);
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(ids.max_tokens.has_value());
}

TEST(OpenAiApi, ParsesChat) {
  auto r = parse_request(
      R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}],
          "logprobs":true,"top_logprobs":3,"max_completion_tokens":9,"stop":"x"})",
      true, kLimits);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "hi");
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(*r.max_tokens, 9);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
}

TEST(OpenAiApi, RejectsBadInput) {
  struct Case {
    const char* body;
    bool chat;
    int status;
    const char* param;
  };
  const Case cases[] = {
      {"{not json", false, 400, ""},
      {"[1,2]", false, 400, ""},
      {"", false, 400, ""},
      {"{\"model\":\"m\",\"prompt\":\"\xff\xfe\"}", false, 400, ""},  // invalid UTF-8
      {R"({"prompt":"x"})", false, 400, "model"},
      {R"({"model":3,"prompt":"x"})", false, 400, "model"},
      {R"({"model":"other","prompt":"x"})", false, 404, "model"},
      {R"({"model":"m"})", false, 400, "prompt"},
      {R"({"model":"m","prompt":7})", false, 400, "prompt"},
      {R"({"model":"m","prompt":["a","b"]})", false, 400, "prompt"},
      {R"({"model":"m","prompt":[1,99999]})", false, 400, "prompt"},
      {R"({"model":"m","prompt":"x","max_tokens":0})", false, 400, "max_tokens"},
      {R"({"model":"m","prompt":"x","max_tokens":-3})", false, 400, "max_tokens"},
      {R"({"model":"m","prompt":"x","max_tokens":"5"})", false, 400, "max_tokens"},
      {R"({"model":"m","prompt":"x","temperature":3})", false, 400, "temperature"},
      {R"({"model":"m","prompt":"x","temperature":"hot"})", false, 400, "temperature"},
      {R"({"model":"m","prompt":"x","top_p":0})", false, 400, "top_p"},
      {R"({"model":"m","prompt":"x","n":2})", false, 400, "n"},
      {R"({"model":"m","prompt":"x","stop":[1]})", false, 400, "stop"},
      {R"({"model":"m","prompt":"x","stop":["a","b","c","d","e"]})", false, 400, "stop"},
      {R"({"model":"m","prompt":"x","logprobs":9})", false, 400, "logprobs"},
      {R"({"model":"m","prompt":"x","stream":"yes"})", false, 400, "stream"},
      {R"({"model":"m","prompt":"x","presence_penalty":5})", false, 400, "presence_penalty"},
      {R"({"model":"m","prompt":"x","seed":1.5})", false, 400, "seed"},
      {R"({"model":"m","prompt":"x","user":5})", false, 400, "user"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"user":{"id":"a"}})", true, 400, "user"},
      {R"({"model":"m"})", true, 400, "messages"},
      {R"({"model":"m","messages":[]})", true, 400, "messages"},
      {R"({"model":"m","messages":"hi"})", true, 400, "messages"},
      {R"({"model":"m","messages":[{"content":"x"}]})", true, 400, "messages[0].role"},
      {R"({"model":"m","messages":[{"role":"wizard","content":"x"}]})", true, 400, "messages[0].role"},
      {R"({"model":"m","messages":[{"role":"user","content":5}]})", true, 400, "messages[0].content"},
      {R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})", true, 400,
       "messages[0].content"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2})", true, 400,
       "top_logprobs"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", true,
       400, "top_logprobs"},
  };
  for (const Case& c : cases) {
    ApiError e = error_of(c.body, c.chat);
    EXPECT_EQ(e.status, c.status) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    const json j = e.to_json();
    EXPECT_TRUE(j["error"]["message"].is_string()) << c.body;
    EXPECT_TRUE(j["error"]["type"].is_string()) << c.body;
    EXPECT_FALSE(dump(j).empty());
  }
}

// Numbers past the double range are refused with 400 naming the field (nlohmann's parser reports them as
// out_of_range, which once escaped as a 500 "number overflow"), wherever in the body they sit.
bool grammar_matches(const tandem::sampling::Grammar& g, std::string_view text) {
  tandem::sampling::GrammarStates states(g);
  const int32_t s = states.advance(states.initial(), text);
  return s != tandem::sampling::GrammarStates::kDead && states.accepting(s);
}

TEST(OpenAiApi, ResponseFormatCompilesTheSchemaInDeclaredOrder) {
  for (bool chat : {false, true}) {
    const std::string head = chat ? R"({"model":"m","messages":[{"role":"user","content":"hi"}],)"
                                  : R"({"model":"m","prompt":"hi",)";
    // "zeta" is declared before "alpha": the output follows the schema's order, not the keys' sorted order.
    const auto r = parse_request(head + R"("response_format":{"type":"json_schema","json_schema":{"name":"p",
        "strict":true,"schema":{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"boolean"}},
        "required":["zeta","alpha"]}}}})",
                                 chat, kLimits);
    ASSERT_NE(r.grammar, nullptr);
    EXPECT_TRUE(grammar_matches(*r.grammar, R"({"zeta":1,"alpha":true})"));
    EXPECT_FALSE(grammar_matches(*r.grammar, R"({"alpha":true,"zeta":1})"));
    EXPECT_FALSE(grammar_matches(*r.grammar, R"({"zeta":1})"));

    const auto object = parse_request(head + R"("response_format":{"type":"json_object"}})", chat, kLimits);
    ASSERT_NE(object.grammar, nullptr);
    EXPECT_TRUE(grammar_matches(*object.grammar, R"({"any":[1,"x"]})"));
    EXPECT_FALSE(grammar_matches(*object.grammar, "[1]"));
    EXPECT_EQ(parse_request(head + R"("response_format":{"type":"text"}})", chat, kLimits).grammar, nullptr);
  }
}

TEST(OpenAiApi, BadResponseFormatIs400NamingTheSchemaPath) {
  const std::string head = R"({"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":)";
  const std::string param = "response_format.json_schema.schema";
  ApiError e = error_of(head + R"({"type":"json_schema","json_schema":{"name":"p","schema":
      {"type":"object","properties":{"age":{"type":"intger"}}}}}})",
                        true);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, param);
  EXPECT_NE(std::string(e.what()).find("#/properties/age/type"), std::string::npos) << e.what();
  e = error_of(head + R"({"type":"json_schema","json_schema":{"schema":{"type":"string","pattern":"a+"}}}})",
               true);
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(std::string(e.what()).find("#/pattern"), std::string::npos) << e.what();
  // A short schema whose bounds (distinct, so that no rule is shared) would build a huge grammar.
  std::string wide = R"({"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{)";
  for (int i = 0; i < 40; ++i) {
    if (i > 0) wide += ',';
    wide += "\"p" + std::to_string(i);
    wide += R"(":{"type":"string","maxLength":)" + std::to_string(90000 + i) + "}";
  }
  e = error_of(head + wide + "}}}}}", true);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, param);
  EXPECT_NE(std::string(e.what()).find("lower the bounds"), std::string::npos) << e.what();
  struct Case {
    std::string body, param;
  };
  for (const Case& c :
       {Case{head + "\"json\"}", "response_format"}, Case{head + "{}}", "response_format.type"},
        Case{head + R"({"type":"xml"}})", "response_format.type"},
        Case{head + R"({"type":"json_schema"}})", "response_format.json_schema"},
        Case{head + R"({"type":"json_schema","json_schema":{"name":"p"}}})", param},
        Case{head + R"({"type":"json_schema","json_schema":{"schema":"x"}}})", param},
        Case{head + R"({"type":"json_schema","json_schema":{"strict":1,"schema":{}}}})",
             "response_format.json_schema.strict"}}) {
    e = error_of(c.body, true);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.what();
  }
}

TEST(OpenAiApi, NumberOverflowNamesTheField) {
  struct Case {
    const char* body;
    bool chat;
    const char* param;
  };
  const Case cases[] = {
      {R"({"model":"m","prompt":"x","temperature":1e400})", false, "temperature"},
      {R"({"model":"m","prompt":"x","top_p":-1e400})", false, "top_p"},
      {R"({"model":"m","prompt":"x","min_p":1e999})", false, "min_p"},
      {R"({"model":"m","prompt":"x","presence_penalty":1e400})", false, "presence_penalty"},
      {R"({"model":"m","prompt":"x","frequency_penalty":-1e400})", false, "frequency_penalty"},
      {R"({"model":"m","prompt":"x","logit_bias":{"5":1,"42":1e400}})", false, "logit_bias.42"},
      {R"({"model":"m","prompt":[1,2,1e400]})", false, "prompt[2]"},
      {R"({"model":"m","messages":[{"role":"user","content":"x"},{"role":"user","n":[[1e400]]}]})", true,
       "messages[1].n[0][0]"},
      {"1e400", false, ""},
  };
  for (const Case& c : cases) {
    ApiError e = error_of(c.body, c.chat);
    EXPECT_EQ(e.status, 400) << c.body << ": " << e.what();
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
}

// Depth and element bounds hold before any tree is built: a deep or huge body is a 400 that names the
// limit, and bodies just inside the bounds parse.
TEST(OpenAiApi, JsonShapeLimits) {
  ApiLimits limits = kLimits;
  limits.max_json_depth = 8;
  limits.max_json_elements = 100;
  auto nested = [](int depth) {
    return R"({"model":"m","prompt":"x","extra":)" + std::string(depth, '[') + std::string(depth, ']') + "}";
  };
  auto error = [&](const std::string& body) {
    try {
      parse_request(body, false, limits);
    } catch (const ApiError& e) {
      return e;
    }
    return ApiError(0, "", "parsed");
  };
  EXPECT_EQ(error(nested(7)).status, 0);  // the top object plus 7 arrays: 8 levels
  ApiError deep = error(nested(8));
  EXPECT_EQ(deep.status, 400);
  EXPECT_NE(std::string(deep.what()).find("--max-json-depth"), std::string::npos) << deep.what();
  // An unterminated run of '[' far past the limit fails at the limit, not at the end of the body.
  ApiError open_run = error(std::string(4u << 20, '['));
  EXPECT_EQ(open_run.status, 400);
  EXPECT_NE(std::string(open_run.what()).find("--max-json-depth"), std::string::npos) << open_run.what();

  auto ids = [](int n) {
    std::string s = R"({"model":"m","prompt":[)";
    for (int i = 0; i < n; ++i) s += (i ? ",1" : "1");
    return s + "]}";
  };
  // 97 ids + the prompt array + the model's name + the top object = 100 values (keys are not values).
  EXPECT_EQ(error(ids(97)).status, 0);
  EXPECT_EQ(parse_request(ids(97), false, limits).prompt_ids.size(), 97u);
  ApiError many = error(ids(98));
  EXPECT_EQ(many.status, 400);
  EXPECT_NE(std::string(many.what()).find("--max-json-elements"), std::string::npos) << many.what();
}

TEST(OpenAiApi, ResponseShapes) {
  CompletionRequest chat;
  chat.chat = true;
  chat.model = "m";
  chat.include_usage = true;
  Choice c;
  c.text = "hello";
  c.finish_reason = "stop";
  tandem::engine::Usage u{4, 2, 1};
  json full = response_json(chat, "id1", 5, c, u);
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["choices"][0]["message"]["content"], "hello");
  EXPECT_EQ(full["usage"]["total_tokens"], 6);
  EXPECT_EQ(full["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
  json first = chunk_json(chat, "id1", 5, "", {}, false, "", true);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["usage"].is_null());
  json last = usage_chunk_json(chat, "id1", 5, u);
  EXPECT_TRUE(last["choices"].empty());
  CompletionRequest comp;
  comp.model = "m";
  Choice lp;
  lp.want_logprobs = true;
  lp.text = "ab";
  lp.finish_reason = "length";
  lp.logprobs.push_back({"a", -0.5, {{"a", -0.5}, {"b", -1.0}}, 0});
  json cj = response_json(comp, "id2", 5, lp, u);
  EXPECT_EQ(cj["object"], "text_completion");
  EXPECT_EQ(cj["choices"][0]["logprobs"]["tokens"][0], "a");
  EXPECT_EQ(cj["choices"][0]["logprobs"]["top_logprobs"][0]["b"], -1.0);
  // Invalid UTF-8 in a token never breaks serialization.
  lp.logprobs[0].token = "\xe2\x82";
  EXPECT_NO_THROW(dump(response_json(comp, "id3", 5, lp, u)));
}

TEST(OpenAiApi, ReasoningContent) {
  CompletionRequest chat;
  chat.chat = true;
  chat.model = "m";
  Choice c;
  c.text = "Four.";
  c.reasoning = "Two and two.";
  c.finish_reason = "stop";
  const json full = response_json(chat, "id1", 5, c, tandem::engine::Usage{});
  EXPECT_EQ(full["choices"][0]["message"]["reasoning_content"], "Two and two.");
  EXPECT_EQ(full["choices"][0]["message"]["content"], "Four.");
  c.reasoning.clear();
  EXPECT_FALSE(response_json(chat, "id1", 5, c, tandem::engine::Usage{})["choices"][0]["message"].contains(
      "reasoning_content"));
  const json delta = chunk_json(chat, "id1", 5, "", {}, false, "", false, "Two")["choices"][0]["delta"];
  EXPECT_EQ(delta["reasoning_content"], "Two");
  EXPECT_FALSE(delta.contains("content"));

  const std::string head = R"({"model":"m","messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(parse_request(head + "}", true, kLimits).reasoning_format, ReasoningFormat::kDeepSeek);
  EXPECT_EQ(parse_request(head + R"(,"reasoning_format":"none"})", true, kLimits).reasoning_format,
            ReasoningFormat::kNone);
  ApiLimits inline_by_default = kLimits;
  inline_by_default.reasoning_format = ReasoningFormat::kNone;
  EXPECT_EQ(parse_request(head + "}", true, inline_by_default).reasoning_format, ReasoningFormat::kNone);
  for (const std::string bad : {R"("other")", "1"}) {
    const ApiError e = error_of(head + R"(,"reasoning_format":)" + bad + "}", true);
    EXPECT_EQ(e.status, 400) << bad;
    EXPECT_EQ(e.param, "reasoning_format") << bad;
  }
}

TEST(TextAssembler, CutsAtStopSequencesAndNeverSendsThem) {
  auto file = tandem::gguf::File::open(tandem::testing::shared_path("models/stories260K.gguf"));
  auto tok = tandem::tokenizer::Tokenizer::from_gguf(file);
  const auto ids = tok->encode("Once upon a time there was a cat.", false, false);
  const std::string all = tok->decode(ids);
  for (const std::string stop : {"time", "a cat", "was", "zzz"}) {
    TextAssembler a(*tok, tandem::tokenizer::TextPosition::kStart, {stop}, true);
    std::string sent;
    std::vector<Choice::Logprob> lps;
    for (int32_t id : ids) {
      sent += a.push({id, -1.0, {}}, lps);
      if (a.stopped()) break;
    }
    sent += a.finish();
    const size_t at = all.find(stop);
    EXPECT_EQ(sent, at == std::string::npos ? all : all.substr(0, at)) << stop;
    EXPECT_EQ(a.stopped(), at != std::string::npos) << stop;
    EXPECT_EQ(lps.size(), static_cast<size_t>(a.tokens()));
  }
}

}  // namespace

// Out-of-range serve flags are refused before the server starts, naming the flag (a timeout guards against a
// server that starts anyway).
TEST(ServeFlags, OutOfRangeValuesAreRefused) {
  const std::string serve = "timeout 20 " + std::string(TANDEM_BINARY) + " serve -m '" +
                            tandem::testing::shared_path("models/stories260K.gguf") + "' ";
  for (const std::string flag :
       {"--port 65536", "--max-body 0", "--drain-timeout -1", "-b 0", "--parallel 0", "--max-connections 0",
        "--max-connections 20", "--max-json-depth 1", "--max-json-elements 0", "--max-headers 0",
        "--max-header-bytes 10", "--idle-timeout 0", "--request-timeout -1", "--write-timeout 0",
        "--reasoning-format other"}) {
    const auto [out, rc] = tandem::testing::run_command(serve + flag + " 2>&1");
    EXPECT_NE(rc, 0) << flag;
    EXPECT_NE(rc, 124) << flag << ": the server started";
    EXPECT_NE(out.find(flag.substr(0, flag.find(' '))), std::string::npos) << flag << ": " << out;
  }
}
