#include "tandem/server/chat_template.h"

#include <algorithm>
#include <initializer_list>

#include "tandem/server/jinja/template.h"
#include "tandem/server/openai_api.h"
#include "tandem/util/error.h"

namespace tandem::server {
namespace {

bool contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

std::string trim(std::string_view s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

// A default system message written literally in a ChatML template, as Qwen's are:
// ...'<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n'... The newline may be written as the
// escape \n or as itself; the text must be a plain literal (no Jinja expression inside).
std::string chatml_default_system(std::string_view src) {
  for (std::string_view head :
       {std::string_view("<|im_start|>system\\n"), std::string_view("<|im_start|>system\n")}) {
    size_t at = 0;
    while ((at = src.find(head, at)) != std::string_view::npos) {
      const size_t b = at + head.size();
      const size_t e = src.find("<|im_end|>", b);
      at = b;
      if (e == std::string_view::npos) break;
      std::string_view text = src.substr(b, e - b);
      if (text.empty() || contains(text, "{") || contains(text, "}") || contains(text, "'") ||
          contains(text, "\"") || contains(text, "+"))
        continue;
      std::string out;
      for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
          out += '\n';
          ++i;
        } else {
          out += text[i];
        }
      }
      return out;
    }
  }
  return {};
}

// Appends the parts in order (one call instead of chains of temporaries).
void append(std::string& out, std::initializer_list<std::string_view> parts) {
  for (std::string_view p : parts) out.append(p);
}

// Splits off a leading system message; the rest keeps its order.
std::string take_system(std::span<const ChatMessage>& messages) {
  if (messages.empty() || messages[0].role != "system") return {};
  std::string s = messages[0].content;
  messages = messages.subspan(1);
  return s;
}

}  // namespace

ChatTemplate ChatTemplate::detect(std::string_view src, std::string bos, std::string eos) {
  ChatFamily f = ChatFamily::kPlain;
  std::string system;
  if (contains(src, "<|im_start|>")) {
    f = ChatFamily::kChatML;
    system = chatml_default_system(src);
  } else if (contains(src, "<|start_header_id|>")) {
    f = ChatFamily::kLlama3;
  } else if (contains(src, "<start_of_turn>")) {
    f = ChatFamily::kGemma;
  } else if (contains(src, "<|user|>") && contains(src, "<|end|>")) {
    f = ChatFamily::kPhi3;
  } else if (contains(src, "[INST]")) {
    f = contains(src, "<<SYS>>") ? ChatFamily::kLlama2 : ChatFamily::kMistral;
  }
  ChatTemplate t(f, std::move(bos), std::move(eos), std::move(system));
  t.source_ = src;
  return t;
}

ChatTemplate ChatTemplate::interpret(std::string_view source, std::string bos, std::string eos) {
  auto parsed = std::make_shared<const jinja::Template>(jinja::Template::parse(source));
  ChatTemplate t = detect(source, std::move(bos), std::move(eos));
  t.jinja_ = std::move(parsed);
  t.renders_tools_ = contains(source, "tools");
  return t;
}

ChatTemplate ChatTemplate::load(std::string_view source, std::string bos, std::string eos,
                                std::string* problem) {
  if (source.empty()) return detect(source, std::move(bos), std::move(eos));
  try {
    return interpret(source, bos, eos);
  } catch (const jinja::SyntaxError& e) {
    if (problem) *problem = e.what();
    return detect(source, std::move(bos), std::move(eos));
  }
}

ChatTemplate::ChatTemplate(ChatFamily family, std::string bos, std::string eos, std::string default_system)
    : family_(family),
      bos_(std::move(bos)),
      eos_(std::move(eos)),
      default_system_(std::move(default_system)) {}

std::string_view ChatTemplate::name() const {
  if (jinja_) return "jinja";
  switch (family_) {
    case ChatFamily::kPlain:
      return "plain";
    case ChatFamily::kChatML:
      return "chatml";
    case ChatFamily::kLlama2:
      return "llama2";
    case ChatFamily::kLlama3:
      return "llama3";
    case ChatFamily::kMistral:
      return "mistral";
    case ChatFamily::kGemma:
      return "gemma";
    case ChatFamily::kPhi3:
      return "phi3";
  }
  return "?";
}

std::vector<std::string> ChatTemplate::stop_sequences() const {
  if (family_ == ChatFamily::kPlain && !jinja_) return {"\nUser:"};
  return {};
}

std::string ChatTemplate::render_interpreted(std::span<const ChatMessage> messages,
                                             std::string_view tools_json, bool object_arguments) const {
  jinja::Json vars = jinja::Json::object();
  jinja::Json& list = vars["messages"] = jinja::Json::array();
  for (const ChatMessage& m : messages) {
    jinja::Json msg = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls.empty()) {
      if (m.content.empty()) msg["content"] = nullptr;
      jinja::Json calls = jinja::Json::array();
      for (const ChatToolCall& c : m.tool_calls) {
        jinja::Json arguments = object_arguments
                                    ? jinja::Json::parse(c.arguments, nullptr, /*allow_exceptions=*/false)
                                    : jinja::Json(c.arguments);
        if (arguments.is_discarded()) arguments = c.arguments;
        calls.push_back({{"id", c.id},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", std::move(arguments)}}}});
      }
      msg["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) msg["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) msg["name"] = m.name;
    list.push_back(std::move(msg));
  }
  if (!tools_json.empty()) vars["tools"] = jinja::Json::parse(tools_json);
  vars["bos_token"] = bos_;
  vars["eos_token"] = eos_;
  vars["add_generation_prompt"] = true;
  std::string out;
  try {
    out = jinja_->render(vars);
  } catch (const jinja::RenderError& e) {
    throw ApiError(400, "invalid_request_error",
                   std::string("the model's chat template cannot render these messages: ") + e.what(),
                   "messages");
  }
  return out;
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, std::string_view tools_json) const {
  if (messages.empty()) throw Error("a chat needs at least one message");
  if (jinja_) {
    const bool any_calls = std::any_of(messages.begin(), messages.end(),
                                       [](const ChatMessage& m) { return !m.tool_calls.empty(); });
    if (!any_calls) return render_interpreted(messages, tools_json, true);
    try {
      return render_interpreted(messages, tools_json, true);
    } catch (const ApiError&) {
      // A template that takes the arguments as text; if it refuses those too, that error is the answer.
      return render_interpreted(messages, tools_json, false);
    }
  }
  std::string out;
  switch (family_) {
    case ChatFamily::kChatML: {
      if (messages[0].role != "system" && !default_system_.empty())
        append(out, {"<|im_start|>system\n", default_system_, "<|im_end|>\n"});
      for (const ChatMessage& m : messages)
        append(out, {"<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n"});
      out += "<|im_start|>assistant\n";
      break;
    }
    case ChatFamily::kLlama3: {
      for (const ChatMessage& m : messages)
        append(out, {"<|start_header_id|>", m.role, "<|end_header_id|>\n\n", trim(m.content), "<|eot_id|>"});
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    }
    case ChatFamily::kLlama2: {
      std::string system = take_system(messages);
      bool first = true;
      for (const ChatMessage& m : messages) {
        if (m.role == "assistant") {
          append(out, {" ", trim(m.content), " ", eos_});
          continue;
        }
        std::string content = m.content;
        if (first && !system.empty()) {
          std::string with_system;
          append(with_system, {"<<SYS>>\n", system, "\n<</SYS>>\n\n", content});
          content = std::move(with_system);
        }
        append(out,
               {first ? std::string_view() : std::string_view(bos_), "[INST] ", trim(content), " [/INST]"});
        first = false;
      }
      break;
    }
    case ChatFamily::kMistral: {
      std::string system = take_system(messages);
      bool first = true;
      for (const ChatMessage& m : messages) {
        if (m.role == "assistant") {
          append(out, {m.content, eos_});
          continue;
        }
        std::string content = m.content;
        if (first && !system.empty()) content.insert(0, system + "\n\n");
        append(out, {"[INST] ", content, " [/INST]"});
        first = false;
      }
      break;
    }
    case ChatFamily::kGemma: {
      std::string system = take_system(messages);
      bool first = true;
      for (const ChatMessage& m : messages) {
        const bool model = m.role == "assistant";
        std::string content = m.content;
        if (!model && first && !system.empty()) content.insert(0, system + "\n\n");
        if (!model) first = false;
        append(out, {"<start_of_turn>", model ? "model" : "user", "\n", trim(content), "<end_of_turn>\n"});
      }
      out += "<start_of_turn>model\n";
      break;
    }
    case ChatFamily::kPhi3: {
      for (const ChatMessage& m : messages) {
        const std::string role = m.role == "tool" ? "user" : m.role;
        append(out, {"<|", role, "|>\n", m.content, "<|end|>\n"});
      }
      out += "<|assistant|>\n";
      break;
    }
    case ChatFamily::kPlain: {
      for (const ChatMessage& m : messages) {
        if (m.role == "system")
          append(out, {m.content, "\n\n"});
        else if (m.role == "assistant")
          append(out, {"Assistant: ", m.content, "\n"});
        else if (m.role == "tool")
          append(out, {"Tool: ", m.content, "\n"});
        else
          append(out, {"User: ", m.content, "\n"});
      }
      out += "Assistant:";
      break;
    }
  }
  return out;
}

}  // namespace tandem::server
