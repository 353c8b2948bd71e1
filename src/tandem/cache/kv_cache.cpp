#include "tandem/cache/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "tandem/util/error.h"

namespace tandem::cache {

namespace {
int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
}  // namespace

KvStore::KvStore(const Geometry& c, const KvStoreOptions& options)
    : options_(options), geometry_(c), n_layer_(c.n_layer), n_head_kv_(c.n_head_kv) {
  if (options.block_size <= 0) throw Error("KV block size must be positive");
  if (options.n_blocks <= 0) throw Error("a KV store needs at least one block");
  if (options.rollback < 0 || options.recurrent_rollback < 0 || options.recurrent_window < 0)
    throw Error("KV rollback depth must not be negative");
  key_codec_ = KvCodec::create(options.type, c.head_dim, c.n_head_kv, options.seed, /*keys=*/true);
  if (c.values_in_keys) {
    TANDEM_CHECK(c.head_dim_v > 0 && c.head_dim_v <= c.head_dim,
                 "values in keys need head_dim_v <= head_dim");
    // A rotated codec's rows are not the key's elements, so its values could not be read back in place.
    if (options.type == KvType::kQ4R)
      throw Error("the q4r KV cache type does not support latent attention caches; use f16, q8_0 or q4");
  } else {
    value_codec_ =
        KvCodec::create(options.type, c.head_dim_v, c.n_head_kv, options.seed ^ 0x5851F42D4C957F2Dull);
  }
  if (kv_type_anchors_keys(options.type)) key_anchor_ = std::make_unique<KeyAnchor>(c.head_dim);
  const size_t ab = key_anchor_ ? key_anchor_->bytes() : 0;
  std::vector<int64_t> full_layers, sliding_layers;
  for (int64_t l = 0; l < c.n_layer; ++l)
    if (!c.recurrent(l)) (c.sliding(l) ? sliding_layers : full_layers).push_back(l);
  const size_t kr = key_codec_->row_bytes(), vr = value_codec_ ? value_codec_->row_bytes() : 0;
  full_ = std::make_unique<BlockPool>(full_layers, c.n_layer, c.n_head_kv, kr, vr, options.block_size,
                                      options.n_blocks, ab);
  if (!sliding_layers.empty()) {
    window_ = c.sliding_window;
    const int64_t n = options.n_sliding_blocks > 0 ? options.n_sliding_blocks : options.n_blocks;
    sliding_ = std::make_unique<BlockPool>(sliding_layers, c.n_layer, c.n_head_kv, kr, vr, options.block_size,
                                           n, ab);
  }
  if (options.prefix_reuse) index_ = std::make_unique<PrefixIndex>(*full_, sliding_.get());
}

size_t KvStore::bytes_per_token() const {
  int64_t attention_layers = 0;
  for (int64_t l = 0; l < n_layer_; ++l) attention_layers += geometry_.recurrent(l) ? 0 : 1;
  const auto heads = static_cast<size_t>(attention_layers * n_head_kv_);
  const size_t rows = heads * (key_codec_->row_bytes() + (value_codec_ ? value_codec_->row_bytes() : 0));
  const size_t anchors = key_anchor_ ? heads * key_anchor_->bytes() : 0;
  const auto B = static_cast<size_t>(options_.block_size);
  return rows + (anchors + B - 1) / B;
}

int32_t KvStore::allocate(bool sliding) {
  BlockPool& p = pool(sliding);
  int32_t b = p.try_allocate();
  while (b < 0 && index_ && index_->evict_for(sliding)) b = p.try_allocate();
  if (b < 0)
    throw Error("the KV cache is full (" + std::to_string(p.n_blocks()) + " blocks of " +
                std::to_string(block_size()) + " positions are in use); use a larger -c or fewer sequences");
  return b;
}

KvCache::KvCache(const Geometry& geometry, int64_t capacity, KvType type, int64_t max_batch,
                 int64_t recurrent_rollback, int64_t recurrent_window)
    : capacity_(capacity) {
  if (capacity <= 0) throw Error("context size must be positive");
  if (recurrent_rollback < 0 || recurrent_window < 0)
    throw Error("recurrent rollback depth and window must not be negative");
  KvStoreOptions o;
  o.type = type;
  o.recurrent_rollback = recurrent_rollback;
  o.recurrent_window = recurrent_window;
  o.n_blocks = ceil_div(capacity, o.block_size) + 1;  // + 1: a copy-on-write in flight
  const int64_t reach = geometry.sliding_window + o.rollback + std::max<int64_t>(1, max_batch);
  o.n_sliding_blocks = std::min(o.n_blocks, ceil_div(reach, o.block_size) + 2);
  owned_ = std::make_unique<KvStore>(geometry, o);
  store_ = owned_.get();
  if (geometry.has_recurrent())
    recurrent_ = std::make_unique<RecurrentState>(geometry, o.recurrent_rollback, o.recurrent_window);
  full_table_.assign(static_cast<size_t>(ceil_div(capacity, o.block_size)), -1);
  sliding_table_.assign(full_table_.size(), -1);
  serials_.assign(full_table_.size(), 0);
}

KvCache::KvCache(KvStore& store, int64_t capacity) : store_(&store), capacity_(capacity) {
  if (capacity <= 0) throw Error("context size must be positive");
  if (store.geometry().has_recurrent())
    recurrent_ = std::make_unique<RecurrentState>(store.geometry(), store.options().recurrent_rollback,
                                                  store.options().recurrent_window);
  const auto blocks = static_cast<size_t>(ceil_div(capacity, store.block_size()));
  full_table_.assign(blocks, -1);
  sliding_table_.assign(blocks, -1);
  serials_.assign(blocks, 0);
}

KvCache::~KvCache() {
  release_from(false, 0);
  if (store_->has_sliding()) release_from(true, 0);
}

void KvCache::release_from(bool sliding, int64_t b) {
  auto& t = table(sliding);
  BlockPool& p = store_->pool(sliding);
  for (int64_t i = b; i < used_blocks_; ++i) {
    int32_t& blk = t[static_cast<size_t>(i)];
    if (blk >= 0) p.release(blk);
    blk = -1;
  }
}

void KvCache::truncate(int64_t n) {
  TANDEM_CHECK(n >= 0 && n <= length_, "truncate past the cache length");
  const int64_t B = store_->block_size();
  if (store_->has_sliding() && n > 0) {
    const int64_t lo = std::max<int64_t>(0, n - store_->window() + 1);
    for (int64_t b = lo / B; b <= (n - 1) / B; ++b)
      if (sliding_table_[static_cast<size_t>(b)] < 0)
        throw Error("cannot roll back to position " + std::to_string(n) + " of " + std::to_string(length_) +
                    ": the sliding-window layers keep only the last " +
                    std::to_string(store_->window() + store_->options().rollback) + " positions");
  }
  if (recurrent_) recurrent_->rollback(n);  // throws, changing nothing, past its rollback depth
  const int64_t keep = ceil_div(n, B);
  release_from(false, keep);
  if (store_->has_sliding()) release_from(true, keep);
  used_blocks_ = std::min(used_blocks_, keep);
  if (n == 0) sliding_low_ = 0;
  length_ = n;
  published_ = std::min(published_, n / B);
}

void KvCache::compact(int64_t base, std::span<const int32_t> nodes) {
  if (store_->key_anchor())
    throw Error(std::string("a token tree's accepted path cannot be moved in a quantized key cache (") +
                std::string(kv_type_name(store_->type())) +
                " keys are stored against their block's anchor); use --kv-type f16 "
                "or f32, or a chain (--tree-nodes 0)");
  if (!store_->has_values())
    throw Error(
        "a token tree's accepted path cannot be moved in a latent (MLA) cache yet: its values live in the "
        "key "
        "rows; use a chain (--tree-nodes 0)");
  if (recurrent_)
    throw Error(
        "a token tree cannot be kept in a model with recurrent (mamba) layers: their state follows one "
        "sequence, not a tree; use a chain (--tree-nodes 0)");
  const auto n = static_cast<int64_t>(nodes.size());
  TANDEM_CHECK(base >= 0 && base + n <= length_, "compaction outside the cache");
  for (int64_t k = 0; k < n; ++k) {
    const int32_t node = nodes[static_cast<size_t>(k)];
    TANDEM_CHECK(node >= k && base + node < length_ && (k == 0 || node > nodes[static_cast<size_t>(k - 1)]),
                 "compaction nodes must increase inside the cache");
  }
  const int64_t B = store_->block_size();
  const KvCodec& kc = store_->key_codec();
  const KvCodec& vc = store_->value_codec();
  for (int64_t layer = 0; layer < store_->n_layer(); ++layer) {
    const bool sliding = store_->sliding(layer);
    BlockPool& p = store_->pool(sliding);
    const auto& t = table(sliding);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t src = base + nodes[static_cast<size_t>(k)], dst = base + k;
      if (src == dst) continue;
      const int32_t sb = t[static_cast<size_t>(src / B)], db = t[static_cast<size_t>(dst / B)];
      TANDEM_CHECK(sb >= 0 && db >= 0 && p.refs(db) == 1,
                   "compaction into a block that is missing or shared");
      for (int64_t h = 0; h < store_->n_head_kv(); ++h) {
        kc.copy_in_block(p.keys(sb, layer, h), src % B, p.keys(db, layer, h), dst % B, B);
        vc.copy_in_block(p.values(sb, layer, h), src % B, p.values(db, layer, h), dst % B, B);
      }
    }
  }
  truncate(base + n);
}

void KvCache::make_writable(bool sliding, int64_t b) {
  auto& t = table(sliding);
  BlockPool& p = store_->pool(sliding);
  const int32_t cur = t[static_cast<size_t>(b)];
  if (cur >= 0 && p.refs(cur) == 1) return;
  const int32_t fresh = store_->allocate(sliding);
  if (cur >= 0) {
    p.copy(cur, fresh);
    p.release(cur);
  }
  t[static_cast<size_t>(b)] = fresh;
}

void KvCache::prepare_append(int64_t first, int64_t end) {
  TANDEM_CHECK(first >= 0 && first <= length_ && first < end, "append must continue the sequence");
  if (end > capacity_)
    throw Error("position " + std::to_string(end - 1) + " exceeds the context size " +
                std::to_string(capacity_) + "; use a larger -c");
  if (first < length_) truncate(first);
  const int64_t B = store_->block_size();
  const bool sliding = store_->has_sliding();
  if (sliding) {
    // Rows from `first` on (and rollbacks of up to `rollback` positions before it) attend no further back
    // than this.
    const int64_t reach = first - store_->options().rollback - store_->window() + 1;
    const int64_t below = reach > 0 ? reach / B : 0;
    for (; sliding_low_ < below; ++sliding_low_) {
      int32_t& blk = sliding_table_[static_cast<size_t>(sliding_low_)];
      if (blk >= 0) store_->pool(true).release(blk);
      blk = -1;
    }
  }
  // Keep the length at `first` until every block is in place, so a failed allocation leaves a consistent
  // sequence (blocks allocated so far are released by later truncates or the destructor).
  for (int64_t b = first / B; b <= (end - 1) / B; ++b) {
    used_blocks_ = std::max(used_blocks_, b + 1);
    make_writable(false, b);
    if (sliding) make_writable(true, b);
  }
  if (recurrent_) recurrent_->begin_append(first, end);
  length_ = end;
}

void KvCache::store(int64_t layer, int64_t pos, const float* k, const float* v) {
  TANDEM_CHECK(pos >= 0 && pos < length_, "store outside the prepared positions");
  const bool sliding = store_->sliding(layer);
  const int64_t B = store_->block_size();
  const int32_t blk = table(sliding)[static_cast<size_t>(pos / B)];
  BlockPool& p = store_->pool(sliding);
  TANDEM_CHECK(blk >= 0 && p.refs(blk) == 1, "store into a block that is missing or shared");
  const KvCodec& kc = store_->key_codec();
  const KvCodec* vc = store_->has_values() ? &store_->value_codec() : nullptr;
  const KeyAnchor* anchor = store_->key_anchor();
  const size_t off = static_cast<size_t>(pos % B);
  float residual[kMaxHeadDim];
  for (int64_t h = 0; h < store_->n_head_kv(); ++h) {
    const float* kh = k + h * kc.dim();
    if (anchor) {
      uint8_t* a = p.anchor(blk, layer, h);
      if (off == 0) anchor->set(kh, a);
      anchor->subtract(a, kh, residual);
      kh = residual;
    }
    kc.encode_in_block(kh, h, p.keys(blk, layer, h), B, static_cast<int64_t>(off));
    if (vc) vc->encode(v + h * vc->dim(), h, p.values(blk, layer, h) + off * vc->row_bytes());
  }
}

int64_t KvCache::reuse_prefix(std::span<const int32_t> tokens) {
  TANDEM_CHECK(length_ == 0, "prefix reuse needs an empty sequence");
  PrefixIndex* index = store_->index();
  // Attention blocks alone do not restore a recurrent layer's state.
  if (!index || tokens.size() < 2 || recurrent_) return 0;
  index->match(tokens, matches_);
  const int64_t B = store_->block_size();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t max_blocks = std::min<int64_t>(static_cast<int64_t>(matches_.size()), ceil_div(capacity_, B));
  for (int64_t k = max_blocks; k >= 1; --k) {
    const int64_t P = std::min(k * B, n - 1);
    if (P <= 0) break;
    const int64_t nb = ceil_div(P, B);
    int64_t lo_block = nb, keep_block = nb;
    if (store_->has_sliding()) {
      lo_block = std::max<int64_t>(0, P - store_->window() + 1) / B;
      bool ok = true;
      for (int64_t b = lo_block; b < nb; ++b) ok = ok && matches_[static_cast<size_t>(b)].sliding >= 0;
      if (!ok) continue;
      keep_block = std::max<int64_t>(0, P - store_->options().rollback - store_->window() + 1) / B;
    }
    for (int64_t b = 0; b < nb; ++b) {
      const PrefixIndex::Match& m = matches_[static_cast<size_t>(b)];
      store_->pool(false).retain(m.full);
      full_table_[static_cast<size_t>(b)] = m.full;
      serials_[static_cast<size_t>(b)] = m.serial;
      // Sliding blocks: those the next rows need, and any the index still has within rollback reach.
      if (b >= keep_block && m.sliding >= 0 && store_->has_sliding()) {
        store_->pool(true).retain(m.sliding);
        sliding_table_[static_cast<size_t>(b)] = m.sliding;
      }
    }
    sliding_low_ = store_->has_sliding() ? keep_block : 0;
    used_blocks_ = nb;
    length_ = P;
    published_ = P / B;
    return P;
  }
  return 0;
}

void KvCache::publish(std::span<const int32_t> tokens) {
  PrefixIndex* index = store_->index();
  if (!index) return;
  TANDEM_CHECK(static_cast<int64_t>(tokens.size()) >= length_, "publish needs the sequence's tokens");
  const int64_t B = store_->block_size();
  for (int64_t b = published_; b < length_ / B; ++b) {
    const uint64_t parent = b > 0 ? serials_[static_cast<size_t>(b - 1)] : 0;
    serials_[static_cast<size_t>(b)] =
        index->insert(parent, tokens.subspan(static_cast<size_t>(b * B), static_cast<size_t>(B)),
                      full_table_[static_cast<size_t>(b)], sliding_table_[static_cast<size_t>(b)]);
  }
  published_ = std::max(published_, length_ / B);
}

}  // namespace tandem::cache
