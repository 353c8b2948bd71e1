#include "tandem/sampling/grammar.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "tandem/util/error.h"

namespace tandem::sampling {

namespace {

constexpr int64_t kMaxRepeatRules = 100000;
// All bounded repetitions of one grammar together: each counted item costs rules, so a small schema with many
// large bounds (maxLength, maxItems) must not build a grammar of gigabytes.
constexpr int64_t kMaxRepeatTotal = 2 * kMaxRepeatRules;

void append_byte(std::string& out, int byte, bool in_class) {
  static const char* kHex = "0123456789ABCDEF";
  if (byte == '\n') {
    out += "\\n";
  } else if (byte == '\t') {
    out += "\\t";
  } else if (byte == '\r') {
    out += "\\r";
  } else if (byte == '\\' || (in_class && (byte == ']' || byte == '-' || byte == '^')) ||
             (!in_class && byte == '"')) {
    out += '\\';
    out += static_cast<char>(byte);
  } else if (byte >= 0x20 && byte < 0x7F) {
    out += static_cast<char>(byte);
  } else {
    out += "\\x";
    out += kHex[byte >> 4];
    out += kHex[byte & 15];
  }
}

std::string class_text(const ByteClass& set) {
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!set[static_cast<size_t>(b)]) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && set[static_cast<size_t>(e + 1)]) ++e;
    append_byte(out, b, true);
    if (e > b) {
      if (e > b + 1) out += '-';
      append_byte(out, e, true);
    }
    b = e + 1;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::to_string() const {
  std::ostringstream out;
  std::vector<int32_t> order;
  order.push_back(root_);
  for (int32_t r = 0; r < static_cast<int32_t>(rules_.size()); ++r)
    if (r != root_) order.push_back(r);
  for (int32_t r : order) {
    out << rules_[static_cast<size_t>(r)].name << "#" << r << " ::=";
    bool first_alt = true;
    for (int32_t start : rules_[static_cast<size_t>(r)].alternatives) {
      out << (first_alt ? " " : " | ");
      first_alt = false;
      std::string literal;
      bool empty = true;
      auto flush = [&] {
        if (literal.empty()) return;
        out << (empty ? "" : " ") << '"' << literal << '"';
        literal.clear();
        empty = false;
      };
      for (int32_t i = start; elements_[static_cast<size_t>(i)].kind != GrammarElement::Kind::kEnd; ++i) {
        const GrammarElement& e = elements_[static_cast<size_t>(i)];
        if (e.kind == GrammarElement::Kind::kBytes) {
          const ByteClass& set = classes_[static_cast<size_t>(e.index)];
          if (set.count() == 1) {
            int b = 0;
            while (!set[static_cast<size_t>(b)]) ++b;
            append_byte(literal, b, false);
            continue;
          }
          flush();
          out << (empty ? "" : " ") << class_text(set);
        } else {
          flush();
          out << (empty ? "" : " ") << rules_[static_cast<size_t>(e.index)].name << "#" << e.index;
        }
        empty = false;
      }
      flush();
      if (empty) out << "\"\"";
    }
    out << "\n";
  }
  return out.str();
}

int32_t GrammarBuilder::declare(std::string name) {
  names_.push_back(std::move(name));
  alternatives_.emplace_back();
  return static_cast<int32_t>(names_.size() - 1);
}

void GrammarBuilder::add_alternative(int32_t rule, const Sequence& sequence) {
  TANDEM_CHECK(rule >= 0 && static_cast<size_t>(rule) < alternatives_.size(), "no such grammar rule");
  alternatives_[static_cast<size_t>(rule)].push_back(sequence);
}

int32_t GrammarBuilder::rule(std::string name, const std::vector<Sequence>& alternatives) {
  const int32_t id = declare(std::move(name));
  for (const Sequence& s : alternatives) add_alternative(id, s);
  return id;
}

GrammarElement GrammarBuilder::bytes(const ByteClass& set) {
  auto [it, inserted] = class_ids_.emplace(set.to_string(), static_cast<int32_t>(classes_.size()));
  if (inserted) classes_.push_back(set);
  return {GrammarElement::Kind::kBytes, it->second};
}

GrammarElement GrammarBuilder::byte_range(uint8_t first, uint8_t last) {
  ByteClass set;
  for (int b = first; b <= last; ++b) set.set(static_cast<size_t>(b));
  return bytes(set);
}

GrammarBuilder::Sequence GrammarBuilder::literal(std::string_view text) {
  Sequence out;
  for (char c : text) {
    const auto b = static_cast<uint8_t>(c);
    out.push_back(byte_range(b, b));
  }
  return out;
}

int32_t GrammarBuilder::repeat(std::string name, const Sequence& item, int64_t min_count, int64_t max_count) {
  if (max_count >= 0 && max_count - min_count > kMaxRepeatRules) {
    throw Error("a repetition of " + name + " allows " + std::to_string(min_count) + " to " +
                std::to_string(max_count) + " items; constrained output supports a range of at most " +
                std::to_string(kMaxRepeatRules));
  }
  if (min_count > kMaxRepeatRules) {
    throw Error("a repetition of " + name + " needs at least " + std::to_string(min_count) +
                " items; constrained output supports at most " + std::to_string(kMaxRepeatRules));
  }
  const int64_t items = std::max<int64_t>(min_count, max_count);
  if (repeated_items_ + items > kMaxRepeatTotal)
    throw Error("the repetitions of this grammar add up to more than " + std::to_string(kMaxRepeatTotal) +
                " counted items (" + name + " brings " + std::to_string(items) +
                "); constrained output supports at most that in all: lower the bounds (maxLength, maxItems, "
                "minItems)");
  repeated_items_ += items;
  // The optional tail: unbounded as tail = item tail | empty; bounded as a chain of max - min nested
  // optional items, so that the count is kept in the grammar state.
  int32_t tail;
  if (max_count < 0) {
    tail = declare(name + "-rest");
    Sequence more = item;
    more.push_back(ref(tail));
    add_alternative(tail, more);
    add_alternative(tail, {});
  } else {
    tail = rule(name + "-rest", {{}});
    for (int64_t k = min_count; k < max_count; ++k) {
      Sequence more = item;
      more.push_back(ref(tail));
      tail = rule(name + "-rest", {{}, more});
    }
  }
  Sequence body;
  for (int64_t k = 0; k < min_count; ++k) body.insert(body.end(), item.begin(), item.end());
  body.push_back(ref(tail));
  return rule(std::move(name), {body});
}

Grammar GrammarBuilder::build(int32_t root) && {
  const size_t n = names_.size();
  if (root < 0 || static_cast<size_t>(root) >= n) throw Error("grammar root is not a declared rule");
  for (size_t r = 0; r < n; ++r) {
    if (alternatives_[r].empty()) throw Error("grammar rule " + names_[r] + " has no alternative");
    for (const Sequence& alt : alternatives_[r])
      for (const GrammarElement& e : alt)
        if (e.kind == GrammarElement::Kind::kRule && (e.index < 0 || static_cast<size_t>(e.index) >= n))
          throw Error("grammar rule " + names_[r] + " refers to an undeclared rule");
  }

  // Rules that can match the empty string, to a fixed point.
  std::vector<uint8_t> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& alt : alternatives_[r]) {
        const bool all = std::all_of(alt.begin(), alt.end(), [&](const GrammarElement& e) {
          return e.kind == GrammarElement::Kind::kRule && nullable[static_cast<size_t>(e.index)];
        });
        if (all) {
          nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  // Left corners: r -> s when s can start r without a byte consumed before it. A cycle is left recursion.
  std::vector<std::vector<int32_t>> corners(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence& alt : alternatives_[r]) {
      for (const GrammarElement& e : alt) {
        if (e.kind != GrammarElement::Kind::kRule) break;
        corners[r].push_back(e.index);
        if (!nullable[static_cast<size_t>(e.index)]) break;
      }
    }
  }
  std::vector<uint8_t> color(n, 0);  // 0 unvisited, 1 on the path, 2 done
  std::vector<int32_t> path;
  std::vector<std::pair<int32_t, size_t>> stack;
  for (size_t start = 0; start < n; ++start) {
    if (color[start]) continue;
    stack.push_back({static_cast<int32_t>(start), 0});
    color[start] = 1;
    path.push_back(static_cast<int32_t>(start));
    while (!stack.empty()) {
      auto& [r, next] = stack.back();
      const auto& out = corners[static_cast<size_t>(r)];
      if (next == out.size()) {
        color[static_cast<size_t>(r)] = 2;
        path.pop_back();
        stack.pop_back();
        continue;
      }
      const int32_t s = out[next++];
      if (color[static_cast<size_t>(s)] == 1) {
        std::string cycle;
        auto it = std::find(path.begin(), path.end(), s);
        for (; it != path.end(); ++it) cycle += names_[static_cast<size_t>(*it)] + " -> ";
        throw Error("grammar is left-recursive (" + cycle + names_[static_cast<size_t>(s)] +
                    "); rewrite the repetition with the recursion on the right");
      }
      if (color[static_cast<size_t>(s)] == 0) {
        color[static_cast<size_t>(s)] = 1;
        path.push_back(s);
        stack.push_back({s, 0});
      }
    }
  }

  Grammar g;
  g.root_ = root;
  g.classes_ = std::move(classes_);
  g.rules_.resize(n);
  for (size_t r = 0; r < n; ++r) {
    g.rules_[r].name = std::move(names_[r]);
    for (const Sequence& alt : alternatives_[r]) {
      g.rules_[r].alternatives.push_back(static_cast<int32_t>(g.elements_.size()));
      g.elements_.insert(g.elements_.end(), alt.begin(), alt.end());
      g.elements_.push_back({GrammarElement::Kind::kEnd, static_cast<int32_t>(r)});
    }
  }
  return g;
}

GrammarStates::GrammarStates(const Grammar& grammar) : grammar_(grammar) {
  nodes_.push_back({-1, -1});  // kEmptyStack
  state_offsets_.push_back(0);
  scratch_.clear();
  expanded_.clear();
  expand_rule(grammar_.root(), kEmptyStack, scratch_);
  initial_ = intern_state(scratch_);
}

int32_t GrammarStates::intern_node(int32_t position, int32_t parent) {
  // A reference that ends its alternative returns straight to the caller's caller (a tail call).
  if (grammar_.elements()[static_cast<size_t>(position)].kind == GrammarElement::Kind::kEnd) return parent;
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(position)) << 32) | static_cast<uint32_t>(parent);
  auto [it, inserted] = node_ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({position, parent});
  return it->second;
}

void GrammarStates::expand_rule(int32_t rule, int32_t parent, std::vector<int32_t>& out) {
  for (int32_t start : grammar_.rules()[static_cast<size_t>(rule)].alternatives) expand(start, parent, out);
}

void GrammarStates::expand(int32_t position, int32_t parent, std::vector<int32_t>& out) {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(position)) << 32) | static_cast<uint32_t>(parent);
  if (!expanded_.insert(key).second) return;
  const GrammarElement& e = grammar_.elements()[static_cast<size_t>(position)];
  switch (e.kind) {
    case GrammarElement::Kind::kBytes:
      out.push_back(intern_node(position, parent));
      break;
    case GrammarElement::Kind::kRule:
      expand_rule(e.index, intern_node(position + 1, parent), out);
      break;
    case GrammarElement::Kind::kEnd:
      if (parent == kEmptyStack) {
        out.push_back(kEmptyStack);
      } else {
        const Node caller = nodes_[static_cast<size_t>(parent)];
        expand(caller.position, caller.parent, out);
      }
      break;
  }
}

int32_t GrammarStates::intern_state(std::vector<int32_t>& stacks) {
  if (stacks.empty()) return kDead;
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  std::string key(stacks.size() * sizeof(int32_t), '\0');
  std::memcpy(key.data(), stacks.data(), key.size());
  auto [it, inserted] = state_ids_.emplace(std::move(key), static_cast<int32_t>(accepting_.size()));
  if (!inserted) return it->second;
  state_stacks_.insert(state_stacks_.end(), stacks.begin(), stacks.end());
  state_offsets_.push_back(static_cast<uint32_t>(state_stacks_.size()));
  accepting_.push_back(stacks.front() == kEmptyStack ? 1 : 0);
  transitions_.resize(transitions_.size() + 256, kUnknown);
  return it->second;
}

int32_t GrammarStates::compute_next(int32_t state, uint8_t byte) {
  scratch_.clear();
  expanded_.clear();
  const uint32_t begin = state_offsets_[static_cast<size_t>(state)];
  const uint32_t end = state_offsets_[static_cast<size_t>(state) + 1];
  for (uint32_t i = begin; i < end; ++i) {
    const int32_t node_id = state_stacks_[i];
    if (node_id == kEmptyStack) continue;
    const Node node = nodes_[static_cast<size_t>(node_id)];
    const GrammarElement& e = grammar_.elements()[static_cast<size_t>(node.position)];
    if (grammar_.classes()[static_cast<size_t>(e.index)][byte])
      expand(node.position + 1, node.parent, scratch_);
  }
  const int32_t next_state = intern_state(scratch_);
  transitions_[static_cast<size_t>(state) * 256 + byte] = next_state;
  return next_state;
}

int32_t GrammarStates::advance(int32_t state, std::string_view text) {
  for (char c : text) {
    if (state < 0) return kDead;
    state = next(state, static_cast<uint8_t>(c));
  }
  return state;
}

size_t GrammarStates::n_stacks(int32_t state) const {
  return state_offsets_[static_cast<size_t>(state) + 1] - state_offsets_[static_cast<size_t>(state)];
}

}  // namespace tandem::sampling
