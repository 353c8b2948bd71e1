// Tool calls in the chat API, written by the model in the Hermes / Qwen form, one block per call:
//   <tool_call>
//   {"name": "get_weather", "arguments": {"city": "Paris"}}
//   </tool_call>
// Parallel calls are blocks one after another, separated by a newline.
//
// tool_choice "required" or a named function is enforced by a grammar over that form (the arguments by
// the function's JSON schema); "auto" leaves the model free and the reply is parsed afterwards; "none"
// parses nothing. The reply's blocks become OpenAI tool_calls (with ids, arguments as JSON text); the text
// around them stays content.
//
// For templates that do not render tools themselves (ChatTemplate::renders_tools), the tools, assistant
// tool calls and tool results are written into the messages' text in the same form (tool_messages).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/sampling/grammar.h"
#include "tandem/server/chat_template.h"

namespace tandem::server {

struct ToolSpec {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters;  // a JSON schema of the arguments object; null: any object
};

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

// At most this many calls in one reply when parallel calls are allowed under a grammar.
inline constexpr int kMaxParallelCalls = 8;

// A grammar matching one call (parallel: 1 to kMaxParallelCalls calls) of `tools`, or of the one named
// `only` when it is not empty. Throws ApiError 400 naming tools[i].function.parameters when a schema cannot
// be enforced, or tool_choice when `only` names no tool.
sampling::Grammar tool_call_grammar(const std::vector<ToolSpec>& tools, const std::string& only,
                                    bool parallel);

struct ToolReply {
  std::string content;  // the text outside call blocks, trimmed
  std::vector<ChatToolCall> calls;
};

// Splits a reply into content and calls; `new_id` names each call. A block whose body is not a JSON object
// with a string "name" (and an object "arguments", absent meaning {}) stays content.
ToolReply parse_tool_calls(std::string_view text, const std::function<std::string()>& new_id);

// How many leading bytes of a partial reply are content whatever follows: everything before the first call
// block, or before a trailing prefix of its opening tag. For streaming content while calls may come.
size_t settled_content(std::string_view text);

// The messages with the tools described in the system message and tool calls and results written as text,
// for templates that do not render tools themselves.
std::vector<ChatMessage> tool_messages(const std::vector<ChatMessage>& messages,
                                       const std::vector<ToolSpec>& tools);

}  // namespace tandem::server
