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
      sampler_(sampling::Params{}),
      ranker_(sampling::Params{}),
      scorer_(sampling::Params{}) {}

void DraftModelSource::begin(std::span<const int32_t> prompt, const DraftSettings& settings) {
  sampler_ = sampling::Sampler(settings.sampling);
  sampling::Params rank = settings.sampling;
  rank.temperature = 1.0f;
  rank.top_k = std::max(1, tree_branch);
  rank.top_p = 1.0f;
  rank.min_p = 0.0f;
  ranker_ = sampling::Sampler(rank);
  rank.top_k = 0;
  scorer_ = sampling::Sampler(rank);
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
    kept_.clear();
    int32_t at = -1;
    for (auto pos = static_cast<size_t>(tree_base_); pos < committed.size(); ++pos) {
      int32_t next = -1;
      for (size_t i = 0; i < tree_tokens_.size() && next < 0; ++i)
        if (tree_parent_[i] == at && tree_tokens_[i] == committed[pos]) next = static_cast<int32_t>(i);
      if (next < 0) break;
      kept_.push_back(next);
      at = next;
    }
    session_.cache().compact(tree_base_, kept_);
    cached_.assign(committed.begin(),
                   committed.begin() + tree_base_ + static_cast<std::ptrdiff_t>(kept_.size()));
    tree_base_ = -1;
  }
  roll_back_to(committed);
}

void DraftModelSource::add_children(int32_t parent, std::span<const float> logits) {
  ranker_.distribution(logits, history_, ranked_);
  order_.resize(ranked_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int32_t>(i);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    const float pa = ranked_.probs[static_cast<size_t>(a)], pb = ranked_.probs[static_cast<size_t>(b)];
    return pa != pb ? pa > pb : a < b;
  });
  scorer_.distribution(logits, history_, scored_);
  const float base = parent < 0 ? 0.0f : candidates_[static_cast<size_t>(parent)].logp;
  const float score = parent < 0 ? 1.0f : candidates_[static_cast<size_t>(parent)].score;
  const int32_t depth = parent < 0 ? 1 : candidates_[static_cast<size_t>(parent)].depth + 1;
  float covered = 0.0f;
  for (size_t k = 0; k < order_.size() && static_cast<int>(k) < tree_branch; ++k) {
    if (k > 0 && covered >= tree_cover) break;
    const auto i = static_cast<size_t>(order_[k]);
    covered += ranked_.probs[i];
    candidates_.push_back({ranked_.ids[i], parent, depth, -1, base + std::log(ranked_.probs[i]),
                           score * scored_.prob_of(ranked_.ids[i])});
  }
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
  tree_tokens_.clear();
  tree_parent_.clear();
  tree_depth_.clear();
  candidates_.clear();
  history_.assign(committed.begin(), committed.end());
  add_children(-1, root);

  for (int32_t level = 1; level < max_depth; ++level) {
    // Nodes below the max_nodes-th best cumulative probability cannot enter the proposal, nor can their
    // descendants: they are not expanded.
    float bar = -INFINITY;
    if (static_cast<int>(candidates_.size()) >= max_nodes) {
      logps_.clear();
      for (const Candidate& c : candidates_) logps_.push_back(c.logp);
      std::nth_element(logps_.begin(), logps_.begin() + (max_nodes - 1), logps_.end(), std::greater<float>());
      bar = logps_[static_cast<size_t>(max_nodes - 1)];
    }
    picked_.clear();
    for (size_t i = 0; i < candidates_.size(); ++i)
      if (candidates_[i].depth == level && candidates_[i].logp >= bar)
        picked_.push_back(static_cast<int32_t>(i));
    std::sort(picked_.begin(), picked_.end(), [&](int32_t a, int32_t b) {
      const float la = candidates_[static_cast<size_t>(a)].logp,
                  lb = candidates_[static_cast<size_t>(b)].logp;
      return la != lb ? la > lb : a < b;
    });
    if (static_cast<int>(picked_.size()) > tree_expand)
      picked_.resize(static_cast<size_t>(std::max(1, tree_expand)));
    const auto first = static_cast<int64_t>(tree_tokens_.size());
    if (picked_.empty() || tree_base_ + first + static_cast<int64_t>(picked_.size()) > session_.n_ctx())
      break;
    std::sort(picked_.begin(), picked_.end());  // parents before children in the cache's tree
    for (int32_t i : picked_) {
      Candidate& c = candidates_[static_cast<size_t>(i)];
      c.slot = static_cast<int32_t>(tree_tokens_.size());
      const int32_t parent_slot = c.parent < 0 ? -1 : candidates_[static_cast<size_t>(c.parent)].slot;
      tree_tokens_.push_back(c.token);
      tree_parent_.push_back(parent_slot);
      tree_depth_.push_back(c.depth - 1);
    }
    const std::span<const float> logits =
        session_.eval_tree(std::span<const int32_t>(tree_tokens_).subspan(static_cast<size_t>(first)),
                           cache::TreeMask{tree_base_, tree_parent_, tree_depth_});
    const auto V = static_cast<size_t>(session_.n_vocab());
    for (size_t r = 0; r < picked_.size(); ++r) {
      // The candidate's path, for the penalties.
      history_.assign(committed.begin(), committed.end());
      const size_t at = history_.size();
      for (int32_t c = picked_[r]; c >= 0; c = candidates_[static_cast<size_t>(c)].parent)
        history_.push_back(candidates_[static_cast<size_t>(c)].token);
      std::reverse(history_.begin() + static_cast<std::ptrdiff_t>(at), history_.end());
      add_children(picked_[r], logits.subspan(r * V, V));
    }
  }

  order_.resize(candidates_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int32_t>(i);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    const float la = candidates_[static_cast<size_t>(a)].logp, lb = candidates_[static_cast<size_t>(b)].logp;
    return la != lb ? la > lb : a < b;
  });
  if (static_cast<int>(order_.size()) > max_nodes) order_.resize(static_cast<size_t>(max_nodes));
  std::sort(order_.begin(), order_.end());
  node_of_.assign(candidates_.size(), -1);
  for (int32_t i : order_) {
    const Candidate& c = candidates_[static_cast<size_t>(i)];
    const int32_t parent = c.parent < 0 ? -1 : node_of_[static_cast<size_t>(c.parent)];
    TANDEM_CHECK(c.parent < 0 || parent >= 0, "a drafted tree node without its parent");
    node_of_[static_cast<size_t>(i)] = out.tree.add(parent);
    out.tokens.push_back(c.token);
    out.score.push_back(c.score);
  }
}

}  // namespace tandem::speculative
