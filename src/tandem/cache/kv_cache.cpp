#include "tandem/cache/kv_cache.h"

#include <cstring>

#include "tandem/tensor/fp16.h"
#include "tandem/util/error.h"

namespace tandem::cache {

KvType kv_type_from_name(std::string_view name) {
  if (name == "f32") return KvType::kF32;
  if (name == "f16") return KvType::kF16;
  throw Error("unknown KV cache type '" + std::string(name) + "' (expected f16 or f32)");
}

std::string_view kv_type_name(KvType t) { return t == KvType::kF16 ? "f16" : "f32"; }

KvCache::KvCache(const model::Config& c, int64_t capacity, KvType type)
    : n_head_kv_(c.n_head_kv), head_dim_(c.head_dim), head_dim_v_(c.head_dim_v), capacity_(capacity), type_(type) {
  if (capacity <= 0) throw Error("context size must be positive");
  k_.resize(static_cast<size_t>(c.n_layer));
  v_.resize(static_cast<size_t>(c.n_layer));
  for (auto& k : k_) k.resize(static_cast<size_t>(n_head_kv_ * capacity_ * head_dim_) * elem_size());
  for (auto& v : v_) v.resize(static_cast<size_t>(n_head_kv_ * capacity_ * head_dim_v_) * elem_size());
}

size_t KvCache::bytes_per_token() const {
  return k_.size() * static_cast<size_t>(n_head_kv_ * (head_dim_ + head_dim_v_)) * elem_size();
}

void KvCache::truncate(int64_t n) {
  TANDEM_CHECK(n >= 0 && n <= length_, "truncate past the cache length");
  length_ = n;
}

void KvCache::set_length(int64_t n) {
  TANDEM_CHECK(n >= 0 && n <= capacity_, "cache length past capacity");
  length_ = n;
}

namespace {
void put(uint8_t* dst, const float* src, int64_t n, KvType type) {
  if (type == KvType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else {
    auto* d = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_fp16(src[i]);
  }
}
}  // namespace

void KvCache::store(int64_t layer, int64_t pos, const float* k, const float* v) {
  TANDEM_CHECK(pos >= 0 && pos < capacity_, "cache position out of range");
  uint8_t* kb = k_[static_cast<size_t>(layer)].data();
  uint8_t* vb = v_[static_cast<size_t>(layer)].data();
  const size_t es = elem_size();
  for (int64_t h = 0; h < n_head_kv_; ++h) {
    put(kb + static_cast<size_t>((h * capacity_ + pos) * head_dim_) * es, k + h * head_dim_, head_dim_, type_);
    put(vb + static_cast<size_t>((h * capacity_ + pos) * head_dim_v_) * es, v + h * head_dim_v_, head_dim_v_,
        type_);
  }
}

const void* KvCache::keys(int64_t layer, int64_t head) const {
  return k_[static_cast<size_t>(layer)].data() + static_cast<size_t>(head * capacity_ * head_dim_) * elem_size();
}

const void* KvCache::values(int64_t layer, int64_t head) const {
  return v_[static_cast<size_t>(layer)].data() + static_cast<size_t>(head * capacity_ * head_dim_v_) * elem_size();
}

}  // namespace tandem::cache
