// A draft model: any GGUF checkpoint, of any architecture or size, whose vocabulary is the target's. It keeps
// its own cache of the committed text, drafts by running itself one token at a time (sampling from its own
// distribution after the target's sampler transforms when the temperature is above 0, else taking the
// argmax), and rolls its cache back to the accepted prefix after each round.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/model/graph.h"
#include "tandem/model/session.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/speculative/dynamic_tree.h"

namespace tandem::speculative {

// "" when the two files' token tables are identical: the same number of tokens, the same text and type for
// every id, and the same special-token ids (BOS, EOS, EOT, EOM, unknown, padding, separator, mask). Otherwise
// a sentence naming the first difference (the id and both values).
std::string vocabulary_difference(const gguf::File& target, const gguf::File& draft);

// Throws tandem::Error "the draft model's vocabulary differs from the target's: ..." when they differ,
// including a different number of output rows.
void check_same_vocabulary(const model::Model& target, const model::Model& draft);

class DraftModelSource;

// The draft model's batched forward, shared by the sources of a driver with several sequences
// (engine::Scheduler): sources made with one batch propose together (DraftSource::batch_group), each drafting
// step one decode row per sequence in one forward, and the text a sequence has not yet given its drafter is
// appended in forwards shared with the others. Rows are batch-invariant, so every sequence drafts exactly
// what it drafts alone. Used by one thread at a time.
class DraftModelBatch {
 public:
  // max_sequences: the most sources that propose together; max_rows: rows per forward (>= max_sequences).
  DraftModelBatch(const model::Model& draft, ThreadPool& pool, int max_sequences, int64_t max_rows = 64);

 private:
  friend class DraftModelSource;
  struct Member {
    DraftModelSource* source;
    std::span<const int32_t> committed;
    int64_t depth;
    Draft* out;
  };
  model::Graph graph_;
  int64_t max_rows_;
  std::vector<float> logits_;                  // [max_sequences, n_vocab]
  std::vector<Member> members_;                // [max_sequences]
  std::vector<int32_t> tokens_;                // [max_sequences]
  std::vector<cache::KvCache*> caches_;        // [max_sequences]
  std::vector<cache::KvCache*> group_caches_;  // [max_sequences], one per append group
  std::vector<model::Group> groups_;           // [max_sequences]
};

class DraftModelSource final : public DraftSource {
 public:
  // Checks the vocabularies. The draft runs on `pool` (shared with the target: the two never run at once)
  // with its own cache of options.n_ctx positions. `draft` must outlive the source, and `batch` (when not
  // null: the source proposes in batches with the others made with it) too.
  DraftModelSource(const model::Model& draft, const model::Model& target, ThreadPool& pool,
                   const model::SessionOptions& options, DraftModelBatch* batch = nullptr);

  std::string_view kind() const override { return "model"; }
  void begin(std::span<const int32_t> prompt, const DraftSettings& settings) override;
  void propose(std::span<const int32_t> committed, int max_depth, Draft& out) override;
  void accept(std::span<const int32_t> committed, int n_accepted) override;
  const void* batch_group() const override { return batch_; }
  // Every request's source is a DraftModelSource of this one's batch.
  void propose_batch(std::span<const DraftRequest> requests) override;

  // An EAGLE-2 style dynamic tree (dynamic_tree.h). Level by level, the frontier nodes (at most
  // tree_expand) of highest cumulative draft probability are evaluated in one draft forward, over the
  // draft's own cache with the tree attention mask; each evaluated node takes its most probable tokens as
  // children, as many as cover tree_cover of its distribution (at most tree_branch: one where the draft is
  // sure, more where it is not). The proposal is the max_nodes nodes of highest cumulative probability,
  // scored (Draft::score) and deterministic at any temperature. accept() moves the accepted path's rows of
  // the draft cache into place (KvCache::compact), recomputing nothing.
  void propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth, Draft& out) override;

  // The defaults took the most tokens per target forward on stories260K drafted by llama2xs at 8 and 16
  // nodes (docs/speculative.md): two children at most favour deep paths, which this pair's drafts need.
  int tree_branch = 2;      // children of one node, at most
  int tree_expand = 4;      // nodes one draft forward evaluates, at most
  float tree_cover = 0.8f;  // probability mass a node's children cover before the branch limit

  // Tokens now held by the draft cache (a prefix of the committed text plus, during a round, drafts).
  int64_t cached() const { return session_.length(); }

 private:
  // Rolls the cache back to its longest prefix shared with `text`.
  void roll_back_to(std::span<const int32_t> text);
  // `logits` with the tokens drafting_ refuses next at -inf, in masked_.
  std::span<const float> masked(std::span<const float> logits);

  // Samples draft `i` of a proposal for `position` from `logits` (under drafting_'s mask), appending it to
  // out and history_; false, appending nothing, where the grammar ends the proposal or refuses the sample.
  bool draw(std::span<const float> logits, int64_t position, size_t i, Draft& out);

  model::Session session_;
  DraftModelBatch* batch_;
  sampling::Sampler sampler_;
  DynamicTree tree_;  // the tree being drafted; its evaluated nodes follow tree_base_ in the draft cache
  int64_t tree_base_ = -1;  // -1: no tree in the draft cache
  std::vector<int32_t> kept_;
  uint64_t sequence_ = 0;
  std::vector<int32_t> cached_;   // tokens in the draft cache, cached_.size() == session_.length()
  std::vector<int32_t> history_;  // committed text plus this round's drafts, for the sampler's penalties
  const sampling::GrammarMatcher* grammar_ = nullptr;  // DraftSettings::grammar
  std::optional<sampling::GrammarMatcher> drafting_;   // grammar_ advanced through this round's drafts
  sampling::TokenMask mask_;
  std::vector<float> masked_;  // (n_vocab) a row under the grammar's mask
};

}  // namespace tandem::speculative
