#include "tandem/speculative/draft_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
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

DraftModelBatch::DraftModelBatch(const model::Model& draft, ThreadPool& pool, int max_sequences,
                                 int64_t max_rows)
    : graph_(draft, pool, model::GraphOptions{std::max<int64_t>(max_rows, max_sequences), 16}),
      max_rows_(std::max<int64_t>(max_rows, max_sequences)) {
  if (max_sequences < 1) throw Error("a draft model batch holds at least one sequence");
  const auto n = static_cast<size_t>(max_sequences);
  logits_.resize(n * static_cast<size_t>(draft.config().n_vocab));
  members_.reserve(n);
  tokens_.reserve(n);
  caches_.reserve(n);
  group_caches_.reserve(n);
  groups_.reserve(n);
}

namespace {
// A drafter's sequence is rolled back after every round.
model::SessionOptions with_rollback(model::SessionOptions options) {
  options.rollback = true;
  return options;
}
}  // namespace

DraftModelSource::DraftModelSource(const model::Model& draft, const model::Model& target, ThreadPool& pool,
                                   const model::SessionOptions& options, DraftModelBatch* batch)
    : session_((check_same_vocabulary(target, draft), draft), pool, with_rollback(options)),
      batch_(batch),
      sampler_(sampling::Params{}) {}

void DraftModelSource::begin(std::span<const int32_t> prompt, const DraftSettings& settings) {
  sampler_ = sampling::Sampler(settings.sampling);
  tree_.begin(settings.sampling, tree_branch);
  sequence_ = settings.sequence_id;
  grammar_ = settings.grammar;
  tree_base_ = -1;
  if (batch_) {
    // In a batch, the first proposal appends the prompt in forwards shared with the other sequences.
    session_.truncate(0);
    cached_.clear();
    return;
  }
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
  // A recurrent (mamba) draft state goes back only so far; past that, it restarts from what it can reach.
  if (const cache::RecurrentState* r = session_.cache().recurrent(); r != nullptr && keep < cached_.size())
    keep = static_cast<size_t>(r->reachable(static_cast<int64_t>(keep)));
  cached_.resize(keep);
  session_.truncate(static_cast<int64_t>(keep));
}

void DraftModelSource::propose(std::span<const int32_t> committed, int max_depth, Draft& out) {
  out.clear();
  tree_base_ = -1;
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
  drafting_.reset();
  if (grammar_) drafting_ = *grammar_;
  for (int64_t i = 0; i < depth; ++i) {
    if (!draw(logits, n + i, static_cast<size_t>(i), out)) break;
    if (i + 1 < depth) {
      logits = session_.eval(std::span<const int32_t>(&out.tokens.back(), 1));
      cached_.push_back(out.tokens.back());
    }
  }
}

bool DraftModelSource::draw(std::span<const float> logits, int64_t position, size_t i, Draft& out) {
  if (drafting_ && (drafting_->terminated() || drafting_->must_end())) return false;
  sampling::Distribution& q = out.q_slot(i);
  sampler_.distribution(drafting_ ? masked(logits) : logits, history_, q);
  const int32_t x = sampler_.draw(q, sequence_, static_cast<uint64_t>(position), kDrawDraft);
  if (drafting_ && !drafting_->accept_token(x)) return false;
  out.tokens.push_back(x);
  out.sampled = sampler_.params().temperature > 0.0f;
  history_.push_back(x);
  return true;
}

void DraftModelSource::propose_batch(std::span<const DraftRequest> requests) {
  TANDEM_CHECK(batch_ != nullptr, "a draft model proposes in batches only with a DraftModelBatch");
  DraftModelBatch& b = *batch_;
  auto& members = b.members_;
  members.clear();
  for (const DraftRequest& r : requests) {
    auto& src = static_cast<DraftModelSource&>(*r.source);
    TANDEM_CHECK(src.batch_ == batch_, "the sources of a batched proposal share their batch");
    TANDEM_CHECK(members.size() < members.capacity(), "more sequences propose together than the batch holds");
    r.out->clear();
    if (r.committed.empty() || r.max_depth < 1) continue;
    const auto n = static_cast<int64_t>(r.committed.size());
    const int64_t depth = std::min<int64_t>(r.max_depth, src.session_.n_ctx() - n + 1);
    if (depth < 1) continue;
    src.roll_back_to(r.committed.first(static_cast<size_t>(n - 1)));
    src.history_.assign(r.committed.begin(), r.committed.end());
    src.drafting_.reset();
    if (src.grammar_) src.drafting_ = *src.grammar_;
    members.push_back({&src, r.committed, depth, r.out});
  }
  // Every member's committed text but its last token, appended in chunks shared across members.
  for (;;) {
    b.groups_.clear();
    b.group_caches_.clear();
    int64_t rows = 0;
    for (DraftModelBatch::Member& m : members) {
      const auto have = static_cast<int64_t>(m.source->cached_.size());
      const int64_t missing = static_cast<int64_t>(m.committed.size()) - 1 - have;
      if (missing <= 0 || rows >= b.max_rows_) continue;
      const int64_t chunk = std::min(missing, b.max_rows_ - rows);
      const auto text = m.committed.subspan(static_cast<size_t>(have), static_cast<size_t>(chunk));
      b.group_caches_.push_back(&m.source->session_.cache());
      b.groups_.push_back({model::Phase::kAppendKnown, text,
                           std::span<cache::KvCache* const>(&b.group_caches_.back(), 1), nullptr, nullptr});
      m.source->cached_.insert(m.source->cached_.end(), text.begin(), text.end());
      rows += chunk;
    }
    if (b.groups_.empty()) break;
    b.graph_.mixed(b.groups_, nullptr);
  }
  // Then one decode row per member and drafting step: the last committed token, then each draft but the last.
  const auto V = static_cast<size_t>(b.graph_.n_vocab());
  for (int64_t step = 0; !members.empty(); ++step) {
    b.tokens_.clear();
    b.caches_.clear();
    for (DraftModelBatch::Member& m : members) {
      const int32_t token = step == 0 ? m.committed.back() : m.out->tokens.back();
      b.tokens_.push_back(token);
      b.caches_.push_back(&m.source->session_.cache());
      m.source->cached_.push_back(token);
    }
    b.graph_.decode(b.tokens_, b.caches_, b.logits_.data());
    for (size_t i = 0; i < members.size(); ++i) {
      DraftModelBatch::Member& m = members[i];
      const auto n = static_cast<int64_t>(m.committed.size());
      // A draft the grammar ends or refuses here ends the member's proposal.
      if (!m.source->draw(std::span<const float>(b.logits_).subspan(i * V, V), n + step,
                          static_cast<size_t>(step), *m.out))
        m.depth = 0;
    }
    std::erase_if(members, [&](const DraftModelBatch::Member& m) { return step + 1 >= m.depth; });
  }
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
  if (tree_base_ >= 0) {
    // The committed text names the accepted path (siblings differ); keep its evaluated nodes.
    tree_.kept_path(committed, kept_);
    session_.cache().compact(tree_base_, kept_);
    cached_.assign(committed.begin(),
                   committed.begin() + tree_base_ + static_cast<std::ptrdiff_t>(kept_.size()));
    tree_base_ = -1;
  }
  roll_back_to(committed);
}

void DraftModelSource::propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth,
                                    Draft& out) {
  out.clear();
  tree_base_ = -1;
  if (committed.empty() || max_nodes < 1 || max_depth < 1) return;
  const auto n = static_cast<int64_t>(committed.size());
  if (n > session_.n_ctx()) return;
  roll_back_to(committed.first(static_cast<size_t>(n - 1)));
  const auto missing = committed.subspan(cached_.size());
  const std::span<const float> root = session_.eval(missing);
  cached_.insert(cached_.end(), missing.begin(), missing.end());
  tree_base_ = n;
  tree_.clear(n);
  history_.assign(committed.begin(), committed.end());
  tree_.add_children(-1, root, history_, tree_cover);

  for (int32_t level = 1; level < max_depth; ++level) {
    const std::span<const int32_t> picked =
        tree_.expand(level, max_nodes, tree_expand, session_.n_ctx() - tree_base_);
    if (picked.empty()) break;
    const int64_t first = tree_.slots() - static_cast<int64_t>(picked.size());
    const std::span<const float> logits =
        session_.eval_tree(tree_.slot_tokens().subspan(static_cast<size_t>(first)), tree_.mask());
    const auto V = static_cast<size_t>(session_.n_vocab());
    for (size_t r = 0; r < picked.size(); ++r) {
      // The candidate's path, for the penalties.
      tree_.path_text(picked[r], committed, history_);
      tree_.add_children(picked[r], logits.subspan(r * V, V), history_, tree_cover);
    }
  }
  tree_.propose(max_nodes, out);
}

}  // namespace tandem::speculative
