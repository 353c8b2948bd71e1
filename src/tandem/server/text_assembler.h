// Generated tokens -> the text a client sees: incremental UTF-8 decoding, stop sequences (the text is cut
// before the first match, and a possible beginning of one is held back until it is ruled out, so no stop
// sequence is ever sent), and per-token logprob entries. One per request; not thread safe.
//
// A completion continues its prompt (TextPosition::kContinuation): prompt + text reads as one text, so a
// generated leading space is sent, in the first delta when streaming. A chat reply is a message of its own
// (TextPosition::kStart): its first space is dropped as at the start of any text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/engine/stream.h"
#include "tandem/server/openai_api.h"
#include "tandem/tokenizer/tokenizer.h"

namespace tandem::server {

// Where a request's generated text stands: a completion continues its prompt, a chat reply starts a message.
inline tokenizer::TextPosition text_position(const CompletionRequest& r) {
  return r.chat ? tokenizer::TextPosition::kStart : tokenizer::TextPosition::kContinuation;
}

class TextAssembler {
 public:
  TextAssembler(const tokenizer::Tokenizer& tokenizer, tokenizer::TextPosition position,
                std::vector<std::string> stops, bool want_logprobs);

  // Feeds one token. Returns the text that may be sent now; appends the token's logprob entry (when wanted)
  // to `logprobs`. After a stop sequence matched, stopped() is true and later tokens are ignored.
  std::string push(const engine::TokenEvent& token, std::vector<Choice::Logprob>& logprobs);
  // The held-back rest at the end of generation (empty after a stop sequence).
  std::string finish();
  bool stopped() const { return stopped_; }
  int64_t tokens() const { return tokens_; }  // tokens fed before stopping (the stopping one included)

 private:
  const tokenizer::Tokenizer& tokenizer_;
  tokenizer::StreamDecoder decoder_;
  std::vector<std::string> stops_;
  bool want_logprobs_;
  std::string pending_;  // decoded, not yet sent
  int64_t sent_ = 0;     // bytes sent so far
  int64_t tokens_ = 0;
  bool stopped_ = false;
};

}  // namespace tandem::server
