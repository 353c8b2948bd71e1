#include "tandem/server/text_assembler.h"

#include <algorithm>

namespace tandem::server {

TextAssembler::TextAssembler(const tokenizer::Tokenizer& tokenizer, tokenizer::TextPosition position,
                             std::vector<std::string> stops, bool want_logprobs)
    : tokenizer_(tokenizer),
      decoder_(tokenizer, position),
      stops_(std::move(stops)),
      want_logprobs_(want_logprobs) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string TextAssembler::push(const engine::TokenEvent& token, std::vector<Choice::Logprob>& logprobs) {
  if (stopped_) return {};
  ++tokens_;
  if (want_logprobs_) {
    Choice::Logprob lp;
    lp.token = tokenizer_.token_to_piece(token.id);
    lp.logprob = token.logprob;
    lp.text_offset = sent_ + static_cast<int64_t>(pending_.size());
    for (const auto& [id, v] : token.top) lp.top.emplace_back(tokenizer_.token_to_piece(id), v);
    logprobs.push_back(std::move(lp));
  }
  pending_ += decoder_.push(token.id);

  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, cut);
    pending_.clear();
    sent_ += static_cast<int64_t>(out.size());
    return out;
  }
  // Hold back the longest tail that could still grow into a stop sequence.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, out.size());
  sent_ += static_cast<int64_t>(out.size());
  return out;
}

std::string TextAssembler::finish() {
  if (stopped_) return {};
  pending_ += decoder_.flush();
  std::string out;
  out.swap(pending_);
  sent_ += static_cast<int64_t>(out.size());
  return out;
}

}  // namespace tandem::server
