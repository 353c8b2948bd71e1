// A chat reply's text -> what the API answers: reasoning (reasoning_content), content and tool calls.
//
// Reasoning models write their thoughts in a block before the answer: <think>...</think> (DeepSeek R1 and
// its distills, Qwen3, QwQ, ...). Templates of the R1 family open the block in the prompt (the generation
// prompt ends in "<think>\n"), so the reply starts inside it and only its end shows. With
// ReasoningFormat::kDeepSeek the block goes to reasoning_content, trimmed, and the content is what follows
// it (leading white space dropped); a block never closed is all reasoning. kNone leaves the text as it is.
// Output under a grammar (response_format, required or named tools) is never read for reasoning: the
// grammar decides the whole text.
//
// Tool calls are parsed from the text after the reasoning (tool_calls.h). A reply streamed through
// ReplyStream and the same text given to parse_chat_reply whole produce the same reasoning, content and
// calls: the deltas concatenate to the whole result. Streamed, each call goes out once it is complete (a
// later call cannot change it), so with parallel calls the first is sent while the next is written.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/server/chat_template.h"
#include "tandem/server/tool_calls.h"

namespace tandem::server {

enum class ReasoningFormat { kNone, kDeepSeek };

// "none" / "deepseek"; nullopt for other names.
std::optional<ReasoningFormat> reasoning_format_from(std::string_view name);

// Whether a prompt leaves its reply inside a reasoning block: it ends in "<think>" and white space.
bool prompt_opens_reasoning(std::string_view prompt);

struct ReplyOptions {
  bool tools = false;  // parse tool calls
  ToolFormat format = ToolFormat::kHermes;
  bool reasoning = false;       // move a <think> block to reasoning
  bool reasoning_open = false;  // the prompt opened the block (see prompt_opens_reasoning)
};

struct ChatReply {
  std::string reasoning;
  std::string content;
  std::vector<ChatToolCall> calls;
};

// The whole reply at once; `new_id` names each call.
ChatReply parse_chat_reply(std::string_view text, const ReplyOptions& options,
                           const std::function<std::string()>& new_id);

// A reply as it is generated: push() returns what may go out now (text that may still turn out to be a
// call, or the end of a reasoning block, is held back, and calls once complete), finish() the rest. new_id
// names each call.
class ReplyStream {
 public:
  ReplyStream(ReplyOptions options, std::function<std::string()> new_id)
      : options_(options), new_id_(std::move(new_id)) {}

  struct Delta {
    std::string reasoning, content;
    std::vector<ChatToolCall> calls;  // calls completed by this push, after those sent before
  };
  Delta push(std::string_view text);
  // The held-back rest of reasoning and content, and the calls not sent yet; call once, after the last
  // push().
  ChatReply finish();
  // How many calls went out so far (push() and finish() together): the index of the next.
  size_t calls_sent() const { return calls_sent_; }

 private:
  // The calls of `rest` past those sent, named; advances calls_sent_.
  std::vector<ChatToolCall> new_calls(std::string_view rest);

  ReplyOptions options_;
  std::function<std::string()> new_id_;
  std::string text_;
  size_t reasoning_sent_ = 0, content_sent_ = 0, calls_sent_ = 0;
};

}  // namespace tandem::server
