#include "tandem/model/graph.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "tandem/util/error.h"

namespace tandem::model {

LayerTaps::LayerTaps(std::vector<int64_t> layers, int64_t n_embd)
    : layers_(std::move(layers)), n_embd_(n_embd) {
  copies_.resize(layers_.size());
  capture_ = [this](int64_t layer, const float* hidden, int64_t n_rows) {
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (layers_[i] != layer) continue;
      const size_t n = static_cast<size_t>(n_rows * n_embd_);
      if (copies_[i].size() < n) copies_[i].resize(n);
      std::memcpy(copies_[i].data(), hidden, n * sizeof(float));
      rows_ = n_rows;
    }
  };
}

Graph::Graph(const Model& model, ThreadPool& pool, const GraphOptions& options)
    : forward_(model, pool, std::max<int64_t>(options.max_rows, options.max_verify)), options_(options) {}

void Graph::prompt(std::span<const int32_t> tokens, cache::KvCache& cache, float* last_logits,
                   const CaptureFn* capture) {
  cache::KvCache* caches[] = {&cache};
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t b = 0; b < n; b += forward_.max_rows()) {
    const int64_t e = std::min(n, b + forward_.max_rows());
    rows_.clear();
    const int64_t pos0 = cache.length();
    for (int64_t i = b; i < e; ++i)
      rows_.push_back(
          {tokens[static_cast<size_t>(i)], pos0 + (i - b), 0, last_logits != nullptr && i == n - 1});
    forward_.run(rows_, caches, last_logits, capture);
  }
}

void Graph::decode(std::span<const int32_t> tokens, std::span<cache::KvCache* const> caches, float* logits) {
  TANDEM_CHECK(tokens.size() == caches.size(), "decode takes one token per sequence");
  rows_.clear();
  for (size_t i = 0; i < tokens.size(); ++i)
    rows_.push_back({tokens[i], caches[i]->length(), static_cast<int32_t>(i), true});
  forward_.run(rows_, caches, logits);
}

void Graph::verify(std::span<const int32_t> tokens, cache::KvCache& cache, float* logits,
                   const CaptureFn* capture) {
  if (static_cast<int64_t>(tokens.size()) > options_.max_verify)
    throw Error("a verify window of " + std::to_string(tokens.size()) + " rows exceeds the graph's widest (" +
                std::to_string(options_.max_verify) + "); raise GraphOptions::max_verify");
  cache::KvCache* caches[] = {&cache};
  rows_.clear();
  const int64_t pos0 = cache.length();
  for (size_t i = 0; i < tokens.size(); ++i)
    rows_.push_back({tokens[i], pos0 + static_cast<int64_t>(i), 0, true});
  forward_.run(rows_, caches, logits, capture);
}

void Graph::append_known(std::span<const int32_t> tokens, cache::KvCache& cache) {
  prompt(tokens, cache, nullptr, nullptr);
}

void Graph::logits(const float* hidden, int64_t n, float* out) {
  forward_.head(hidden, n, out);
}

int64_t Graph::mixed(std::span<const Group> groups, float* logits) {
  rows_.clear();
  caches_.clear();
  spans_.clear();
  trees_.clear();
  auto& spans = spans_;
  for (const Group& g : groups) {
    const int64_t first = static_cast<int64_t>(rows_.size());
    if (g.phase == Phase::kDecode) {
      TANDEM_CHECK(g.tokens.size() == g.caches.size(), "a decode group takes one token per sequence");
      for (size_t i = 0; i < g.tokens.size(); ++i) {
        caches_.push_back(g.caches[i]);
        rows_.push_back({g.tokens[i], g.caches[i]->length(), static_cast<int32_t>(caches_.size() - 1), true});
      }
    } else {
      TANDEM_CHECK(g.caches.size() == 1, "prompt, verify and append groups run over exactly one cache");
      caches_.push_back(g.caches[0]);
      const auto seq = static_cast<int32_t>(caches_.size() - 1);
      const int64_t pos0 = g.caches[0]->length();
      if (g.tree) {
        if (g.phase != Phase::kVerify) throw Error("only a verify group may carry a token tree");
        if (g.tree->base != pos0 || g.tokens.size() > g.tree->parent.size())
          throw Error("a verify group's token tree must start at its cache's length (" +
                      std::to_string(pos0) + ", not " + std::to_string(g.tree->base) +
                      ") and hold a node per row");
        trees_.push_back({seq, *g.tree});
      }
      for (size_t i = 0; i < g.tokens.size(); ++i) {
        const bool want =
            g.phase == Phase::kVerify || (g.phase == Phase::kPrompt && i + 1 == g.tokens.size());
        rows_.push_back({g.tokens[i], pos0 + static_cast<int64_t>(i), seq, want});
      }
    }
    spans.push_back({first, static_cast<int64_t>(rows_.size()) - first, g.capture});
  }
  if (static_cast<int64_t>(rows_.size()) > forward_.max_rows())
    throw Error("a mixed forward of " + std::to_string(rows_.size()) +
                " rows exceeds the graph's capacity of " + std::to_string(forward_.max_rows()));
  const bool any_capture =
      std::any_of(spans.begin(), spans.end(), [](const GroupSpan& s) { return s.capture != nullptr; });
  const int64_t n_embd = model().config().n_embd;
  CaptureFn split = [&](int64_t layer, const float* hidden, int64_t) {
    for (const GroupSpan& s : spans)
      if (s.capture) (*s.capture)(layer, hidden + s.first * n_embd, s.count);
  };
  forward_.run(rows_, caches_, logits, any_capture ? &split : nullptr, trees_);
  int64_t n_logits = 0;
  for (const Row& r : rows_) n_logits += r.logits ? 1 : 0;
  return n_logits;
}

}  // namespace tandem::model
