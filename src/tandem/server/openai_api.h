// OpenAI API requests and responses, as plain data: parsing and validation of request bodies (every failure
// an ApiError carrying the HTTP status and an OpenAI-style error object) and the JSON of responses and
// streamed chunks. No I/O and no model here, so every rule is tested without a server.
//
// Extensions: "ignore_eos": true generates through end-of-generation tokens, up to max_tokens;
// "reasoning_format": "none" | "deepseek" (chat) overrides the server's --reasoning-format for the request.
// Unknown fields are ignored, as OpenAI does; fields Tandem cannot honour (n > 1, several prompts, non-text
// message parts) are rejected rather than silently changed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/engine/stream.h"
#include "tandem/sampling/grammar.h"
#include "tandem/server/chat_reply.h"
#include "tandem/server/chat_template.h"
#include "tandem/server/tool_calls.h"

namespace tandem::server {

// An error answered to a client: HTTP status plus the fields of OpenAI's {"error": {...}} object.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, const std::string& message, std::string param = {},
           std::string code = {})
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, server_error, ...
  std::string param;  // the offending request field, when there is one
  std::string code;   // a machine-readable code, when there is one
  nlohmann::json to_json() const;
};

ApiError bad_request(const std::string& message, const std::string& param = {});

struct CompletionRequest {
  bool chat = false;
  std::string model;
  // Completions: the prompt as text, or as token ids when prompt_ids is non-empty. Chat: messages.
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::vector<ChatMessage> messages;
  std::optional<int64_t> max_tokens;  // absent: completions 16, chat up to the context
  double temperature = 1.0;
  double top_p = 1.0;
  double presence_penalty = 0, frequency_penalty = 0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  int top_logprobs = -1;  // < 0: no logprobs
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // extension: generate through end-of-generation tokens (benchmarks, tests)
  // OpenAI's end-user id. Generation ignores it; a balancer in front of several servers may route on it
  // (docs/cluster.md), so it must be a string when present.
  std::string user;
  // response_format json_object or json_schema, or tool_choice required or named: the grammar the output
  // must match (null: free text).
  std::shared_ptr<const sampling::Grammar> grammar;
  // Chat: the functions the model may call, the same as the JSON text of `tools`, and how it may call them.
  std::vector<ToolSpec> tools;
  std::string tools_json;
  ToolChoice tool_choice = ToolChoice::kNone;  // kAuto when tools are given and tool_choice is not
  std::string tool_name;                       // kNamed: the function
  bool parallel_tool_calls = true;
  // Chat: whether a <think> block in the reply goes to reasoning_content (chat_reply.h).
  ReasoningFormat reasoning_format = ReasoningFormat::kDeepSeek;
};

// Limits a request is checked against.
struct ApiLimits {
  std::string model_name;  // the one model served: requests must name it
  int64_t n_vocab = 0;
  // The body's shape is checked before any of it is built in memory, so a hostile body costs a pass over its
  // bytes and no more: nesting deeper than max_json_depth (arrays and objects) or more than max_json_elements
  // values in all (every scalar, array and object counts one) is refused with 400.
  int max_json_depth = 64;
  size_t max_json_elements = 1u << 18;
  // The model's syntax for tool calls, which a required or named tool_choice's grammar enforces, and the
  // reasoning format a request gets when it names none.
  ToolFormat tool_format = ToolFormat::kHermes;
  ReasoningFormat reasoning_format = ReasoningFormat::kDeepSeek;
};

// Throws ApiError 400 when body is not JSON, is not valid UTF-8, or passes the depth or element limits;
// every request parser calls it before building the body's tree.
void check_json_shape(const std::string& body, const ApiLimits& limits);

// Parses and validates a request body for /v1/completions (chat = false) or /v1/chat/completions. Throws
// ApiError: 400 for malformed JSON, invalid UTF-8, a body past the JSON limits, numbers too large for a
// double (1e400: the error names the field, as "temperature" or "logit_bias.42"), wrong types, missing fields
// and out-of-range values, and a response_format JSON schema that does not compile (the message names the
// place in the schema); 404 for a model name other than the one served.
CompletionRequest parse_request(const std::string& body, bool chat, const ApiLimits& limits);

// Response assembly for one choice.
struct Choice {
  std::string text;
  std::string reasoning;                 // chat: reasoning_content
  std::vector<ChatToolCall> tool_calls;  // chat: the calls parsed from the reply (finish_reason "tool_calls")
  std::string finish_reason;             // "stop" | "length"
  struct Logprob {
    std::string token;  // the token's bytes (may be an incomplete UTF-8 sequence)
    double logprob = 0;
    std::vector<std::pair<std::string, double>> top;
    int64_t text_offset = 0;  // completions: offset of the token's text in the completion
  };
  std::vector<Logprob> logprobs;
  bool want_logprobs = false;
};

nlohmann::json usage_json(const engine::Usage& usage);
// The full (non-streamed) response.
nlohmann::json response_json(const CompletionRequest& req, const std::string& id, int64_t created,
                             const Choice& choice, const engine::Usage& usage);
// One streamed chunk carrying `delta` text (and its logprobs); finish_reason empty until the last one.
// first: a chat stream's first chunk also carries the role. reasoning: a chat delta's reasoning_content.
nlohmann::json chunk_json(const CompletionRequest& req, const std::string& id, int64_t created,
                          const std::string& delta, const std::vector<Choice::Logprob>& logprobs,
                          bool want_logprobs, const std::string& finish_reason, bool first,
                          const std::string& reasoning = {});
// A chat chunk carrying whole tool calls as deltas (index, id, type, name and all the arguments); the first
// of `calls` has index first_index.
nlohmann::json tool_calls_chunk_json(const CompletionRequest& req, const std::string& id, int64_t created,
                                     const std::vector<ChatToolCall>& calls, size_t first_index = 0);
// The closing chunk of a stream with stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk_json(const CompletionRequest& req, const std::string& id, int64_t created,
                                const engine::Usage& usage);

// JSON text safe for any string content: invalid UTF-8 becomes U+FFFD instead of throwing.
std::string dump(const nlohmann::json& j);

}  // namespace tandem::server
