// Server-sent events as the OpenAI streaming API uses them: each chunk one `data: {json}` event, the stream
// closed by `data: [DONE]`.
#pragma once

#include <string>

namespace tandem::server {

inline std::string sse_event(const std::string& json_text) {
  return "data: " + json_text + "\n\n";
}
inline const char* sse_done() {
  return "data: [DONE]\n\n";
}

}  // namespace tandem::server
