// A draft model: any GGUF checkpoint, of any architecture or size, whose vocabulary is the target's. It keeps
// its own cache of the committed text, drafts by running itself one token at a time (sampling from its own
// distribution after the target's sampler transforms when the temperature is above 0, else taking the
// argmax), and rolls its cache back to the accepted prefix after each round.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/model/session.h"
#include "tandem/speculative/draft_source.h"

namespace tandem::speculative {

// "" when the two files' token tables are identical: the same number of tokens, the same text and type for
// every id, and the same special-token ids (BOS, EOS, EOT, EOM, unknown, padding, separator, mask). Otherwise
// a sentence naming the first difference (the id and both values).
std::string vocabulary_difference(const gguf::File& target, const gguf::File& draft);

// Throws tandem::Error "the draft model's vocabulary differs from the target's: ..." when they differ,
// including a different number of output rows.
void check_same_vocabulary(const model::Model& target, const model::Model& draft);

class DraftModelSource final : public DraftSource {
 public:
  // Checks the vocabularies. The draft runs on `pool` (shared with the target: the two never run at once)
  // with its own cache of options.n_ctx positions. `draft` must outlive the source.
  DraftModelSource(const model::Model& draft, const model::Model& target, ThreadPool& pool,
                   const model::SessionOptions& options);

  std::string_view kind() const override { return "model"; }
  void begin(std::span<const int32_t> prompt, const DraftSettings& settings) override;
  void propose(std::span<const int32_t> committed, int max_depth, Draft& out) override;
  void accept(std::span<const int32_t> committed, int n_accepted) override;

  // Tokens now held by the draft cache (a prefix of the committed text plus, during a round, drafts).
  int64_t cached() const { return session_.length(); }

 private:
  // Rolls the cache back to its longest prefix shared with `text`.
  void roll_back_to(std::span<const int32_t> text);
  // `logits` with the tokens drafting_ refuses next at -inf, in masked_.
  std::span<const float> masked(std::span<const float> logits);

  model::Session session_;
  sampling::Sampler sampler_;
  uint64_t sequence_ = 0;
  std::vector<int32_t> cached_;   // tokens in the draft cache, cached_.size() == session_.length()
  std::vector<int32_t> history_;  // committed text plus this round's drafts, for the sampler's penalties
  const sampling::GrammarMatcher* grammar_ = nullptr;  // DraftSettings::grammar
  std::optional<sampling::GrammarMatcher> drafting_;   // grammar_ advanced through this round's drafts
  sampling::TokenMask mask_;
  std::vector<float> masked_;  // (n_vocab) a row under the grammar's mask
};

}  // namespace tandem::speculative
