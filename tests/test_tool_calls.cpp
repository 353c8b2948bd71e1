// Tool calls: the grammar that enforces tool_choice required / named, parsing replies into calls, the
// content that may be streamed before a call, and tools written into messages for templates without them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tandem/sampling/grammar.h"
#include "tandem/server/openai_api.h"
#include "tandem/server/tool_calls.h"

namespace {

using namespace tandem::server;
using nlohmann::ordered_json;

bool matches(const tandem::sampling::Grammar& g, std::string_view text) {
  tandem::sampling::GrammarStates states(g);
  const int32_t s = states.advance(states.initial(), text);
  return s != tandem::sampling::GrammarStates::kDead && states.accepting(s);
}

std::vector<ToolSpec> weather_tools() {
  return {{"get_weather", "Weather in a city",
           ordered_json::parse(
               R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},
                                   "required":["city"]})")},
          {"now", "", nullptr}};
}

const std::string kCall =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>";
const std::string kNow = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";

TEST(ToolCalls, GrammarEnforcesTheCallForm) {
  const auto tools = weather_tools();
  const auto any = tool_call_grammar(tools, "", false);
  EXPECT_TRUE(matches(any, kCall));
  EXPECT_TRUE(matches(any, kNow));
  EXPECT_FALSE(matches(any, kCall + "\n" + kNow));  // one call only
  EXPECT_FALSE(
      matches(any, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\":2}}\n</tool_call>"));
  EXPECT_FALSE(matches(any, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(any, "Sure! " + kCall));

  const auto parallel = tool_call_grammar(tools, "", true);
  EXPECT_TRUE(matches(parallel, kCall + "\n" + kNow));
  std::string many = kNow;
  for (int i = 1; i < kMaxParallelCalls; ++i) many += "\n" + kNow;
  EXPECT_TRUE(matches(parallel, many));
  EXPECT_FALSE(matches(parallel, many + "\n" + kNow));

  const auto named = tool_call_grammar(tools, "now", true);
  EXPECT_TRUE(matches(named, kNow));
  EXPECT_FALSE(matches(named, kCall));
}

TEST(ToolCalls, GrammarErrorsNameTheField) {
  auto tools = weather_tools();
  try {
    tool_call_grammar(tools, "missing", false);
    FAIL() << "an unknown named function was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "tool_choice");
  }
  tools[1].parameters = ordered_json::parse(R"({"type":"object","properties":{"x":{"type":"strnig"}}})");
  try {
    tool_call_grammar(tools, "", false);
    FAIL() << "a bad schema was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "tools[1].function.parameters");
    EXPECT_NE(std::string(e.what()).find("#/properties/x/type"), std::string::npos) << e.what();
  }
}

TEST(ToolCalls, ParsesCallsAndKeepsTheRestAsContent) {
  int n = 0;
  const auto id = [&] { return "call_" + std::to_string(n++); };
  ToolReply r = parse_tool_calls("Let me look.\n" + kCall + "\n" + kNow + "\n", id);
  EXPECT_EQ(r.content, "Let me look.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].id, "call_0");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(ordered_json::parse(r.calls[0].arguments), ordered_json::parse(R"({"city":"Paris"})"));
  EXPECT_EQ(r.calls[1].name, "now");
  EXPECT_EQ(r.calls[1].arguments, "{}");

  // Not a call: a body that is not an object with a name, or a block left open.
  const std::string bad = "<tool_call>\n[1, 2]\n</tool_call>";
  r = parse_tool_calls(bad + " and <tool_call>{\"name\":", id);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, bad + " and <tool_call>{\"name\":");
  r = parse_tool_calls("no calls here  ", id);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "no calls here");
}

TEST(ToolCalls, SettledContentHoldsBackWhatMayBeACall) {
  EXPECT_EQ(settled_content("Hello"), 5u);
  EXPECT_EQ(settled_content("Hello <tool"), 5u);
  EXPECT_EQ(settled_content("Hello <"), 5u);
  EXPECT_EQ(settled_content("Hello <b>"), 9u);
  EXPECT_EQ(settled_content("Hi\n" + kCall + " tail"), 2u);
  EXPECT_EQ(settled_content(kCall), 0u);
  // Whatever follows, the streamed prefix is a prefix of the parsed content.
  const std::string reply = "Checking.  \n" + kCall;
  for (size_t cut = 0; cut <= reply.size(); ++cut) {
    const std::string part = reply.substr(0, cut);
    const std::string settled = part.substr(0, settled_content(part));
    EXPECT_TRUE(parse_tool_calls(reply, [] { return std::string("x"); }).content.starts_with(settled)) << cut;
  }
}

TEST(ToolCalls, MessagesForTemplatesWithoutTools) {
  std::vector<ChatMessage> messages = {
      {"user", "Weather in Paris?", {}, {}, {}},
      {"assistant", "", {{"call_1", "get_weather", R"({"city":"Paris"})"}}, {}, {}},
      {"tool", "sunny", {}, "call_1", "get_weather"},
  };
  const auto out = tool_messages(messages, weather_tools());
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].role, "system");
  EXPECT_NE(out[0].content.find("\"name\":\"get_weather\""), std::string::npos) << out[0].content;
  EXPECT_NE(out[0].content.find("<tool_call>"), std::string::npos);
  EXPECT_EQ(out[1].content, "Weather in Paris?");
  EXPECT_EQ(out[2].content,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>");
  EXPECT_EQ(out[3].role, "user");
  EXPECT_EQ(out[3].content, "<tool_response>\nsunny\n</tool_response>");
  // A system message of the request keeps its text, with the tools after it.
  messages.insert(messages.begin(), ChatMessage{"system", "Be brief.", {}, {}, {}});
  const auto with_system = tool_messages(messages, weather_tools());
  ASSERT_EQ(with_system.size(), 4u);
  EXPECT_TRUE(with_system[0].content.starts_with("Be brief.\n\n# Tools")) << with_system[0].content;
}

TEST(ToolCalls, RequestParsing) {
  const ApiLimits limits{"m", 512};
  const std::string head = R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[
      {"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"b":{"type":"integer"},
      "a":{"type":"integer"}},"required":["b","a"]}}}])";
  auto r = parse_request(head + "}", true, limits);
  EXPECT_EQ(r.tool_choice, ToolChoice::kAuto);
  EXPECT_EQ(r.grammar, nullptr);
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].parameters["properties"].begin().key(), "b");  // declared order kept
  r = parse_request(head + R"(,"tool_choice":"required","parallel_tool_calls":false})", true, limits);
  ASSERT_NE(r.grammar, nullptr);
  EXPECT_TRUE(
      matches(*r.grammar, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"b\":1,\"a\":2}}\n</tool_call>"));
  EXPECT_FALSE(
      matches(*r.grammar, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":2,\"b\":1}}\n</tool_call>"));
  r = parse_request(head + R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})", true, limits);
  EXPECT_EQ(r.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(r.tool_name, "f");
  r = parse_request(
      R"({"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
          "function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"2"}]})",
      true, limits);
  ASSERT_EQ(r.messages[0].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[0].tool_calls[0].arguments, R"({"a":1})");
  EXPECT_EQ(r.messages[1].tool_call_id, "c1");

  struct Case {
    std::string body, param;
  };
  for (
      const Case& c :
      {Case{head + R"(,"tool_choice":"maybe"})", "tool_choice"},
       Case{head + R"(,"tool_choice":{"type":"function","function":{"name":"g"}}})", "tool_choice"},
       Case{R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":"required"})",
            "tool_choice"},
       Case{R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]})",
            "tools[0].function"},
       Case{R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"function":{"name":"f",
             "parameters":{"type":"object","properties":{"x":{"type":"nope"}}}}}],"tool_choice":"required"})",
            "tools[0].function.parameters"},
       Case{head + R"(,"tool_choice":"required","response_format":{"type":"json_object"}})",
            "response_format"},
       Case{
           R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]})",
           "messages[0].tool_calls[0].function.name"}}) {
    try {
      parse_request(c.body, true, limits);
      ADD_FAILURE() << "accepted: " << c.body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << c.body;
      EXPECT_EQ(e.param, c.param) << c.body << ": " << e.what();
    }
  }
}

}  // namespace
