// Byte-level context-free grammars for constrained sampling, and the automaton that matches text against
// them one byte at a time.
//
// A Grammar is a set of rules; each rule is a list of alternatives, each alternative a sequence of elements:
// a byte class (a set of byte values) or a reference to a rule. Text is matched as bytes, so a token that
// ends inside a UTF-8 sequence is handled like any other. The root rule must match the whole output.
// Left recursion (including through rules that can match the empty string) is refused when the grammar is
// built: the matcher expands rules top-down and would not terminate on it.
//
// GrammarStates matches bytes by tracking every parse the text so far allows: a set of stacks of grammar
// positions, the way an Earley or GLR recognizer without left recursion would. The sets are interned into
// numbered states and their byte transitions cached, so it becomes a DFA built lazily over the states that
// text actually reaches; a tail call (a reference that ends its alternative) does not grow the stack, so
// repetition written as right recursion (item rest | empty) reaches a fixed state.
#pragma once

#include <bitset>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tandem::sampling {

using ByteClass = std::bitset<256>;

// One element of an alternative.
struct GrammarElement {
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind;
  int32_t index;  // kBytes: index into Grammar::classes(); kRule: rule id; kEnd: the alternative's rule
};

class Grammar {
 public:
  struct Rule {
    std::string name;
    std::vector<int32_t> alternatives;  // start offsets into elements(); each runs up to a kEnd
  };

  int32_t root() const { return root_; }
  const std::vector<Rule>& rules() const { return rules_; }
  const std::vector<GrammarElement>& elements() const { return elements_; }
  const std::vector<ByteClass>& classes() const { return classes_; }

  // GBNF-like text, one rule per line (root first), for error messages, tests and documentation.
  std::string to_string() const;

 private:
  friend class GrammarBuilder;
  std::vector<Rule> rules_;
  std::vector<GrammarElement> elements_;
  std::vector<ByteClass> classes_;
  int32_t root_ = -1;
};

// Builds a Grammar. Rules are declared first (so that they may refer to each other, recursively) and given
// their alternatives afterwards.
class GrammarBuilder {
 public:
  using Sequence = std::vector<GrammarElement>;

  // Declares a rule; names need not be unique (they are only shown by to_string()).
  int32_t declare(std::string name);
  void add_alternative(int32_t rule, const Sequence& sequence);
  // declare() followed by add_alternative() for each of `alternatives`.
  int32_t rule(std::string name, const std::vector<Sequence>& alternatives);

  GrammarElement bytes(const ByteClass& set);
  GrammarElement byte_range(uint8_t first, uint8_t last);
  // Every byte of `text` in order, as one-byte classes.
  Sequence literal(std::string_view text);
  static GrammarElement ref(int32_t rule) { return {GrammarElement::Kind::kRule, rule}; }

  // A rule matching `item` repeated between min_count and max_count times (max_count < 0: unbounded).
  // `item` must not match the empty string (build() refuses the left recursion that would make). A bounded
  // repetition builds one rule per optional item, keeping the count in the parse state; throws tandem::Error
  // when min_count or max_count - min_count is above 100000, or when the counts (max_count, or min_count
  // when unbounded) of every repetition of this builder add up to more than 200000.
  int32_t repeat(std::string name, const Sequence& item, int64_t min_count, int64_t max_count);

  // Throws tandem::Error when a declared rule has no alternative, a reference names no rule, `root` is not
  // a rule, or rules recurse on the left (the message names the rules of the cycle).
  Grammar build(int32_t root) &&;

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<Sequence>> alternatives_;
  std::vector<ByteClass> classes_;
  std::unordered_map<std::string, int32_t> class_ids_;  // ByteClass::to_string() -> class index
  int64_t repeated_items_ = 0;                          // summed over repeat() calls
};

// The lazily built DFA over parse-stack sets of one grammar (see the file comment). States are numbered
// from 0; state ids stay valid for the object's lifetime. Not thread safe: transitions are computed and
// cached on first use, so one GrammarStates must be used by one thread at a time.
class GrammarStates {
 public:
  static constexpr int32_t kDead = -1;  // no parse survives

  explicit GrammarStates(const Grammar& grammar);  // borrows `grammar`, which must outlive it
  GrammarStates(const GrammarStates&) = delete;
  GrammarStates& operator=(const GrammarStates&) = delete;

  int32_t initial() const { return initial_; }
  // The state after `byte` from `state` (>= 0), or kDead.
  int32_t next(int32_t state, uint8_t byte) {
    const int32_t cached = transitions_[static_cast<size_t>(state) * 256 + byte];
    return cached != kUnknown ? cached : compute_next(state, byte);
  }
  // The state after `text`, or kDead.
  int32_t advance(int32_t state, std::string_view text);
  // Whether the text that led to `state` is a complete match of the root rule.
  bool accepting(int32_t state) const { return accepting_[static_cast<size_t>(state)] != 0; }
  size_t n_states() const { return accepting_.size(); }
  // Number of parse stacks the state tracks (a measure of the grammar's ambiguity at that point).
  size_t n_stacks(int32_t state) const;

 private:
  static constexpr int32_t kUnknown = -2;
  static constexpr int32_t kEmptyStack = 0;  // node id of the empty stack: the root rule is complete

  struct Node {
    int32_t position;  // index into grammar.elements(): the next element this parse expects
    int32_t parent;    // node id of the rest of the stack
  };

  int32_t compute_next(int32_t state, uint8_t byte);
  int32_t intern_node(int32_t position, int32_t parent);
  // Adds to `out` every stack reached from (position, parent) by expanding rule references and completing
  // finished alternatives, until each stack's top expects a byte class (or the stack is empty).
  void expand(int32_t position, int32_t parent, std::vector<int32_t>& out);
  void expand_rule(int32_t rule, int32_t parent, std::vector<int32_t>& out);
  int32_t intern_state(std::vector<int32_t>& stacks);  // sorts and dedupes `stacks`

  const Grammar& grammar_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;  // (position, parent) -> node id
  std::vector<int32_t> state_stacks_;               // node ids of every state's stacks, concatenated
  std::vector<uint32_t> state_offsets_;             // (n_states + 1) state i's stacks: [offsets[i], [i+1])
  std::unordered_map<std::string, int32_t> state_ids_;  // stacks' bytes -> state id
  std::vector<int32_t> transitions_;                    // (n_states, 256) next state, kDead or kUnknown
  std::vector<uint8_t> accepting_;                      // (n_states)
  std::vector<int32_t> scratch_;
  std::unordered_set<uint64_t> expanded_;  // (position, parent) pairs expanded by the current compute_next
  int32_t initial_ = kDead;
};

}  // namespace tandem::sampling
