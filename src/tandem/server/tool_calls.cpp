#include "tandem/server/tool_calls.h"

#include <algorithm>

#include "tandem/sampling/json_schema.h"
#include "tandem/server/openai_api.h"
#include "tandem/util/error.h"

namespace tandem::server {
namespace {

using nlohmann::ordered_json;
using sampling::GrammarBuilder;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string rstrip(std::string s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
  return s;
}

// The text of one call as the grammar writes it.
std::string call_text(const std::string& name, const std::string& arguments) {
  return std::string(kOpen) + "\n{\"name\": " + ordered_json(name).dump() + ", \"arguments\": " + arguments +
         "}\n" + std::string(kClose);
}

}  // namespace

sampling::Grammar tool_call_grammar(const std::vector<ToolSpec>& tools, const std::string& only,
                                    bool parallel) {
  GrammarBuilder b;
  std::vector<GrammarBuilder::Sequence> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolSpec& t = tools[i];
    if (!only.empty() && t.name != only) continue;
    const ordered_json any_object = {{"type", "object"}};
    const ordered_json& schema = t.parameters.is_null() ? any_object : t.parameters;
    const std::string param = "tools[" + std::to_string(i) + "].function.parameters";
    int32_t arguments = -1;
    try {
      arguments = sampling::add_json_schema_rules(b, schema);
    } catch (const Error& e) {
      throw bad_request("'" + param + "' cannot be enforced: " + e.what(), param);
    }
    GrammarBuilder::Sequence call =
        b.literal(std::string(kOpen) + "\n{\"name\": " + ordered_json(t.name).dump() + ", \"arguments\": ");
    call.push_back(GrammarBuilder::ref(arguments));
    const GrammarBuilder::Sequence close = b.literal("}\n" + std::string(kClose));
    call.insert(call.end(), close.begin(), close.end());
    calls.push_back(std::move(call));
  }
  if (calls.empty())
    throw bad_request("'tool_choice' names the function '" + only + "', which is not in 'tools'",
                      "tool_choice");
  const int32_t call = b.rule("call", calls);
  int32_t root = call;
  if (parallel) {
    GrammarBuilder::Sequence next = b.literal("\n");
    next.push_back(GrammarBuilder::ref(call));
    const int32_t more = b.repeat("more-calls", next, 0, kMaxParallelCalls - 1);
    root = b.rule("calls", {{GrammarBuilder::ref(call), GrammarBuilder::ref(more)}});
  }
  try {
    return sampling::build_json_grammar(std::move(b), root);
  } catch (const Error& e) {
    throw bad_request(std::string("'tools' cannot be enforced: ") + e.what(), "tools");
  }
}

ToolReply parse_tool_calls(std::string_view text, const std::function<std::string()>& new_id) {
  ToolReply reply;
  std::string content;
  size_t at = 0;
  for (;;) {
    const size_t open = text.find(kOpen, at);
    if (open == std::string_view::npos) break;
    const size_t body = open + kOpen.size();
    const size_t close = text.find(kClose, body);
    if (close == std::string_view::npos) break;
    const ordered_json call = ordered_json::parse(trim(text.substr(body, close - body)), nullptr,
                                                  /*allow_exceptions=*/false);
    const auto name = call.is_object() ? call.find("name") : call.end();
    const auto arguments = call.is_object() ? call.find("arguments") : call.end();
    const bool valid = call.is_object() && name != call.end() && name->is_string() &&
                       (arguments == call.end() || arguments->is_object());
    if (!valid) {
      content += text.substr(at, close + kClose.size() - at);
      at = close + kClose.size();
      continue;
    }
    content += text.substr(at, open - at);
    reply.calls.push_back({new_id(), name->get<std::string>(),
                           arguments == call.end() ? std::string("{}") : arguments->dump()});
    at = close + kClose.size();
  }
  content += text.substr(at);
  reply.content = rstrip(std::move(content));
  return reply;
}

size_t settled_content(std::string_view text) {
  size_t end = text.find(kOpen);
  if (end == std::string_view::npos) {
    end = text.size();
    for (size_t k = std::min(text.size(), kOpen.size() - 1); k > 0; --k)
      if (text.substr(text.size() - k) == kOpen.substr(0, k)) {
        end = text.size() - k;
        break;
      }
  }
  // Whitespace before a call is not content: it waits until text follows it.
  while (end > 0 && is_space(text[end - 1])) --end;
  return end;
}

std::vector<ChatMessage> tool_messages(const std::vector<ChatMessage>& messages,
                                       const std::vector<ToolSpec>& tools) {
  std::vector<ChatMessage> out;
  if (!tools.empty()) {
    std::string text =
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
        "with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const ToolSpec& t : tools) {
      ordered_json function = {{"name", t.name}};
      if (!t.description.empty()) function["description"] = t.description;
      if (!t.parameters.is_null()) function["parameters"] = t.parameters;
      text += '\n';
      text += ordered_json{{"type", "function"}, {"function", function}}.dump();
    }
    text +=
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call>";
    if (!messages.empty() && messages[0].role == "system") {
      out.push_back(messages[0]);
      out[0].content += "\n\n" + text;
    } else {
      out.push_back({"system", text, {}, {}, {}});
    }
  }
  for (size_t i = out.empty() || messages.empty() || messages[0].role != "system" ? 0 : 1;
       i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      out.push_back({"user", "<tool_response>\n" + m.content + "\n</tool_response>", {}, {}, {}});
      continue;
    }
    ChatMessage copy{m.role, m.content, {}, {}, {}};
    for (const ChatToolCall& c : m.tool_calls) {
      if (!copy.content.empty()) copy.content += "\n";
      copy.content += call_text(c.name, c.arguments);
    }
    out.push_back(std::move(copy));
  }
  return out;
}

}  // namespace tandem::server
