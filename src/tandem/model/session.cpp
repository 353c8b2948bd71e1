#include "tandem/model/session.h"

#include <algorithm>

#include "tandem/util/error.h"

namespace tandem::model {

int64_t default_context(const Model& model, int64_t requested) {
  if (requested < 0) throw Error("context size (-c) must be positive");
  if (requested > 0) return requested;
  return std::min<int64_t>(model.config().n_ctx_train > 0 ? model.config().n_ctx_train : 4096, 4096);
}

Session::Session(const Model& model, ThreadPool& pool, const SessionOptions& options)
    : forward_(model, pool, std::max<int64_t>(1, options.batch)),
      cache_(model.config().kv_geometry(), default_context(model, options.n_ctx), options.kv_type,
             forward_.max_rows(), options.rollback ? cache::kDefaultRecurrentRollback : 0,
             options.verify_rows) {}

Session::Session(const Model& model, ThreadPool& pool, const SessionOptions& options, cache::KvStore& store)
    : forward_(model, pool, std::max<int64_t>(1, options.batch)),
      cache_(store, default_context(model, options.n_ctx)) {}

std::span<const float> Session::prefill(std::span<const int32_t> prompt) {
  if (prompt.empty()) throw Error("nothing to evaluate");
  cache_.truncate(0);
  prompt_reused_ = cache_.reuse_prefix(prompt);
  prompt_evaluated_ = static_cast<int64_t>(prompt.size()) - prompt_reused_;
  auto logits = eval(prompt.subspan(static_cast<size_t>(prompt_reused_)));
  cache_.publish(prompt);
  return logits;
}

std::span<const float> Session::eval(std::span<const int32_t> tokens, bool all_logits,
                                     const CaptureFn* capture) {
  return append(tokens, all_logits, capture, nullptr);
}

std::span<const float> Session::eval_tree(std::span<const int32_t> tokens, const cache::TreeMask& mask,
                                          const CaptureFn* capture) {
  if (mask.base > length() ||
      length() - mask.base + static_cast<int64_t>(tokens.size()) > static_cast<int64_t>(mask.parent.size()))
    throw Error("tree nodes " + std::to_string(length() - mask.base) + ".." +
                std::to_string(length() - mask.base + static_cast<int64_t>(tokens.size()) - 1) +
                " do not continue the cache within the tree of " + std::to_string(mask.parent.size()) +
                " nodes");
  const TreeRows tree{0, mask};
  return append(tokens, true, capture, &tree);
}

std::span<const float> Session::append(std::span<const int32_t> tokens, bool all_logits,
                                       const CaptureFn* capture, const TreeRows* tree) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t V = n_vocab();
  if (n == 0) throw Error("nothing to evaluate");
  if (length() + n > n_ctx())
    throw Error("the sequence needs " + std::to_string(length() + n) + " positions but the context holds " +
                std::to_string(n_ctx()) + "; pass a larger -c or a shorter prompt");
  const size_t need = static_cast<size_t>((all_logits ? n : 1) * V);
  if (logits_.size() < need) logits_.resize(need);
  cache::KvCache* caches[] = {&cache_};
  const int64_t chunk = forward_.max_rows();
  for (int64_t b = 0; b < n; b += chunk) {
    const int64_t e = std::min(n, b + chunk);
    rows_.clear();
    for (int64_t i = b; i < e; ++i)
      rows_.push_back({tokens[static_cast<size_t>(i)], length() + (i - b), 0, all_logits || i == n - 1});
    float* out = logits_.data() + (all_logits ? b * V : 0);
    forward_.run(rows_, caches, out, capture,
                 tree ? std::span<const TreeRows>(tree, 1) : std::span<const TreeRows>());
  }
  return {logits_.data(), need};
}

}  // namespace tandem::model
