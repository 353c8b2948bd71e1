#include "tandem/server/tool_calls.h"

#include <algorithm>
#include <initializer_list>
#include <optional>

#include "tandem/sampling/json_schema.h"
#include "tandem/server/openai_api.h"
#include "tandem/util/error.h"

namespace tandem::server {
namespace {

using nlohmann::ordered_json;
using sampling::GrammarBuilder;

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

size_t skip_space(std::string_view s, size_t at) {
  while (at < s.size() && is_space(s[at])) ++at;
  return at;
}

// How a format writes calls: open, then each call as head + name + name_tail + arguments + call_tail with
// separators between them, then close. The grammar, tool_call_text and the instructions for templates
// without tools are all built from this table, so they agree with each other and with the parsers below.
struct Syntax {
  std::string_view open;
  std::string_view head;
  bool quoted_name;  // the name as a JSON string, else as itself
  std::string_view name_tail;
  std::string_view call_tail;
  std::string_view separator;
  std::string_view close;
};

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kFunctionaryTurn = ">>>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kR1CallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kR1CallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kR1CallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kR1CallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kR1Sep = "<｜tool▁sep｜>";
constexpr std::string_view kAction = "Action:";

Syntax syntax(ToolFormat f) {
  switch (f) {
    case ToolFormat::kHermes:
      return {"", "<tool_call>\n{\"name\": ", true, ", \"arguments\": ", "}\n</tool_call>", "\n", ""};
    case ToolFormat::kLlama3:
      return {"", "{\"name\": ", true, ", \"parameters\": ", "}", "\n", ""};
    case ToolFormat::kMistral:
      return {"[", "{\"name\": ", true, ", \"arguments\": ", "}", ", ", "]"};
    case ToolFormat::kFunctionaryV3:
      return {"", "", false, "\n", "", ">>>", ""};
    case ToolFormat::kFunctionaryV31:
      return {"", "<function=", false, ">", "</function>", "", ""};
    case ToolFormat::kDeepSeekR1:
      return {kR1CallsBegin,
              "<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
              false,
              "\n```json\n",
              "\n```<｜tool▁call▁end｜>",
              "\n",
              kR1CallsEnd};
    case ToolFormat::kCommandR:
      return {"Action: ```json\n[\n", "{\"tool_name\": ", true, ", \"parameters\": ", "}", ",\n", "\n]```"};
  }
  return {};
}

std::string name_text(const Syntax& s, const std::string& name) {
  return s.quoted_name ? ordered_json(name).dump() : name;
}

// The end of the JSON object or array starting at s[at] (one past its closing bracket), npos when it does
// not close within s.
size_t json_end(std::string_view s, size_t at) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = at; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

ordered_json parse_json(std::string_view s) {
  return ordered_json::parse(s, nullptr, /*allow_exceptions=*/false);
}

// Arguments as JSON text: an object as it stands, a string holding an object (as some models write them)
// as that object; absent is {}. Anything else is not a call.
std::optional<std::string> arguments_text(const ordered_json& obj, std::string_view key) {
  const auto it = obj.find(key);
  if (it == obj.end()) return std::string("{}");
  if (it->is_object()) return it->dump();
  if (it->is_string()) {
    const ordered_json inner = parse_json(it->get_ref<const std::string&>());
    if (inner.is_object()) return inner.dump();
  }
  return std::nullopt;
}

// A call from a JSON object holding its name under name_key and its arguments under one of args_keys.
std::optional<ChatToolCall> call_from(const ordered_json& obj, std::string_view name_key,
                                      std::initializer_list<std::string_view> args_keys) {
  if (!obj.is_object()) return std::nullopt;
  const auto name = obj.find(name_key);
  if (name == obj.end() || !name->is_string() || name->get_ref<const std::string&>().empty())
    return std::nullopt;
  std::string_view key = *args_keys.begin();
  for (std::string_view k : args_keys)
    if (obj.contains(k)) key = k;
  std::optional<std::string> arguments = arguments_text(obj, key);
  if (!arguments) return std::nullopt;
  return ChatToolCall{{}, name->get<std::string>(), std::move(*arguments)};
}

// One stretch of calls parsed at an opening: the calls and where the text after them resumes.
struct Block {
  std::vector<ChatToolCall> calls;
  size_t end = 0;
};

// Where the next stretch of calls may open at or after `from`: its position, and the bytes of marker to
// step over when what follows does not parse (npos: none).
struct Opening {
  size_t at = std::string_view::npos;
  size_t marker = 0;
};

// A JSON object (or, for arrays, objects) of calls starting at s[at].
std::optional<Block> json_calls_at(std::string_view s, size_t at, std::string_view name_key,
                                   std::initializer_list<std::string_view> args_keys, bool array) {
  Block b;
  at = skip_space(s, at);
  if (array) {
    if (at >= s.size() || s[at] != '[') return std::nullopt;
    const size_t end = json_end(s, at);
    if (end == std::string_view::npos) return std::nullopt;
    const ordered_json list = parse_json(s.substr(at, end - at));
    if (!list.is_array() || list.empty()) return std::nullopt;
    for (const ordered_json& item : list) {
      std::optional<ChatToolCall> c = call_from(item, name_key, args_keys);
      if (!c) return std::nullopt;
      b.calls.push_back(std::move(*c));
    }
    b.end = end;
    return b;
  }
  // Objects one after another, separated by white space or ';'.
  for (;;) {
    size_t next = at;
    while (next < s.size() && (is_space(s[next]) || s[next] == ';')) ++next;
    if (next >= s.size() || s[next] != '{') break;
    const size_t end = json_end(s, next);
    if (end == std::string_view::npos) break;
    std::optional<ChatToolCall> c = call_from(parse_json(s.substr(next, end - next)), name_key, args_keys);
    if (!c) break;
    b.calls.push_back(std::move(*c));
    at = b.end = end;
  }
  if (b.calls.empty()) return std::nullopt;
  return b;
}

// s[at] starts with `what`: the position after it, else npos.
size_t after(std::string_view s, size_t at, std::string_view what) {
  return s.substr(at).starts_with(what) ? at + what.size() : std::string_view::npos;
}

std::optional<Block> hermes_at(std::string_view s, size_t at) {
  Block b;
  const size_t body = at + kHermesOpen.size();
  const size_t close = s.find(kHermesClose, body);
  if (close == std::string_view::npos) return std::nullopt;
  std::optional<ChatToolCall> c =
      call_from(parse_json(trim(s.substr(body, close - body))), "name", {"arguments"});
  if (!c) return std::nullopt;
  b.calls.push_back(std::move(*c));
  b.end = close + kHermesClose.size();
  return b;
}

std::optional<Block> function_tag_at(std::string_view s, size_t at) {
  const size_t name_at = at + kFunctionOpen.size();
  const size_t gt = s.find('>', name_at);
  if (gt == std::string_view::npos || gt == name_at) return std::nullopt;
  const std::string_view name = s.substr(name_at, gt - name_at);
  if (name.find_first_of(" \n<") != std::string_view::npos) return std::nullopt;
  const size_t close = s.find(kFunctionClose, gt + 1);
  if (close == std::string_view::npos) return std::nullopt;
  const ordered_json args = parse_json(trim(s.substr(gt + 1, close - gt - 1)));
  if (!args.is_object()) return std::nullopt;
  Block b;
  b.calls.push_back({{}, std::string(name), args.dump()});
  b.end = close + kFunctionClose.size();
  return b;
}

std::optional<Block> r1_at(std::string_view s, size_t at) {
  Block b;
  size_t p = s.substr(at).starts_with(kR1CallsBegin) ? at + kR1CallsBegin.size() : at;
  for (;;) {
    p = skip_space(s, p);
    const size_t call = after(s, p, kR1CallBegin);
    if (call == std::string_view::npos) break;
    // A call that does not parse ends the block; the calls before it stand (as they did while streaming).
    const size_t sep = s.find(kR1Sep, call);
    const size_t line = sep == std::string_view::npos ? sep : s.find('\n', sep);
    if (line == std::string_view::npos) break;
    const std::string name(trim(s.substr(sep + kR1Sep.size(), line - sep - kR1Sep.size())));
    size_t args = skip_space(s, line);
    if (const size_t fence = after(s, args, "```json"); fence != std::string_view::npos)
      args = skip_space(s, fence);
    if (args >= s.size() || s[args] != '{') break;
    const size_t args_end = json_end(s, args);
    if (args_end == std::string_view::npos || name.empty()) break;
    const ordered_json arguments = parse_json(s.substr(args, args_end - args));
    if (!arguments.is_object()) break;
    p = skip_space(s, args_end);
    if (const size_t fence = after(s, p, "```"); fence != std::string_view::npos) p = skip_space(s, fence);
    const size_t end = after(s, p, kR1CallEnd);
    if (end == std::string_view::npos) break;
    b.calls.push_back({{}, name, arguments.dump()});
    p = b.end = end;
  }
  if (b.calls.empty()) return std::nullopt;
  if (const size_t end = after(s, skip_space(s, b.end), kR1CallsEnd); end != std::string_view::npos)
    b.end = end;
  return b;
}

std::optional<Block> command_r_at(std::string_view s, size_t at) {
  size_t p = skip_space(s, at + kAction.size());
  if (const size_t fence = after(s, p, "```json"); fence != std::string_view::npos) p = fence;
  std::optional<Block> b = json_calls_at(s, p, "tool_name", {"parameters"}, /*array=*/true);
  if (!b) return std::nullopt;
  if (const size_t fence = after(s, skip_space(s, b->end), "```"); fence != std::string_view::npos)
    b->end = fence;
  // "directly-answer" is Command R's way of saying that no tool is needed.
  std::erase_if(b->calls, [](const ChatToolCall& c) { return c.name == "directly-answer"; });
  return b;
}

// The opening markers of each format (those functionary3 uses are handled apart).
std::vector<std::string_view> markers(ToolFormat f) {
  switch (f) {
    case ToolFormat::kHermes:
      return {kHermesOpen};
    case ToolFormat::kLlama3:
      return {kPythonTag};
    case ToolFormat::kMistral:
      return {kMistralCalls};
    case ToolFormat::kFunctionaryV3:
      return {kFunctionaryTurn};
    case ToolFormat::kFunctionaryV31:
      return {kFunctionOpen};
    case ToolFormat::kDeepSeekR1:
      return {kR1CallsBegin, kR1CallBegin};
    case ToolFormat::kCommandR:
      return {kAction};
  }
  return {};
}

// The character a reply of this format may start with to be a call with its (control-token) marker not
// shown: llama3's JSON object, mistral's array. 0: none.
char bare_start(ToolFormat f) {
  return f == ToolFormat::kLlama3 ? '{' : f == ToolFormat::kMistral ? '[' : 0;
}

Opening next_opening(std::string_view s, size_t from, ToolFormat f) {
  Opening o;
  for (std::string_view m : markers(f)) {
    const size_t at = s.find(m, from);
    if (at < o.at) o = {at, m.size()};
  }
  if (const char c = bare_start(f); c != 0 && from == 0) {
    const size_t first = skip_space(s, 0);
    if (first < s.size() && s[first] == c && first < o.at) return {first, 0};
  }
  return o;
}

std::optional<Block> block_at(std::string_view s, const Opening& o, ToolFormat f) {
  const size_t body = o.at + o.marker;
  switch (f) {
    case ToolFormat::kHermes:
      return hermes_at(s, o.at);
    case ToolFormat::kLlama3:
      return json_calls_at(s, body, "name", {"parameters", "arguments"}, false);
    case ToolFormat::kMistral:
      return json_calls_at(s, body, "name", {"arguments", "parameters"}, true);
    case ToolFormat::kFunctionaryV31:
      return function_tag_at(s, o.at);
    case ToolFormat::kDeepSeekR1:
      return r1_at(s, o.at);
    case ToolFormat::kCommandR:
      return command_r_at(s, o.at);
    case ToolFormat::kFunctionaryV3:
      break;
  }
  return std::nullopt;
}

// Functionary v3: turns opened by ">>>", each naming its recipient on the first line: "all" for text to
// the user, else the function whose arguments follow. The prompt ends in ">>>", so the reply starts inside
// the first turn. A turn that is neither stays content as it stands.
ToolReply parse_functionary(std::string_view reply, const std::function<std::string()>& new_id) {
  std::string text(kFunctionaryTurn);
  text += reply;
  const std::string_view s = text;
  ToolReply out;
  std::string content;
  size_t at = 0;
  while (at < s.size()) {
    const size_t turn = at + kFunctionaryTurn.size();
    const size_t next_turn = std::min(s.find(kFunctionaryTurn, turn), s.size());
    const size_t line = s.find('\n', turn);
    if (line != std::string_view::npos && line < next_turn) {
      const std::string_view recipient = trim(s.substr(turn, line - turn));
      if (recipient == "all") {
        content += s.substr(line + 1, next_turn - line - 1);
        at = next_turn;
        continue;
      }
      const size_t args = skip_space(s, line);
      const size_t end = args < s.size() && s[args] == '{' ? json_end(s, args) : std::string_view::npos;
      const ordered_json arguments =
          end == std::string_view::npos ? ordered_json() : parse_json(s.substr(args, end - args));
      if (!recipient.empty() && recipient.find(' ') == std::string_view::npos && arguments.is_object()) {
        out.calls.push_back({new_id(), std::string(recipient), arguments.dump()});
        // Text after the arguments, before the next turn, stays content.
        const size_t rest = std::min(s.find(kFunctionaryTurn, end), s.size());
        content += trim(s.substr(end, rest - end));
        at = rest;
        continue;
      }
    }
    const size_t from = at == 0 ? turn : at;  // the first ">>>" was the prompt's
    content += s.substr(from, next_turn - from);
    at = next_turn;
  }
  out.content = rstrip(std::move(content));
  return out;
}

// Functionary v3: the end of the settled text, before the first turn that is not (or may not be) "all".
size_t functionary_content_end(std::string_view s) {
  size_t at = 0;
  for (;;) {
    const size_t turn = at + kFunctionaryTurn.size();
    const size_t line = s.find('\n', turn);
    if (line == std::string_view::npos || trim(s.substr(turn, line - turn)) != "all") return at;
    const size_t next = s.find(kFunctionaryTurn, line);
    if (next == std::string_view::npos) {
      // A trailing prefix of ">>>" may open the next turn.
      size_t end = s.size();
      for (size_t k = std::min(s.size() - line, kFunctionaryTurn.size() - 1); k > 0; --k)
        if (s.substr(s.size() - k) == kFunctionaryTurn.substr(0, k)) {
          end = s.size() - k;
          break;
        }
      return end;
    }
    at = next;
  }
}

}  // namespace

std::string_view tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kLlama3:
      return "llama3";
    case ToolFormat::kMistral:
      return "mistral";
    case ToolFormat::kFunctionaryV3:
      return "functionary3";
    case ToolFormat::kFunctionaryV31:
      return "functionary31";
    case ToolFormat::kDeepSeekR1:
      return "deepseek-r1";
    case ToolFormat::kCommandR:
      return "command-r";
  }
  return "?";
}

ToolFormat detect_tool_format(std::string_view src, const std::function<bool(std::string_view)>& has_token) {
  const auto has = [&](std::string_view m) { return src.find(m) != std::string_view::npos; };
  if (has(kR1CallsBegin) || has(kR1CallBegin)) return ToolFormat::kDeepSeekR1;
  if (has(kMistralCalls)) return ToolFormat::kMistral;
  if (has(">>>") && (has("recipient") || has("namespace functions"))) return ToolFormat::kFunctionaryV3;
  if (has(kFunctionOpen)) return ToolFormat::kFunctionaryV31;
  if (has("<|START_OF_TURN_TOKEN|>") && has(kAction)) return ToolFormat::kCommandR;
  if (has(kHermesOpen)) return ToolFormat::kHermes;
  if (has("<|start_header_id|>") && (has(kPythonTag) || has("ipython") || has("\"parameters\"")))
    return ToolFormat::kLlama3;
  if (has_token) {
    if (has_token(kR1CallsBegin)) return ToolFormat::kDeepSeekR1;
    if (has_token(kMistralCalls)) return ToolFormat::kMistral;
    if (has_token(kHermesOpen)) return ToolFormat::kHermes;
    if (has_token(kPythonTag)) return ToolFormat::kLlama3;
  }
  return ToolFormat::kHermes;
}

std::string new_tool_call_id(ToolFormat format, const std::function<std::string(size_t)>& random_alnum) {
  return format == ToolFormat::kMistral ? random_alnum(9) : "call_" + random_alnum(24);
}

std::string tool_call_text(ToolFormat format, const std::string& name, const std::string& arguments) {
  const Syntax s = syntax(format);
  std::string out(format == ToolFormat::kFunctionaryV3 ? kFunctionaryTurn : std::string_view());
  out += s.open;
  out += s.head;
  out += name_text(s, name);
  out += s.name_tail;
  out += arguments;
  out += s.call_tail;
  out += s.close;
  return out;
}

sampling::Grammar tool_call_grammar(const std::vector<ToolSpec>& tools, const std::string& only,
                                    bool parallel, ToolFormat format) {
  const Syntax s = syntax(format);
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
        b.literal(std::string(s.head) + name_text(s, t.name) + std::string(s.name_tail));
    call.push_back(GrammarBuilder::ref(arguments));
    if (!s.call_tail.empty()) {
      const GrammarBuilder::Sequence tail = b.literal(s.call_tail);
      call.insert(call.end(), tail.begin(), tail.end());
    }
    calls.push_back(std::move(call));
  }
  if (calls.empty())
    throw bad_request("'tool_choice' names the function '" + only + "', which is not in 'tools'",
                      "tool_choice");
  const int32_t call = b.rule("call", calls);
  GrammarBuilder::Sequence root;
  if (!s.open.empty()) root = b.literal(s.open);
  root.push_back(GrammarBuilder::ref(call));
  if (parallel) {
    GrammarBuilder::Sequence next = s.separator.empty() ? GrammarBuilder::Sequence() : b.literal(s.separator);
    next.push_back(GrammarBuilder::ref(call));
    root.push_back(GrammarBuilder::ref(b.repeat("more-calls", next, 0, kMaxParallelCalls - 1)));
  }
  if (!s.close.empty()) {
    const GrammarBuilder::Sequence close = b.literal(s.close);
    root.insert(root.end(), close.begin(), close.end());
  }
  const int32_t calls_rule = b.rule("calls", {root});
  try {
    return sampling::build_json_grammar(std::move(b), calls_rule);
  } catch (const Error& e) {
    throw bad_request(std::string("'tools' cannot be enforced: ") + e.what(), "tools");
  }
}

ToolReply parse_tool_calls(std::string_view text, const std::function<std::string()>& new_id,
                           ToolFormat format) {
  if (format == ToolFormat::kFunctionaryV3) return parse_functionary(text, new_id);
  ToolReply reply;
  std::string content;
  size_t at = 0;
  for (;;) {
    const Opening o = next_opening(text, at, format);
    if (o.at == std::string_view::npos) break;
    std::optional<Block> block = block_at(text, o, format);
    if (!block) {
      // Not a call: the marker stays content, and the search goes on after it.
      const size_t resume = o.at + std::max<size_t>(o.marker, 1);
      content += text.substr(at, resume - at);
      at = resume;
      continue;
    }
    content += text.substr(at, o.at - at);
    for (ChatToolCall& c : block->calls) {
      c.id = new_id();
      reply.calls.push_back(std::move(c));
    }
    at = block->end;
  }
  content += text.substr(at);
  reply.content = rstrip(std::move(content));
  return reply;
}

std::string settled_content(std::string_view text, ToolFormat format) {
  size_t end = 0;
  if (format == ToolFormat::kFunctionaryV3) {
    std::string s(kFunctionaryTurn);
    s += text;
    end = functionary_content_end(s);
    const auto none = [] { return std::string(); };
    return end <= kFunctionaryTurn.size()
               ? std::string()
               : parse_functionary(std::string_view(s).substr(3, end - 3), none).content;
  }
  const Opening o = next_opening(text, 0, format);
  end = std::min(o.at, text.size());
  if (o.at == std::string_view::npos) {
    for (std::string_view m : markers(format))
      for (size_t k = std::min(text.size(), m.size() - 1); k > 0; --k)
        if (text.substr(text.size() - k) == m.substr(0, k)) {
          end = std::min(end, text.size() - k);
          break;
        }
    // A reply that is only white space so far may still open with a bare call.
    if (bare_start(format) != 0 && skip_space(text, 0) == text.size()) end = 0;
  }
  return rstrip(std::string(text.substr(0, end)));
}

std::vector<ChatMessage> tool_messages(const std::vector<ChatMessage>& messages,
                                       const std::vector<ToolSpec>& tools, ToolFormat format) {
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
    text += "\n</tools>\n\n";
    if (format == ToolFormat::kHermes) {
      text +=
          "For each function call, return a json object with function name and arguments within "
          "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
          "<args-json-object>}\n</tool_call>";
    } else {
      text += "To call a function, write the call in this form, the arguments a JSON object:\n";
      text += tool_call_text(format, "<function-name>", "<args-json-object>");
    }
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
      copy.content += tool_call_text(format, c.name, c.arguments);
    }
    out.push_back(std::move(copy));
  }
  return out;
}

}  // namespace tandem::server
