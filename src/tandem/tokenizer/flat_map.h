// Open-addressing hash tables for the tokenizers' hot lookups (token text -> id, merge pair -> merge). They
// are filled once while loading and only read afterwards, so lookups are thread safe. Both keep the load
// factor at or below 1/2 and probe linearly.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace tandem::tokenizer {

inline uint64_t hash_bytes(std::string_view s) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = 0x243F6A8885A308D3ull ^ (s.size() * kMul);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

// Maps strings stored elsewhere (views that outlive the index) to int32 values.
class StringIndex {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
  }

  // Inserts key -> value unless the key is present; returns the value now stored for the key.
  int32_t insert(std::string_view key, int32_t value) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.value < 0) {
        s = Slot{key.data(), static_cast<uint32_t>(key.size()), static_cast<uint32_t>(h), value};
        ++size_;
        return value;
      }
      if (s.hash == static_cast<uint32_t>(h) && key == std::string_view(s.data, s.size)) return s.value;
    }
  }

  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    uint64_t h = hash_bytes(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value < 0) return -1;
      if (s.hash == static_cast<uint32_t>(h) && s.size == key.size() &&
          std::memcmp(s.data, key.data(), s.size) == 0)
        return s.value;
    }
  }

 private:
  struct Slot {
    const char* data = nullptr;
    uint32_t size = 0;
    uint32_t hash = 0;
    int32_t value = -1;  // -1: empty
  };
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    reserve(old.empty() ? 8 : old.size());
    size_ = 0;
    for (const Slot& s : old)
      if (s.value >= 0) insert(std::string_view(s.data, s.size), s.value);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

// Remembers the ids a piece of text was encoded to, for the duration of one encode call: text is split into
// words that repeat a lot, and each word encodes independently of the others. Keys are views into the text
// being encoded.
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 64;
  static constexpr size_t kMaxWords = 1 << 16;

  // Appends the cached ids of `word` to `out`; false when not cached.
  bool lookup(std::string_view word, std::vector<int32_t>& out) const {
    if (word.size() > kMaxWordBytes) return false;
    int32_t k = index_.find(word);
    if (k < 0) return false;
    const Entry& e = entries_[k];
    out.insert(out.end(), ids_.begin() + e.offset, ids_.begin() + e.offset + e.count);
    return true;
  }
  // Records that `word` encoded to out[from:].
  void store(std::string_view word, const std::vector<int32_t>& out, size_t from) {
    if (word.size() > kMaxWordBytes || entries_.size() >= kMaxWords) return;
    index_.insert(word, static_cast<int32_t>(entries_.size()));
    entries_.push_back(Entry{static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(out.size() - from)});
    ids_.insert(ids_.end(), out.begin() + static_cast<ptrdiff_t>(from), out.end());
  }

 private:
  struct Entry {
    uint32_t offset;
    uint32_t count;
  };
  StringIndex index_;
  std::vector<Entry> entries_;
  std::vector<int32_t> ids_;
};

// Maps a pair of non-negative int32 ids to a pair of int32 values.
class PairMap {
 public:
  struct Value {
    int32_t a = -1;
    int32_t b = -1;
  };

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, Value{});
    mask_ = cap - 1;
  }

  // Inserts unless present (the first value for a key wins).
  void insert(int32_t left, int32_t right, Value v) {
    if (2 * (size_ + 1) > keys_.size()) grow();
    uint64_t k = key(left, right);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (keys_[i] == k) return;
      if (keys_[i] == kEmpty) {
        keys_[i] = k;
        values_[i] = v;
        ++size_;
        return;
      }
    }
  }

  // nullptr when absent.
  const Value* find(int32_t left, int32_t right) const {
    if (keys_.empty()) return nullptr;
    uint64_t k = key(left, right);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (keys_[i] == k) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  size_t slot(uint64_t k) const { return ((k * 0x9E3779B97F4A7C15ull) >> 32) & mask_; }
  void grow() {
    std::vector<uint64_t> old_keys;
    std::vector<Value> old_values;
    old_keys.swap(keys_);
    old_values.swap(values_);
    reserve(old_keys.empty() ? 8 : old_keys.size());
    size_ = 0;
    for (size_t i = 0; i < old_keys.size(); ++i)
      if (old_keys[i] != kEmpty)
        insert(static_cast<int32_t>(old_keys[i] >> 32), static_cast<int32_t>(old_keys[i] & 0xFFFFFFFF),
               old_values[i]);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace tandem::tokenizer
