#include "tandem/server/chat_reply.h"

#include <cstddef>

namespace tandem::server {
namespace {

constexpr std::string_view kThink = "<think>";
constexpr std::string_view kEndThink = "</think>";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::string_view ltrim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

std::string_view rtrim(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The longest suffix of s that is a proper prefix of `marker`.
size_t partial_marker(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

// A reply cut into its reasoning and the text after it. final: the text is whole (else a partial end marker
// is held back, and a reply that may still open a block settles nothing).
struct Split {
  std::string_view reasoning;
  std::string_view rest;
  bool undecided = false;  // not final, and the text may still open a reasoning block
};

Split split(std::string_view text, const ReplyOptions& o, bool final) {
  if (!o.reasoning) return {{}, text};
  size_t body = 0;
  if (!o.reasoning_open) {
    const std::string_view head = ltrim(text);
    if (!head.starts_with(kThink)) {
      if (!final && kThink.starts_with(head)) return {{}, {}, true};
      return {{}, text};
    }
    body = text.size() - head.size() + kThink.size();
  }
  const size_t close = text.find(kEndThink, body);
  if (close == std::string_view::npos) {
    std::string_view thought = text.substr(body);
    if (!final) thought.remove_suffix(partial_marker(thought, kEndThink));
    return {ltrim(rtrim(thought)), {}};
  }
  return {ltrim(rtrim(text.substr(body, close - body))), ltrim(text.substr(close + kEndThink.size()))};
}

}  // namespace

std::optional<ReasoningFormat> reasoning_format_from(std::string_view name) {
  if (name == "none") return ReasoningFormat::kNone;
  if (name == "deepseek") return ReasoningFormat::kDeepSeek;
  return std::nullopt;
}

bool prompt_opens_reasoning(std::string_view prompt) {
  return rtrim(prompt).ends_with(kThink);
}

ChatReply parse_chat_reply(std::string_view text, const ReplyOptions& options,
                           const std::function<std::string()>& new_id) {
  const Split s = split(text, options, /*final=*/true);
  ChatReply reply;
  reply.reasoning = s.reasoning;
  if (options.tools) {
    ToolReply t = parse_tool_calls(s.rest, new_id, options.format);
    reply.content = std::move(t.content);
    reply.calls = std::move(t.calls);
  } else {
    reply.content = s.rest;
  }
  return reply;
}

ReplyStream::Delta ReplyStream::push(std::string_view text) {
  text_ += text;
  const Split s = split(text_, options_, /*final=*/false);
  Delta d;
  if (s.undecided) return d;
  if (s.reasoning.size() > reasoning_sent_) {
    d.reasoning = s.reasoning.substr(reasoning_sent_);
    reasoning_sent_ = s.reasoning.size();
  }
  std::string settled;
  if (options_.tools) settled = settled_content(s.rest, options_.format);
  const std::string_view content = options_.tools ? std::string_view(settled) : s.rest;
  if (content.size() > content_sent_) {
    d.content = content.substr(content_sent_);
    content_sent_ = content.size();
  }
  if (options_.tools) d.calls = new_calls(s.rest);
  return d;
}

std::vector<ChatToolCall> ReplyStream::new_calls(std::string_view rest) {
  std::vector<ChatToolCall> calls = parse_tool_calls(
                                        rest, [] { return std::string(); }, options_.format)
                                        .calls;
  if (calls.size() <= calls_sent_) return {};
  calls.erase(calls.begin(), calls.begin() + static_cast<std::ptrdiff_t>(calls_sent_));
  for (ChatToolCall& c : calls) c.id = new_id_();
  calls_sent_ += calls.size();
  return calls;
}

ChatReply ReplyStream::finish() {
  const Split s = split(text_, options_, /*final=*/true);
  ChatReply whole = parse_chat_reply(text_, options_, [] { return std::string(); });
  ChatReply rest;
  if (whole.reasoning.size() > reasoning_sent_) rest.reasoning = whole.reasoning.substr(reasoning_sent_);
  if (whole.content.size() > content_sent_) rest.content = whole.content.substr(content_sent_);
  if (options_.tools) rest.calls = new_calls(s.rest);
  return rest;
}

}  // namespace tandem::server
