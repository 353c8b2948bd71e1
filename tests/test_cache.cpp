// The paged KV cache on real forwards: rollback (truncate) gives bit-identical logits to never having gone
// past the truncation point, a verify window's rows equal rows decoded one at a time, prefix reuse skips the
// shared part of a prompt without changing any logit, and sharing never leaks one sequence's tokens into
// another's. Full-attention layers (stories260K) and sliding-window layers (the gemma2 checkpoint, window
// 16), every KV type.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include <unistd.h>

#include "tandem/cache/kv_cache.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace {

using tandem::cache::KvType;
using tandem::model::Session;
using tandem::model::SessionOptions;

struct Case {
  std::string model;  // under ../shared/models
  KvType type;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " " << tandem::cache::kv_type_name(c.type);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string m = info.param.model.find("gemma2") != std::string::npos ? "gemma2" : "stories";
  return m + "_" + std::string(tandem::cache::kv_type_name(info.param.type));
}

// Deterministic pseudo-random token ids in [3, n_vocab).
std::vector<int32_t> tokens(size_t n, uint32_t seed, int64_t n_vocab) {
  std::vector<int32_t> out(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& t : out) {
    s = s * 1664525u + 1013904223u;
    t = static_cast<int32_t>(3 + (s >> 8) % static_cast<uint32_t>(n_vocab - 3));
  }
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class CacheModel : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    model_ = tandem::model::Model::load(tandem::testing::shared_path("models/" + GetParam().model));
  }
  SessionOptions options(int64_t batch = 64) const {
    SessionOptions o;
    o.n_ctx = 256;
    o.kv_type = GetParam().type;
    o.batch = batch;
    return o;
  }
  int64_t V() const { return model_->config().n_vocab; }
  // Decodes ids one per forward, returning every step's logits.
  std::vector<float> decode(Session& s, std::span<const int32_t> ids) {
    std::vector<float> out;
    for (int32_t id : ids) {
      auto l = s.eval(std::span<const int32_t>(&id, 1));
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  }
  std::unique_ptr<tandem::model::Model> model_;
  tandem::ThreadPool pool_{1};  // one thread: results do not depend on it, and tests share busy machines
};

TEST_P(CacheModel, RollbackIsBitIdentical) {
  // Long enough that the sliding layers (window 16, rollback 32) have released their oldest blocks.
  const auto prompt = tokens(40, 1, V());
  const auto first = tokens(30, 2, V());   // decoded, then rolled back
  const auto second = tokens(12, 3, V());  // decoded after the rollback
  for (const size_t keep : {size_t{0}, size_t{7}, size_t{16}}) {
    Session a(*model_, pool_, options());
    a.eval(prompt);
    decode(a, first);
    a.truncate(static_cast<int64_t>(prompt.size() + keep));
    const auto got = decode(a, second);

    Session b(*model_, pool_, options());
    b.eval(prompt);
    decode(b, std::span<const int32_t>(first.data(), keep));
    const auto want = decode(b, second);
    EXPECT_TRUE(same_bits(got, want)) << "keep " << keep;
  }
}

TEST_P(CacheModel, RollbackInsideAWindowIsBitIdentical) {
  // A verify window of 8 rows, rejected after 3: truncate, then continue one by one.
  const auto prompt = tokens(37, 4, V());
  const auto window = tokens(8, 5, V());
  const auto after = tokens(6, 6, V());
  Session a(*model_, pool_, options());
  a.eval(prompt);
  a.eval(window, /*all_logits=*/true);
  a.truncate(static_cast<int64_t>(prompt.size()) + 3);
  const auto got = decode(a, after);

  Session b(*model_, pool_, options());
  b.eval(prompt);
  b.eval(std::span<const int32_t>(window.data(), 3));
  const auto want = decode(b, after);
  EXPECT_TRUE(same_bits(got, want));
}

// Rollback to a block's first position, or to 0, releases that block and with it the key anchor of
// quantized caches; the re-prefill writes the same anchor again, so the bits match a sequence that never
// went further.
TEST_P(CacheModel, RollbackToABlockStartIsBitIdentical) {
  const auto prompt = tokens(40, 17, V());
  const auto first = tokens(20, 18, V());
  const auto second = tokens(10, 19, V());
  for (const size_t keep : {size_t{0}, size_t{32}}) {
    Session a(*model_, pool_, options());
    a.eval(prompt);
    decode(a, first);
    a.truncate(static_cast<int64_t>(keep));
    const std::span<const int32_t> rest(prompt.data() + keep, prompt.size() - keep);
    const auto l = a.eval(rest);
    std::vector<float> got(l.begin(), l.end());
    const auto got_next = decode(a, second);
    got.insert(got.end(), got_next.begin(), got_next.end());

    Session b(*model_, pool_, options());
    const auto lb = b.eval(prompt);
    std::vector<float> want(lb.begin(), lb.end());
    const auto want_next = decode(b, second);
    want.insert(want.end(), want_next.begin(), want_next.end());
    EXPECT_TRUE(same_bits(got, want)) << "keep " << keep;
  }
}

TEST_P(CacheModel, VerifyWindowRowsEqualSingleRows) {
  const auto prompt = tokens(45, 7, V());
  const auto window = tokens(9, 8, V());
  Session a(*model_, pool_, options());
  a.eval(prompt);
  const auto batched = a.eval(window, /*all_logits=*/true);
  const std::vector<float> got(batched.begin(), batched.end());

  Session b(*model_, pool_, options(/*batch=*/1));
  b.eval(prompt);
  const auto want = decode(b, window);
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < window.size(); ++r)
    EXPECT_TRUE(same_bits(std::span<const float>(got).subspan(r * V(), V()),
                          std::span<const float>(want).subspan(r * V(), V())))
        << "row " << r;
}

TEST_P(CacheModel, PrefixReuseSkipsTheSharedPrompt) {
  tandem::cache::KvStoreOptions so;
  so.type = GetParam().type;
  so.n_blocks = 64;
  tandem::cache::KvStore store(model_->config().kv_geometry(), so);
  const auto system = tokens(37, 9, V());  // two full blocks of 16 and 5 more
  auto prompt1 = system, prompt2 = system;
  const auto q1 = tokens(11, 10, V()), q2 = tokens(13, 11, V());
  prompt1.insert(prompt1.end(), q1.begin(), q1.end());
  prompt2.insert(prompt2.end(), q2.begin(), q2.end());

  Session a(*model_, pool_, options(), store);
  a.prefill(prompt1);
  EXPECT_EQ(a.prompt_evaluated(), static_cast<int64_t>(prompt1.size()));
  EXPECT_EQ(a.prompt_reused(), 0);

  Session b(*model_, pool_, options(), store);
  const auto lb = b.prefill(prompt2);
  EXPECT_EQ(b.prompt_reused(), 32);
  EXPECT_EQ(b.prompt_evaluated(), static_cast<int64_t>(prompt2.size()) - 32);
  const std::vector<float> got(lb.begin(), lb.end());
  const auto cont = tokens(20, 12, V());
  const auto got_cont = decode(b, cont);

  Session fresh(*model_, pool_, options());
  const auto lf = fresh.eval(prompt2);
  EXPECT_TRUE(same_bits(got, std::vector<float>(lf.begin(), lf.end())));
  EXPECT_TRUE(same_bits(got_cont, decode(fresh, cont)));

  // The same prompt again: everything but the last token is reused, and the logits still match.
  Session c(*model_, pool_, options(), store);
  const auto lc = c.prefill(prompt1);
  ASSERT_EQ(prompt1.size(), 48u);
  EXPECT_EQ(c.prompt_evaluated(), 1);
  Session fresh1(*model_, pool_, options());
  const auto lf1 = fresh1.eval(prompt1);
  EXPECT_TRUE(
      same_bits(std::vector<float>(lc.begin(), lc.end()), std::vector<float>(lf1.begin(), lf1.end())));
}

TEST_P(CacheModel, SharedBlocksNeverLeakBetweenSequences) {
  tandem::cache::KvStoreOptions so;
  so.type = GetParam().type;
  so.n_blocks = 64;
  tandem::cache::KvStore store(model_->config().kv_geometry(), so);
  const auto prompt = tokens(48, 13, V());  // exactly three blocks
  const auto xa = tokens(10, 14, V()), xb = tokens(10, 15, V());

  Session a(*model_, pool_, options(), store);
  Session b(*model_, pool_, options(), store);
  a.prefill(prompt);
  b.prefill(prompt);
  ASSERT_EQ(b.prompt_reused(), 47);
  // Both now write into shared blocks: b rewrites position 47 and rolls back into the second block; a goes
  // on.
  b.truncate(20);
  const auto got_b = decode(b, xb);
  const auto got_a = decode(a, xa);

  Session ra(*model_, pool_, options());
  ra.eval(prompt);
  Session rb(*model_, pool_, options());
  rb.eval(std::span<const int32_t>(prompt.data(), 20));
  EXPECT_TRUE(same_bits(got_a, decode(ra, xa)));
  EXPECT_TRUE(same_bits(got_b, decode(rb, xb)));

  // A prompt that differs from the cached one inside the second block reuses only the first block.
  auto other = prompt;
  other[20] = other[20] == 5 ? 6 : 5;
  Session c(*model_, pool_, options(), store);
  c.prefill(other);
  EXPECT_EQ(c.prompt_reused(), 16);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CacheModel,
                         ::testing::Values(Case{"stories260K.gguf", KvType::kF16},
                                           Case{"stories260K.gguf", KvType::kF32},
                                           Case{"stories260K.gguf", KvType::kQ8_0},
                                           Case{"stories260K.gguf", KvType::kQ4},
                                           Case{"stories260K.gguf", KvType::kQ4R},
                                           Case{"synth/synth-gemma2-d128-Q8_0.gguf", KvType::kF16},
                                           Case{"synth/synth-gemma2-d128-Q8_0.gguf", KvType::kF32},
                                           Case{"synth/synth-gemma2-d128-Q8_0.gguf", KvType::kQ8_0},
                                           Case{"synth/synth-gemma2-d128-Q8_0.gguf", KvType::kQ4},
                                           Case{"synth/synth-gemma2-d128-Q8_0.gguf", KvType::kQ4R}),
                         case_name);

TEST(CacheSliding, RollbackBeyondTheKeptWindowThrows) {
  auto model =
      tandem::model::Model::load(tandem::testing::shared_path("models/synth/synth-gemma2-d128-Q8_0.gguf"));
  tandem::ThreadPool pool(1);
  SessionOptions o;
  o.n_ctx = 512;
  o.batch = 8;
  Session s(*model, pool, o);
  const auto ids = tokens(200, 16, model->config().n_vocab);
  s.eval(ids);
  EXPECT_NO_THROW(s.truncate(200 - 32));
  EXPECT_THROW(s.truncate(100), tandem::Error);
  EXPECT_EQ(s.length(), 200 - 32);
  EXPECT_NO_THROW(s.truncate(0));
  // The sliding pool holds only window + rollback + a forward's rows, not the whole context.
  EXPECT_LT(s.cache().store().pool(true).n_blocks(), s.cache().store().pool(false).n_blocks() / 4);
}

TEST(CachePool, ReferenceCountsReturnBlocks) {
  tandem::cache::BlockPool pool({0, 2}, 3, 2, 16, 8, 4, 3);
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_TRUE(pool.has_layer(2));
  EXPECT_FALSE(pool.has_layer(1));
  const int32_t a = pool.try_allocate(), b = pool.try_allocate(), c = pool.try_allocate();
  EXPECT_EQ(pool.try_allocate(), -1);
  pool.retain(b);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 0);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_EQ(pool.try_allocate(), b);
  pool.keys(a, 2, 1)[0] = 7;
  pool.values(a, 0, 0)[3] = 9;
  pool.copy(a, c);
  EXPECT_EQ(pool.keys(c, 2, 1)[0], 7);
  EXPECT_EQ(pool.values(c, 0, 0)[3], 9);
  EXPECT_THROW(pool.retain(-1), tandem::Error);
}

TEST(CachePrefixIndex, MatchesVerifyEveryTokenAndParent) {
  tandem::cache::BlockPool pool({0}, 1, 1, 4, 4, 4, 8);
  tandem::cache::PrefixIndex index(pool, nullptr);
  const std::vector<int32_t> seq = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const int32_t b0 = pool.try_allocate(), b1 = pool.try_allocate();
  const uint64_t s0 = index.insert(0, std::span(seq).subspan(0, 4), b0, -1);
  index.insert(s0, std::span(seq).subspan(4, 4), b1, -1);
  EXPECT_EQ(pool.refs(b0), 2);
  std::vector<tandem::cache::PrefixIndex::Match> m;
  index.match(seq, m);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].full, b0);
  EXPECT_EQ(m[1].full, b1);
  // The same second block after a different first block is a different prefix.
  std::vector<int32_t> other = seq;
  other[0] = 99;
  index.match(other, m);
  EXPECT_TRUE(m.empty());
  other = seq;
  other[7] = 99;
  index.match(other, m);
  EXPECT_EQ(m.size(), 1u);
  // Eviction frees only blocks the index alone holds, leaves first.
  pool.release(b0);
  pool.release(b1);
  EXPECT_TRUE(index.evict_for(false));
  EXPECT_EQ(pool.refs(b1), 0);
  EXPECT_TRUE(index.evict_for(false));
  EXPECT_FALSE(index.evict_for(false));
  EXPECT_EQ(pool.n_free(), 8);
}

}  // namespace

namespace {

// Resident bytes of this process (/proc/self/statm), 0 where unknown.
size_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace

// A cache sized for a long context takes memory only for the positions written: its blocks start as zero
// pages the system supplies on first touch (zero-filling them up front cost a server stream about 0.12 s the
// first time a slot was used). The positions it does hold read back as written.
TEST(KvCacheMemory, BlocksTakeMemoryOnlyOnceWritten) {
  tandem::model::Config c;
  c.n_embd = 2048;
  c.n_layer = 22;
  c.n_head = 32;
  c.n_head_kv = 4;
  c.head_dim = c.head_dim_v = 64;
  c.layer_sliding.assign(static_cast<size_t>(c.n_layer), 0);
  const size_t before = resident_bytes();
  ASSERT_GT(before, 0u);
  tandem::cache::KvCache cache(c.kv_geometry(), 4096,
                               tandem::cache::KvType::kF16);  // 2 * 22 * 4 * 64 * 2 B * 4096: 92 MB
  const size_t after = resident_bytes();
  EXPECT_LT(after, before + (size_t{8} << 20)) << "the cache touched " << ((after - before) >> 20) << " MiB";
}
