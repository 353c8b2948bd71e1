// Chat replies split into reasoning, content and tool calls, whole and streamed.
#include <gtest/gtest.h>

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
  ReplyStream s(o);
  ChatReply out;
  for (size_t at = 0; at < text.size(); at += step) {
    const ReplyStream::Delta d = s.push(text.substr(at, step));
    out.reasoning += d.reasoning;
    out.content += d.content;
  }
  ChatReply end = s.finish(no_id);
  out.reasoning += end.reasoning;
  out.content += end.content;
  out.calls = std::move(end.calls);
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
  ReplyStream s(reasoning());
  EXPECT_EQ(s.push("<think>").reasoning, "");
  EXPECT_EQ(s.push("Let me see").reasoning, "Let me see");
  EXPECT_EQ(s.push(" more </thi").reasoning, " more");  // a possible end marker waits
  const ReplyStream::Delta d = s.push("nk>Done.");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Done.");
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
