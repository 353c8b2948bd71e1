#include "tandem/tokenizer/special_tokens.h"

#include <algorithm>
#include <cctype>

namespace tandem::tokenizer {
namespace {

bool is_space(char c) {
  return std::isspace(static_cast<unsigned char>(c)) != 0;
}

}  // namespace

SpecialTokenSplitter::SpecialTokenSplitter(const Vocab& vocab) : vocab_(vocab) {
  root_.fill(-1);
  nodes_.emplace_back();
  for (size_t k = 0; k < vocab.special_tokens.size(); ++k) {
    std::string_view text = vocab.text(vocab.special_tokens[k]);
    int32_t node = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      auto byte = static_cast<uint8_t>(text[i]);
      int32_t child = -1;
      if (node == 0) {
        child = root_[byte];
      } else {
        auto& kids = nodes_[node].children;
        auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t(-1)));
        if (it != kids.end() && it->first == byte) child = it->second;
      }
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        if (node == 0) {
          root_[byte] = child;
        } else {
          auto& kids = nodes_[node].children;
          kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t(-1))),
                      {byte, child});
        }
      }
      node = child;
    }
    if (node != 0 && nodes_[node].special_index < 0) nodes_[node].special_index = static_cast<int32_t>(k);
  }
}

void SpecialTokenSplitter::find_candidates(std::string_view text, std::vector<uint8_t>& present) const {
  present.assign(vocab_.special_tokens.size(), 0);
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t node = root_[static_cast<uint8_t>(text[i])];
    for (size_t j = i + 1; node >= 0; ++j) {
      if (nodes_[node].special_index >= 0) present[nodes_[node].special_index] = 1;
      if (j >= text.size()) break;
      const auto& kids = nodes_[node].children;
      auto byte = static_cast<uint8_t>(text[j]);
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t(-1)));
      node = (it != kids.end() && it->first == byte) ? it->second : -1;
    }
  }
}

void SpecialTokenSplitter::split(std::string_view text, bool parse_special,
                                 std::vector<Fragment>& out) const {
  out.clear();
  if (text.empty()) return;
  out.push_back(Fragment{-1, 0, static_cast<uint32_t>(text.size())});
  if (vocab_.special_tokens.empty()) return;

  std::vector<uint8_t> present;
  find_candidates(text, present);
  std::vector<Fragment> next;
  for (size_t k = 0; k < vocab_.special_tokens.size(); ++k) {
    if (!present[k]) continue;
    const int32_t id = vocab_.special_tokens[k];
    const uint32_t attr = vocab_.attrs[id];
    if (!parse_special && (attr & (kAttrControl | kAttrUnknown))) continue;
    const std::string_view token = vocab_.text(id);

    next.clear();
    for (const Fragment& f : out) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.offset;
      const size_t end = size_t(f.offset) + f.length;
      bool split = false;
      while (true) {
        size_t match = text.substr(0, end).find(token, pos);
        if (match == std::string_view::npos) break;
        split = true;
        size_t left_end = match;
        if (attr & kAttrLstrip)
          while (left_end > pos && is_space(text[left_end - 1])) --left_end;
        if (left_end > pos)
          next.push_back(Fragment{-1, static_cast<uint32_t>(pos), static_cast<uint32_t>(left_end - pos)});
        next.push_back(Fragment{id, 0, 0});
        pos = match + token.size();
        if (attr & kAttrRstrip)
          while (pos < end && is_space(text[pos])) ++pos;
      }
      if (!split) {
        next.push_back(f);
      } else if (pos < end) {
        next.push_back(Fragment{-1, static_cast<uint32_t>(pos), static_cast<uint32_t>(end - pos)});
      }
    }
    out.swap(next);
  }
}

}  // namespace tandem::tokenizer
