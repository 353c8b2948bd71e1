// Tool calls: the grammar that enforces tool_choice required / named, parsing replies into calls, the
// content that may be streamed before a call, and tools written into messages for templates without them.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/sampling/grammar.h"
#include "tandem/server/openai_api.h"
#include "tandem/server/tool_calls.h"
#include "test_util.h"

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
  EXPECT_EQ(settled_content("Hello"), "Hello");
  EXPECT_EQ(settled_content("Hello <tool"), "Hello");
  EXPECT_EQ(settled_content("Hello <"), "Hello");
  EXPECT_EQ(settled_content("Hello <b>"), "Hello <b>");
  EXPECT_EQ(settled_content("Hi\n" + kCall + " tail"), "Hi");
  EXPECT_EQ(settled_content(kCall), "");
  // Whatever follows, the streamed prefix is a prefix of the parsed content.
  const std::string reply = "Checking.  \n" + kCall;
  for (size_t cut = 0; cut <= reply.size(); ++cut) {
    const std::string settled = settled_content(reply.substr(0, cut));
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

// One reply per format as the model writes it, with the content and calls it means.
struct FormatCase {
  ToolFormat format;
  std::string reply;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments (as JSON)
};

std::vector<FormatCase> format_cases() {
  const std::string paris = R"({"city": "Paris"})";
  return {
      {ToolFormat::kHermes,
       "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}\n</tool_call>",
       "Let me check.",
       {{"get_weather", paris}}},
      {ToolFormat::kLlama3,
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
       "",
       {{"get_weather", paris}}},
      {ToolFormat::kLlama3,
       "Sure.<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": "
       "\"now\", \"parameters\": {}}",
       "Sure.",
       {{"get_weather", paris}, {"now", "{}"}}},
      {ToolFormat::kLlama3, "The {braces} stay text.", "The {braces} stay text.", {}},
      {ToolFormat::kMistral,
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "
       "\"abcdefghi\"}, "
       "{\"name\": \"now\", \"arguments\": {}}]",
       "",
       {{"get_weather", paris}, {"now", "{}"}}},
      // [TOOL_CALLS] is a control token, which decodes to no text.
      {ToolFormat::kMistral,
       " [{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}]",
       "",
       {{"get_weather", paris}}},
      {ToolFormat::kMistral, "[1, 2] is a list.", "[1, 2] is a list.", {}},
      {ToolFormat::kFunctionaryV3,
       "all\nI will look.>>>get_weather\n{\"city\": \"Paris\"}>>>now\n{}",
       "I will look.",
       {{"get_weather", paris}, {"now", "{}"}}},
      {ToolFormat::kFunctionaryV3, "all\nJust text.", "Just text.", {}},
      {ToolFormat::kFunctionaryV31,
       "Checking <function=get_weather>{\"city\": \"Paris\"}</function>",
       "Checking",
       {{"get_weather", paris}}},
      {ToolFormat::kDeepSeekR1,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
       "\"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```"
       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "",
       {{"get_weather", paris}, {"now", "{}"}}},
      {ToolFormat::kCommandR,
       "I will look it up.\nAction: ```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n        "
       "\"parameters\": {\"city\": \"Paris\"}\n    }\n]\n```",
       "I will look it up.",
       {{"get_weather", paris}}},
      {ToolFormat::kCommandR,
       "Action: ```json\n[{\"tool_name\": \"directly-answer\", \"parameters\": {}}]```",
       "",
       {}},
  };
}

std::string describe(const FormatCase& c) {
  return std::string(tool_format_name(c.format)) + ": " + c.reply;
}

TEST(ToolFormats, ParsesEachFormat) {
  for (const FormatCase& c : format_cases()) {
    int n = 0;
    const ToolReply r = parse_tool_calls(
        c.reply, [&] { return "id" + std::to_string(n++); }, c.format);
    EXPECT_EQ(r.content, c.content) << describe(c);
    ASSERT_EQ(r.calls.size(), c.calls.size()) << describe(c);
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].id, "id" + std::to_string(i));
      EXPECT_EQ(r.calls[i].name, c.calls[i].first) << describe(c);
      EXPECT_EQ(ordered_json::parse(r.calls[i].arguments), ordered_json::parse(c.calls[i].second))
          << describe(c);
    }
  }
}

TEST(ToolFormats, StreamedContentIsAPrefixOfTheWhole) {
  for (const FormatCase& c : format_cases()) {
    const std::string whole = parse_tool_calls(
                                  c.reply, [] { return std::string(); }, c.format)
                                  .content;
    for (size_t cut = 0; cut <= c.reply.size(); ++cut) {
      const std::string settled = settled_content(std::string_view(c.reply).substr(0, cut), c.format);
      EXPECT_TRUE(whole.starts_with(settled)) << describe(c) << " cut " << cut << ": '" << settled << "'";
    }
    // Content before a call goes out before the call is complete.
    if (!c.content.empty() && !c.calls.empty()) {
      EXPECT_EQ(settled_content(std::string_view(c.reply).substr(0, c.reply.size() - 1), c.format), c.content)
          << describe(c);
    }
  }
}

TEST(ToolFormats, GrammarWritesWhatTheParserReads) {
  const auto tools = weather_tools();
  for (ToolFormat f :
       {ToolFormat::kHermes, ToolFormat::kLlama3, ToolFormat::kMistral, ToolFormat::kFunctionaryV3,
        ToolFormat::kFunctionaryV31, ToolFormat::kDeepSeekR1, ToolFormat::kCommandR}) {
    const std::string name(tool_format_name(f));
    const auto g = tool_call_grammar(tools, "", true, f);
    std::string text = tool_call_text(f, "get_weather", R"({"city":"Paris"})");
    // Functionary's prompt writes the first ">>>".
    if (f == ToolFormat::kFunctionaryV3) text = text.substr(3);
    EXPECT_TRUE(matches(g, text)) << name << ": " << text;
    EXPECT_FALSE(matches(g, "Sure. " + text)) << name;
    EXPECT_FALSE(matches(g, tool_call_text(f, "get_weather", R"({"days":2})"))) << name;
    const ToolReply r = parse_tool_calls(
        text, [] { return std::string("x"); }, f);
    ASSERT_EQ(r.calls.size(), 1u) << name << ": " << text;
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(r.content, "") << name;
    const auto named = tool_call_grammar(tools, "now", false, f);
    EXPECT_FALSE(matches(named, text)) << name;
  }
  // Parallel calls in the formats that write them in one block.
  const auto mistral = tool_call_grammar(tools, "", true, ToolFormat::kMistral);
  EXPECT_TRUE(matches(
      mistral,
      R"([{"name": "get_weather", "arguments": {"city":"Paris"}}, {"name": "now", "arguments": {}}])"));
  const auto r1 = tool_call_grammar(tools, "", true, ToolFormat::kDeepSeekR1);
  const std::string r1_two =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<"
      "｜tool▁call▁end｜>\n"
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜><"
      "｜tool▁calls▁end｜>";
  EXPECT_TRUE(matches(r1, r1_two));
  EXPECT_EQ(parse_tool_calls(
                r1_two, [] { return std::string("x"); }, ToolFormat::kDeepSeekR1)
                .calls.size(),
            2u);
}

std::string read_template(const std::string& name) {
  std::ifstream in(tandem::testing::shared_path("chat/templates/" + name));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ToolFormats, DetectedFromTheTemplate) {
  const std::pair<const char*, ToolFormat> cases[] = {
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolFormat::kHermes},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::kHermes},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::kLlama3},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", ToolFormat::kLlama3},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolFormat::kMistral},
      {"meetkai-functionary-medium-v3.2.jinja", ToolFormat::kFunctionaryV3},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ToolFormat::kDeepSeekR1},
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", ToolFormat::kDeepSeekR1},
      {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", ToolFormat::kCommandR},
  };
  for (const auto& [file, format] : cases) EXPECT_EQ(detect_tool_format(read_template(file)), format) << file;
  EXPECT_EQ(detect_tool_format("{{ '<function=' + name + '>' }}"), ToolFormat::kFunctionaryV31);
  EXPECT_EQ(detect_tool_format(""), ToolFormat::kHermes);
  // Without markers in the template, the vocabulary's marker tokens decide.
  const auto vocabulary = [](std::vector<std::string> tokens) {
    return
        [tokens](std::string_view t) { return std::find(tokens.begin(), tokens.end(), t) != tokens.end(); };
  };
  EXPECT_EQ(detect_tool_format("", vocabulary({"[INST]", "[TOOL_CALLS]"})), ToolFormat::kMistral);
  EXPECT_EQ(detect_tool_format("{{ x }}", vocabulary({"<|python_tag|>"})), ToolFormat::kLlama3);
  EXPECT_EQ(detect_tool_format("", vocabulary({"<|python_tag|>", "<tool_call>"})), ToolFormat::kHermes);
  EXPECT_EQ(detect_tool_format("", vocabulary({"<｜tool▁calls▁begin｜>"})), ToolFormat::kDeepSeekR1);
  EXPECT_EQ(detect_tool_format(read_template("mistralai-Mistral-Nemo-Instruct-2407.jinja"),
                               vocabulary({"<|python_tag|>"})),
            ToolFormat::kMistral);
  const auto random = [](size_t n) { return std::string(n, 'a'); };
  EXPECT_EQ(new_tool_call_id(ToolFormat::kMistral, random), "aaaaaaaaa");
  EXPECT_EQ(new_tool_call_id(ToolFormat::kHermes, random).size(), 29u);
}

// An assistant's calls (arguments as the JSON strings OpenAI sends) and the tool's answer, rendered back
// through each template: as objects where the template serialises them, as text where it concatenates.
TEST(ToolFormats, CallsRenderedBackThroughTheTemplates) {
  const std::string tools_json =
      R"([{"type":"function","function":{"name":"get_weather","description":"Weather.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";
  const std::vector<ChatMessage> messages = {
      {"user", "Weather in Paris?", {}, {}, {}},
      {"assistant", "", {{"abcdefghi", "get_weather", R"({"city": "Paris"})"}}, {}, {}},
      {"tool", "sunny", {}, "abcdefghi", "get_weather"},
  };
  struct Case {
    const char* file;
    std::string expect;  // the call as the template writes it
  };
  const Case cases[] = {
      {"Qwen-Qwen2.5-7B-Instruct.jinja",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja",
       R"({"name": "get_weather", "parameters": {"city": "Paris"}})"},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja",
       R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}])"},
      {"meetkai-functionary-medium-v3.2.jinja", ">>>get_weather\n{\"city\": \"Paris\"}"},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
       "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"},
  };
  for (const Case& c : cases) {
    const ChatTemplate t = ChatTemplate::interpret(read_template(c.file), "<s>", "</s>");
    const std::string prompt = t.render(messages, t.renders_tools() ? tools_json : std::string());
    EXPECT_NE(prompt.find(c.expect), std::string::npos) << c.file << ":\n" << prompt;
    EXPECT_NE(prompt.find("sunny"), std::string::npos) << c.file;
  }
}

TEST(ToolFormats, MessagesWrittenInTheFormat) {
  const std::vector<ChatMessage> messages = {
      {"user", "Weather?", {}, {}, {}},
      {"assistant", "", {{"c1", "get_weather", R"({"city":"Paris"})"}}, {}, {}},
  };
  const auto out = tool_messages(messages, weather_tools(), ToolFormat::kMistral);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_NE(out[0].content.find(R"([{"name": "<function-name>", "arguments": <args-json-object>}])"),
            std::string::npos)
      << out[0].content;
  EXPECT_EQ(out[2].content, R"([{"name": "get_weather", "arguments": {"city":"Paris"}}])");
}

}  // namespace
