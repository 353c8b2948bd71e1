// Tool calls in the chat API, in the syntax the model was trained to write them (ToolFormat):
//   hermes        <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>     (Hermes, Qwen 2.5, ...)
//   llama3        {"name": "f", "parameters": {...}}, or after <|python_tag|>      (Llama 3.1 / 3.2)
//   mistral       [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]             (Mistral Nemo, ...)
//   functionary3  >>>f\n{...}>>>g\n{...}   (the prompt ends in ">>>"; ">>>all\n" opens plain text)
//   functionary31 <function=f>{...}</function>
//   deepseek-r1   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```
//                 <｜tool▁call▁end｜> ... <｜tool▁calls▁end｜>
//   command-r     Action: ```json\n[{"tool_name": "f", "parameters": {...}}, ...]```
// The format is chosen from the chat template's source (detect_tool_format). Markers that are control
// tokens (<|python_tag|>, [TOOL_CALLS]) decode to no text, so those formats are also recognised without
// them when the reply starts with the call's JSON, and their grammars do not write them.
//
// tool_choice "required" or a named function is enforced by a grammar over the format's syntax (the
// arguments by the function's JSON schema); "auto" leaves the model free and the reply is parsed afterwards;
// "none" parses nothing. The reply's calls become OpenAI tool_calls (with ids, arguments as JSON text); the
// text around them stays content.
//
// For templates that do not render tools themselves (ChatTemplate::renders_tools), the tools, assistant
// tool calls and tool results are written into the messages' text in the format's syntax (tool_messages).
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

enum class ToolFormat { kHermes, kLlama3, kMistral, kFunctionaryV3, kFunctionaryV31, kDeepSeekR1, kCommandR };

// "hermes", "llama3", "mistral", "functionary3", "functionary31", "deepseek-r1", "command-r".
std::string_view tool_format_name(ToolFormat format);

// The format a chat template's source writes calls in (by the markers it renders). When it shows none (or
// there is no template), the vocabulary decides by the marker tokens it holds (has_token: whether a token
// of exactly this text exists; may be empty); hermes when neither tells.
ToolFormat detect_tool_format(std::string_view template_source,
                              const std::function<bool(std::string_view)>& has_token = {});

// A new call id. Mistral's template accepts only ids of 9 letters and digits; the others get "call_" and 24
// characters. random_alnum(n): n random letters or digits.
std::string new_tool_call_id(ToolFormat format, const std::function<std::string(size_t)>& random_alnum);

// At most this many calls in one reply when parallel calls are allowed under a grammar.
inline constexpr int kMaxParallelCalls = 8;

// A grammar matching one call (parallel: 1 to kMaxParallelCalls calls) of `tools`, or of the one named
// `only` when it is not empty, in `format`'s syntax. Throws ApiError 400 naming
// tools[i].function.parameters when a schema cannot be enforced, or tool_choice when `only` names no tool.
sampling::Grammar tool_call_grammar(const std::vector<ToolSpec>& tools, const std::string& only,
                                    bool parallel, ToolFormat format = ToolFormat::kHermes);

struct ToolReply {
  std::string content;  // the text outside calls, trimmed at the end
  std::vector<ChatToolCall> calls;
};

// Splits a reply into content and calls; `new_id` names each call. Text that looks like a call but does not
// parse as one (a body that is not a JSON object with a string name and object arguments, absent arguments
// meaning {}) stays content.
ToolReply parse_tool_calls(std::string_view text, const std::function<std::string()>& new_id,
                           ToolFormat format = ToolFormat::kHermes);

// The content of a partial reply that stays content whatever follows: the parsed content of the text before
// the first call or the first place one may begin (a trailing prefix of an opening marker), without trailing
// whitespace. Always a prefix of parse_tool_calls(text + anything).content; for streaming content while
// calls may come.
std::string settled_content(std::string_view text, ToolFormat format = ToolFormat::kHermes);

// The text of one call as `format` writes it (what the grammar produces for it).
std::string tool_call_text(ToolFormat format, const std::string& name, const std::string& arguments);

// The messages with the tools described in the system message and tool calls and results written as text in
// `format`'s syntax, for templates that do not render tools themselves.
std::vector<ChatMessage> tool_messages(const std::vector<ChatMessage>& messages,
                                       const std::vector<ToolSpec>& tools,
                                       ToolFormat format = ToolFormat::kHermes);

}  // namespace tandem::server
