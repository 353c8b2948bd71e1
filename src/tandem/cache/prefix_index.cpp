#include "tandem/cache/prefix_index.h"

#include <algorithm>

#include "tandem/util/error.h"

namespace tandem::cache {

namespace {
uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 33);
}
}  // namespace

PrefixIndex::PrefixIndex(BlockPool& full, BlockPool* sliding) : full_(full), sliding_(sliding) {}

uint64_t PrefixIndex::key_of(uint64_t parent, std::span<const int32_t> tokens) const {
  uint64_t h = mix(parent + 0x9E3779B97F4A7C15ull);
  for (int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

int32_t PrefixIndex::find(uint64_t parent, std::span<const int32_t> tokens) const {
  auto [b, e] = by_key_.equal_range(key_of(parent, tokens));
  for (auto it = b; it != e; ++it) {
    const Entry& en = entries_[static_cast<size_t>(it->second)];
    if (en.parent == parent && std::equal(tokens.begin(), tokens.end(), en.tokens.begin(), en.tokens.end()))
      return it->second;
  }
  return -1;
}

void PrefixIndex::match(std::span<const int32_t> tokens, std::vector<Match>& out) {
  out.clear();
  const auto B = static_cast<size_t>(block_size());
  uint64_t parent = 0;
  for (size_t at = 0; at + B <= tokens.size(); at += B) {
    const int32_t slot = find(parent, tokens.subspan(at, B));
    if (slot < 0) break;
    const Entry& en = entries_[static_cast<size_t>(slot)];
    out.push_back({en.serial, en.full, en.sliding});
    parent = en.serial;
  }
  // Deeper blocks get older stamps, so leaves are evicted before the prefixes they extend.
  const uint64_t n = out.size();
  for (uint64_t i = 0; i < n; ++i)
    entries_[static_cast<size_t>(by_serial_.at(out[i].serial))].stamp = clock_ + n - i;
  clock_ += n + 1;
}

uint64_t PrefixIndex::insert(uint64_t parent, std::span<const int32_t> tokens, int32_t full,
                             int32_t sliding) {
  TANDEM_CHECK(static_cast<int64_t>(tokens.size()) == block_size(), "prefix entries hold one full block");
  TANDEM_CHECK(full >= 0, "a prefix entry needs its full-attention block");
  const int32_t existing = find(parent, tokens);
  if (existing >= 0) {
    Entry& en = entries_[static_cast<size_t>(existing)];
    if (en.sliding < 0 && sliding >= 0 && sliding_) {
      sliding_->retain(sliding);
      en.sliding = sliding;
    }
    en.stamp = ++clock_;
    return en.serial;
  }
  int32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<int32_t>(entries_.size());
    entries_.emplace_back();
  }
  Entry& en = entries_[static_cast<size_t>(slot)];
  en.serial = next_serial_++;
  en.parent = parent;
  en.key = key_of(parent, tokens);
  en.stamp = ++clock_;
  en.full = full;
  en.sliding = sliding_ ? sliding : -1;
  en.children = 0;
  en.tokens.assign(tokens.begin(), tokens.end());
  full_.retain(full);
  if (en.sliding >= 0) sliding_->retain(en.sliding);
  by_key_.emplace(en.key, slot);
  by_serial_.emplace(en.serial, slot);
  if (auto it = by_serial_.find(parent); it != by_serial_.end())
    ++entries_[static_cast<size_t>(it->second)].children;
  return en.serial;
}

void PrefixIndex::remove(int32_t slot) {
  Entry& en = entries_[static_cast<size_t>(slot)];
  auto [b, e] = by_key_.equal_range(en.key);
  for (auto it = b; it != e; ++it)
    if (it->second == slot) {
      by_key_.erase(it);
      break;
    }
  by_serial_.erase(en.serial);
  if (auto it = by_serial_.find(en.parent); it != by_serial_.end())
    --entries_[static_cast<size_t>(it->second)].children;
  full_.release(en.full);
  if (en.sliding >= 0) sliding_->release(en.sliding);
  en = Entry{};
  free_slots_.push_back(slot);
}

bool PrefixIndex::evict_for(bool sliding_pool) {
  int32_t best = -1;
  for (const auto& [serial, slot] : by_serial_) {
    const Entry& en = entries_[static_cast<size_t>(slot)];
    const bool ok = sliding_pool ? (en.sliding >= 0 && sliding_->refs(en.sliding) == 1)
                                 : (en.children == 0 && full_.refs(en.full) == 1);
    if (ok && (best < 0 || en.stamp < entries_[static_cast<size_t>(best)].stamp)) best = slot;
  }
  if (best < 0) return false;
  if (sliding_pool) {
    Entry& en = entries_[static_cast<size_t>(best)];
    sliding_->release(en.sliding);
    en.sliding = -1;
  } else {
    remove(best);
  }
  return true;
}

}  // namespace tandem::cache
