#include "tandem/speculative/draft_model.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "tandem/util/error.h"

namespace tandem::speculative {
namespace {

constexpr const char* kSpecialKeys[] = {
    "tokenizer.ggml.bos_token_id",       "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",       "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.unknown_token_id",   "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.separator_token_id",
    "tokenizer.ggml.mask_token_id",
};

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::vector<int32_t> token_types(const gguf::File& f) {
  const gguf::Value* v = f.find("tokenizer.ggml.token_type");
  std::vector<int32_t> types;
  if (!v || v->type != gguf::ValueType::ARRAY || v->elem_type == gguf::ValueType::STRING ||
      v->elem_type == gguf::ValueType::ARRAY)
    return types;
  types.reserve(v->count);
  for (uint64_t k = 0; k < v->count; ++k) types.push_back(static_cast<int32_t>(v->elem_i64(k)));
  return types;
}

}  // namespace

std::string vocabulary_difference(const gguf::File& target, const gguf::File& draft) {
  const auto t_tokens = target.get_strings("tokenizer.ggml.tokens");
  const auto d_tokens = draft.get_strings("tokenizer.ggml.tokens");
  if (t_tokens.empty() || d_tokens.empty())
    return std::string(t_tokens.empty() ? "the target" : "the draft model") +
           " has no token table (tokenizer.ggml.tokens)";
  if (t_tokens.size() != d_tokens.size())
    return "the target has " + std::to_string(t_tokens.size()) + " tokens, the draft model " +
           std::to_string(d_tokens.size());
  for (size_t i = 0; i < t_tokens.size(); ++i)
    if (t_tokens[i] != d_tokens[i])
      return "token " + std::to_string(i) + " is " + quoted(t_tokens[i]) + " in the target but " +
             quoted(d_tokens[i]) + " in the draft model";
  const auto t_types = token_types(target), d_types = token_types(draft);
  if (t_types.size() != d_types.size())
    return "the token types (tokenizer.ggml.token_type) have " + std::to_string(t_types.size()) +
           " entries in the target, " + std::to_string(d_types.size()) + " in the draft model";
  for (size_t i = 0; i < t_types.size(); ++i)
    if (t_types[i] != d_types[i])
      return "token " + std::to_string(i) + " has type " + std::to_string(t_types[i]) +
             " in the target but " + std::to_string(d_types[i]) + " in the draft model";
  for (const char* key : kSpecialKeys) {
    const auto t = target.get_int(key), d = draft.get_int(key);
    if (t != d) {
      const auto show = [](const std::optional<int64_t>& v) { return v ? std::to_string(*v) : "absent"; };
      return std::string(key) + " is " + show(t) + " in the target but " + show(d) + " in the draft model";
    }
  }
  return "";
}

void check_same_vocabulary(const model::Model& target, const model::Model& draft) {
  std::string diff = vocabulary_difference(target.file(), draft.file());
  if (diff.empty() && target.config().n_vocab != draft.config().n_vocab)
    diff = "the target's output has " + std::to_string(target.config().n_vocab) +
           " rows, the draft model's " + std::to_string(draft.config().n_vocab);
  if (!diff.empty())
    throw Error("the draft model's vocabulary differs from the target's (" + draft.file().path() + " vs " +
                target.file().path() + "): " + diff);
}

DraftModelSource::DraftModelSource(const model::Model& draft, const model::Model& target, ThreadPool& pool,
                                   const model::SessionOptions& options)
    : session_((check_same_vocabulary(target, draft), draft), pool, options), sampler_(sampling::Params{}) {}

void DraftModelSource::begin(std::span<const int32_t> prompt, const DraftSettings& settings) {
  sampler_ = sampling::Sampler(settings.sampling);
  sequence_ = settings.sequence_id;
  grammar_ = settings.grammar;
  // Everything but the last prompt token now; the first proposal evaluates that one and drafts from its
  // logits.
  const auto n = std::min<size_t>(prompt.size() - std::min<size_t>(prompt.size(), 1),
                                  static_cast<size_t>(session_.n_ctx()));
  // A prefix the cache holds from the last generation (a chat's earlier turns) is kept.
  roll_back_to(prompt.first(n));
  if (cached_.size() < n) {
    session_.eval(prompt.subspan(cached_.size(), n - cached_.size()));
    cached_.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(n));
  }
}

void DraftModelSource::roll_back_to(std::span<const int32_t> text) {
  size_t keep = 0;
  const size_t limit = std::min(cached_.size(), text.size());
  while (keep < limit && cached_[keep] == text[keep]) ++keep;
  cached_.resize(keep);
  session_.truncate(static_cast<int64_t>(keep));
}

void DraftModelSource::propose(std::span<const int32_t> committed, int max_depth, Draft& out) {
  out.clear();
  if (committed.empty() || max_depth < 1) return;
  const auto n = static_cast<int64_t>(committed.size());
  // The cache must hold every committed token, the last one evaluated now so that its logits are at hand, and
  // room for the drafts fed back (all but the last).
  const int64_t depth = std::min<int64_t>(max_depth, session_.n_ctx() - n + 1);
  if (depth < 1) return;
  roll_back_to(committed.first(static_cast<size_t>(n - 1)));
  const auto missing = committed.subspan(cached_.size());
  std::span<const float> logits = session_.eval(missing);
  cached_.insert(cached_.end(), missing.begin(), missing.end());

  history_.assign(committed.begin(), committed.end());
  const bool sampled = sampler_.params().temperature > 0.0f;
  if (grammar_) drafting_ = *grammar_;
  for (int64_t i = 0; i < depth; ++i) {
    if (drafting_ && (drafting_->terminated() || drafting_->must_end())) break;
    sampling::Distribution& q = out.q_slot(static_cast<size_t>(i));
    sampler_.distribution(drafting_ ? masked(logits) : logits, history_, q);
    const int32_t x = sampler_.draw(q, sequence_, static_cast<uint64_t>(n + i), kDrawDraft);
    if (drafting_ && !drafting_->accept_token(x)) break;
    out.tokens.push_back(x);
    history_.push_back(x);
    if (i + 1 < depth) {
      logits = session_.eval(std::span<const int32_t>(&x, 1));
      cached_.push_back(x);
    }
  }
  out.sampled = sampled;
}

std::span<const float> DraftModelSource::masked(std::span<const float> logits) {
  drafting_->fill_mask(mask_);
  masked_.assign(logits.begin(), logits.end());
  // Rows past the tokenizer's vocabulary (padding) have no text, so no grammar allows them.
  for (size_t id = 0; id < masked_.size(); ++id)
    if (id >= static_cast<size_t>(mask_.n_vocab()) || !mask_.test(static_cast<int32_t>(id)))
      masked_[id] = -std::numeric_limits<float>::infinity();
  return masked_;
}

void DraftModelSource::accept(std::span<const int32_t> committed, int /*n_accepted*/) {
  roll_back_to(committed);
}

}  // namespace tandem::speculative
