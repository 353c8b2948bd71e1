// Chat replies split into reasoning, content and tool calls, whole and streamed.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tandem/server/chat_reply.h"

namespace {

using namespace tandem::server;

std::string no_id() {
  return "id";
}

ReplyOptions reasoning(bool open = false) {
  ReplyOptions o;
  o.reasoning = true;
  o.reasoning_open = open;
  return o;
}

// The reply streamed in pieces of `step` bytes: the deltas and finish() concatenated.
ChatReply streamed(std::string_view text, const ReplyOptions& o, size_t step) {
  ReplyStream s(o, no_id);
  ChatReply out;
  for (size_t at = 0; at < text.size(); at += step) {
    ReplyStream::Delta d = s.push(text.substr(at, step));
    out.reasoning += d.reasoning;
    out.content += d.content;
    for (ChatToolCall& c : d.calls) out.calls.push_back(std::move(c));
  }
  ChatReply end = s.finish();
  out.reasoning += end.reasoning;
  out.content += end.content;
  for (ChatToolCall& c : end.calls) out.calls.push_back(std::move(c));
  EXPECT_EQ(s.calls_sent(), out.calls.size());
  return out;
}

struct Case {
  std::string text;
  ReplyOptions options;
  std::string reasoning, content;
  size_t calls = 0;
};

std::vector<Case> cases() {
  ReplyOptions tools = reasoning();
  tools.tools = true;
  ReplyOptions r1_tools = reasoning(true);
  r1_tools.tools = true;
  r1_tools.format = ToolFormat::kDeepSeekR1;
  return {
      {"<think>\nThe user greets.\n</think>\n\nHello!", reasoning(), "The user greets.", "Hello!"},
      // The prompt opened the block (R1's generation prompt ends in "<think>\n").
      {"Two and two.\n</think>\n\nFour.", reasoning(true), "Two and two.", "Four."},
      // Never closed: all of it is reasoning.
      {"Still thinking about </thi", reasoning(true), "Still thinking about </thi", ""},
      {"No block here. <think>x</think>", reasoning(), "", "No block here. <think>x</think>"},
      {"<think>kept</think> inline", ReplyOptions{}, "", "<think>kept</think> inline"},
      {"<thin", reasoning(), "", "<thin"},
      {"<think>Weather first.</think>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
       tools, "Weather first.", "", 1},
      {"Look it "
       "up.</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       r1_tools, "Look it up.", "", 1},
  };
}

TEST(ChatReply, SplitsReasoningFromContent) {
  for (const Case& c : cases()) {
    const ChatReply r = parse_chat_reply(c.text, c.options, no_id);
    EXPECT_EQ(r.reasoning, c.reasoning) << c.text;
    EXPECT_EQ(r.content, c.content) << c.text;
    EXPECT_EQ(r.calls.size(), c.calls) << c.text;
  }
}

TEST(ChatReply, StreamedEqualsWhole) {
  for (const Case& c : cases()) {
    for (size_t step : {size_t{1}, size_t{2}, size_t{5}, c.text.size()}) {
      const ChatReply r = streamed(c.text, c.options, step);
      EXPECT_EQ(r.reasoning, c.reasoning) << c.text << " in steps of " << step;
      EXPECT_EQ(r.content, c.content) << c.text << " in steps of " << step;
      EXPECT_EQ(r.calls.size(), c.calls) << c.text << " in steps of " << step;
    }
  }
}

TEST(ChatReply, ReasoningStreamsBeforeTheBlockEnds) {
  ReplyStream s(reasoning(), no_id);
  EXPECT_EQ(s.push("<think>").reasoning, "");
  EXPECT_EQ(s.push("Let me see").reasoning, "Let me see");
  EXPECT_EQ(s.push(" more </thi").reasoning, " more");  // a possible end marker waits
  const ReplyStream::Delta d = s.push("nk>Done.");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Done.");
}

// Each call goes out as soon as it is complete, with its index order kept; the whole agrees.
TEST(ChatReply, CallsGoOutWhenComplete) {
  ReplyOptions o;
  o.tools = true;
  int n = 0;
  ReplyStream s(o, [&] { return "call" + std::to_string(n++); });
  const std::string first = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
  EXPECT_TRUE(s.push(first.substr(0, 20)).calls.empty());
  ReplyStream::Delta d = s.push(first.substr(20));
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].id, "call0");
  EXPECT_EQ(d.calls[0].arguments, R"({"a":1})");
  EXPECT_TRUE(s.push("\n<tool_call>\n{\"name\": \"g\", ").calls.empty());
  d = s.push("\"arguments\": {}}\n</tool_call>");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "g");
  EXPECT_EQ(s.calls_sent(), 2u);
  const ChatReply end = s.finish();
  EXPECT_TRUE(end.calls.empty());
  EXPECT_EQ(end.content, "");

  // DeepSeek R1: a block whose second call breaks keeps the first, whole and streamed.
  o.format = ToolFormat::kDeepSeekR1;
  const std::string r1 =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<"
      "｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n[oops";
  const ChatReply whole = parse_chat_reply(r1, o, no_id);
  ASSERT_EQ(whole.calls.size(), 1u);
  EXPECT_EQ(whole.calls[0].name, "f");
  for (size_t step : {size_t{1}, size_t{7}}) {
    const ChatReply parts = streamed(r1, o, step);
    EXPECT_EQ(parts.content, whole.content) << step;
    EXPECT_EQ(parts.calls.size(), 1u) << step;
  }
}

// Mangled replies (markers cut, doubled, spliced into one another) never throw, and streamed in any pieces
// they give what the whole gives: the same reasoning, content and call names and arguments.
TEST(ChatReply, MangledRepliesStreamAsTheyParse) {
  const std::vector<std::string> pieces = {"<think>",
                                           "</think>",
                                           "<tool_call>",
                                           "</tool_call>",
                                           "{\"name\": \"f\", \"arguments\": {\"a\": [1, \"}\"]}}",
                                           "{\"name\": \"g\", \"parameters\": {}}",
                                           "<|python_tag|>",
                                           "[TOOL_CALLS]",
                                           "[{\"name\": \"h\"}]",
                                           ">>>",
                                           "all\n",
                                           "f\n",
                                           "<function=f>",
                                           "</function>",
                                           "<｜tool▁calls▁begin｜>",
                                           "<｜tool▁call▁begin｜>",
                                           "function<｜tool▁sep｜>f\n```json\n",
                                           "```<｜tool▁call▁end｜>",
                                           "<｜tool▁calls▁end｜>",
                                           "Action: ```json\n",
                                           "[{\"tool_name\": \"t\", \"parameters\": {}}]",
                                           "```",
                                           " text ",
                                           "\n",
                                           "{",
                                           "}",
                                           "[",
                                           "]",
                                           "\"",
                                           "\\"};
  std::vector<std::string> calls;  // whole calls in every format, so that mangling meets real ones
  for (ToolFormat f :
       {ToolFormat::kHermes, ToolFormat::kLlama3, ToolFormat::kMistral, ToolFormat::kFunctionaryV3,
        ToolFormat::kFunctionaryV31, ToolFormat::kDeepSeekR1, ToolFormat::kCommandR})
    calls.push_back(tool_call_text(f, "f", R"({"a": "}>>>"})"));
  std::mt19937 rng(7);
  size_t with_calls = 0;
  for (ToolFormat f :
       {ToolFormat::kHermes, ToolFormat::kLlama3, ToolFormat::kMistral, ToolFormat::kFunctionaryV3,
        ToolFormat::kFunctionaryV31, ToolFormat::kDeepSeekR1, ToolFormat::kCommandR}) {
    for (int round = 0; round < 300; ++round) {
      std::string text;
      const int n = 1 + static_cast<int>(rng() % 8);
      for (int k = 0; k < n; ++k)
        text += rng() % 3 == 0 ? calls[rng() % calls.size()] : pieces[rng() % pieces.size()];
      ReplyOptions o;
      o.tools = true;
      o.format = f;
      o.reasoning = rng() % 2 == 0;
      o.reasoning_open = o.reasoning && rng() % 3 == 0;
      const ChatReply whole = parse_chat_reply(text, o, no_id);
      const ChatReply parts = streamed(text, o, 1 + rng() % 6);
      const std::string what = std::string(tool_format_name(f)) + ": " + text;
      EXPECT_EQ(parts.reasoning, whole.reasoning) << what;
      EXPECT_EQ(parts.content, whole.content) << what;
      ASSERT_EQ(parts.calls.size(), whole.calls.size()) << what;
      with_calls += whole.calls.empty() ? 0 : 1;
      for (size_t i = 0; i < whole.calls.size(); ++i) {
        EXPECT_EQ(parts.calls[i].name, whole.calls[i].name) << what;
        EXPECT_EQ(parts.calls[i].arguments, whole.calls[i].arguments) << what;
      }
    }
  }
  EXPECT_GT(with_calls, 100u);  // the replies did hold calls
}

TEST(ChatReply, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<｜Assistant｜><think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<think>\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_EQ(reasoning_format_from("none"), ReasoningFormat::kNone);
  EXPECT_EQ(reasoning_format_from("deepseek"), ReasoningFormat::kDeepSeek);
  EXPECT_EQ(reasoning_format_from("other"), std::nullopt);
}

}  // namespace
