// Every backward of the trainer against central finite differences of its forward, on small random shapes
// (odd sizes included). The forwards compute in f32, so the check is in f32 too: the scalar checked is a
// random projection of the output summed in double, the step is 1e-2, and an entry passes when
// |analytic - numeric| <= 2e-3 + 1e-2 * max(|analytic|, |numeric|). A wrong term in a backward (a missing
// sum, a sign, a transposed index) misses by far more than that.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tandem/train/attention.h"
#include "tandem/train/layers.h"
#include "tandem/train/loss.h"
#include "tandem/train/param.h"
#include "tandem/util/error.h"
#include "tandem/util/thread_pool.h"
#include "train_fixture.h"

namespace {

using namespace tandem::train;
using tandem::train::fixture::randn;

constexpr float kStep = 1e-2f;
constexpr double kAbsTol = 2e-3, kRelTol = 1e-2;

double project(const std::vector<float>& y, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
  return s;
}

// Compares analytic[i] with the central difference of f in x[i], for every i (or 60 sampled i of a larger
// x). f must read x afresh on each call.
void check_grad(const std::string& what, std::vector<float>& x, const std::vector<float>& analytic,
                const std::function<double()>& f) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::mt19937 pick(7);
  const size_t n = x.size();
  const size_t checks = std::min<size_t>(n, 60);
  for (size_t c = 0; c < checks; ++c) {
    const size_t i = n <= 60 ? c : pick() % n;
    const float saved = x[i];
    x[i] = saved + kStep;
    const double up = f();
    x[i] = saved - kStep;
    const double down = f();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * kStep);
    const double a = analytic[i];
    EXPECT_LE(std::abs(a - numeric), kAbsTol + kRelTol * std::max(std::abs(a), std::abs(numeric)))
        << what << "[" << i << "]: analytic " << a << ", numeric " << numeric;
  }
}

struct Fixture {
  tandem::ThreadPool pool{2};
  Compute c{pool};
  std::mt19937 rng{1234};
};

void randomize(Param& p, std::mt19937& rng, float scale = 0.5f) {
  p.value = randn(p.size(), rng, scale);
}

TEST(TrainGrad, Linear) {
  for (bool with_bias : {false, true}) {
    Fixture fx;
    const int64_t rows = 5, in = 7, out = 9;
    Param w("w", out, in, true, true), b("b", out, 1, true, false);
    randomize(w, fx.rng);
    randomize(b, fx.rng);
    std::vector<float> x = randn(rows * in, fx.rng), r = randn(rows * out, fx.rng), y(rows * out);
    Param* bias = with_bias ? &b : nullptr;
    const auto f = [&] {
      linear_forward(w, bias, x.data(), rows, y.data(), fx.c);
      return project(y, r);
    };
    f();
    std::vector<float> dx(x.size(), 0.5f);  // accumulated onto: the check subtracts the 0.5
    linear_backward(w, bias, x.data(), r.data(), rows, dx.data(), true, fx.c);
    for (float& v : dx) v -= 0.5f;
    check_grad("dx", x, dx, f);
    check_grad("dW", w.value, w.grad, f);
    if (with_bias) check_grad("db", b.value, b.grad, f);
  }
}

TEST(TrainGrad, RmsNorm) {
  Fixture fx;
  const int64_t rows = 3, n = 13;
  Param g("g", n, 1, true, false);
  randomize(g, fx.rng);
  std::vector<float> x = randn(rows * n, fx.rng), r = randn(rows * n, fx.rng), y(x.size()), inv(rows);
  const auto f = [&] {
    rmsnorm_forward(g, 1e-5f, x.data(), rows, y.data(), inv.data(), fx.c);
    return project(y, r);
  };
  f();
  std::vector<float> dx(x.size());
  rmsnorm_backward(g, x.data(), inv.data(), r.data(), rows, dx.data(), false, fx.c);
  check_grad("dx", x, dx, f);
  check_grad("dg", g.value, g.grad, f);
}

TEST(TrainGrad, Embedding) {
  Fixture fx;
  const int64_t vocab = 11, n = 5, rows = 6;
  Param table("emb", vocab, n, true, false), frozen("emb", vocab, n, false, false);
  randomize(table, fx.rng);
  const std::vector<int32_t> ids = {3, 0, 3, 10, 7, 3};  // repeats must add up
  std::vector<float> r = randn(rows * n, fx.rng), y(rows * n);
  const auto f = [&] {
    embedding_forward(table, ids.data(), rows, y.data());
    return project(y, r);
  };
  embedding_backward(table, ids.data(), r.data(), rows);
  check_grad("dtable", table.value, table.grad, f);
  embedding_backward(frozen, ids.data(), r.data(), rows);
  EXPECT_FALSE(frozen.trainable());
  const std::vector<int32_t> bad = {1, 11};
  EXPECT_THROW(embedding_forward(table, bad.data(), 2, y.data()), tandem::Error);
}

TEST(TrainGrad, Rope) {
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalves}) {
    Fixture fx;
    const int64_t rows = 4, heads = 3, hd = 6;
    const Rope rope{hd, 10000.0f, layout};
    const std::vector<int32_t> pos = {0, 5, 17, 3};
    std::vector<float> x = randn(rows * heads * hd, fx.rng), r = randn(x.size(), fx.rng), y(x.size());
    const auto f = [&] {
      y = x;
      rope_forward(rope, y.data(), rows, heads, pos.data(), fx.c);
      return project(y, r);
    };
    std::vector<float> dx = r;
    rope_backward(rope, dx.data(), rows, heads, pos.data(), fx.c);
    check_grad("dx", x, dx, f);
  }
}

TEST(TrainGrad, SwiGlu) {
  Fixture fx;
  const int64_t n = 37;
  std::vector<float> gate = randn(n, fx.rng, 2.0f), up = randn(n, fx.rng), r = randn(n, fx.rng), y(n);
  const auto f = [&] {
    swiglu_forward(gate.data(), up.data(), n, y.data(), fx.c);
    return project(y, r);
  };
  std::vector<float> dgate(n), dup(n);
  swiglu_backward(gate.data(), up.data(), r.data(), n, dgate.data(), dup.data(), fx.c);
  check_grad("dgate", gate, dgate, f);
  check_grad("dup", up, dup, f);
}

void check_attention(const AttentionShape& s, const AttentionMask& mask, const std::string& what) {
  Fixture fx;
  const int64_t nq = mask.n_queries(), nk = mask.n_keys();
  std::vector<float> q = randn(nq * s.n_head * s.head_dim, fx.rng),
                     k = randn(nk * s.n_kv_head * s.head_dim, fx.rng), v = randn(k.size(), fx.rng),
                     r = randn(q.size(), fx.rng), out(q.size()),
                     probs(static_cast<size_t>(s.n_head * mask.n_scores()));
  const auto f = [&] {
    attention_forward(s, mask, q.data(), k.data(), v.data(), out.data(), probs.data(), fx.c);
    return project(out, r);
  };
  f();
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  attention_backward(s, mask, q.data(), k.data(), v.data(), probs.data(), r.data(), dq.data(), dk.data(),
                     dv.data(), fx.c);
  check_grad(what + " dq", q, dq, f);
  check_grad(what + " dk", k, dk, f);
  check_grad(what + " dv", v, dv, f);
}

TEST(TrainGrad, AttentionMasks) {
  const AttentionShape gqa{4, 2, 5, 1.0f / std::sqrt(5.0f)};
  check_attention(gqa, AttentionMask::causal(7), "causal");
  check_attention(gqa, AttentionMask::blocks(7, 3), "blocks");
  const std::vector<int64_t> visible = {2, 5, 0};
  check_attention(gqa, AttentionMask::context_blocks(5, visible, 7, 3), "context+block");
  check_attention({3, 1, 4, 0.5f}, AttentionMask::causal(6), "one kv head");
  check_attention({2, 2, 3, 0.7f}, AttentionMask::blocks(5, 5), "multi-head");
}

// A query's probabilities are zero outside its intervals: moving a hidden key changes nothing.
TEST(TrainGrad, AttentionMaskHidesKeys) {
  Fixture fx;
  const AttentionShape s{2, 1, 4, 0.5f};
  const std::vector<int64_t> visible = {1, 3};
  const AttentionMask mask = AttentionMask::context_blocks(3, visible, 4, 2);
  std::vector<float> q = randn(4 * 8, fx.rng), k = randn(7 * 4, fx.rng), v = randn(7 * 4, fx.rng),
                     out(q.size()), out2(q.size()), probs(static_cast<size_t>(2 * mask.n_scores()));
  attention_forward(s, mask, q.data(), k.data(), v.data(), out.data(), probs.data(), fx.c);
  for (int d = 0; d < 4; ++d) v[2 * 4 + d] += 10.0f;  // context row 2: seen by block 1 only
  attention_forward(s, mask, q.data(), k.data(), v.data(), out2.data(), probs.data(), fx.c);
  for (int i = 0; i < 2 * 8; ++i) EXPECT_EQ(out[i], out2[i]) << "block 0 must not see context row 2";
  bool changed = false;
  for (int i = 2 * 8; i < 4 * 8; ++i) changed |= out[i] != out2[i];
  EXPECT_TRUE(changed) << "block 1 sees context row 2";
}

// unused: listed rows leave some entries unused (id -1, probability 0), as targets restricted to a reduced
// draft vocabulary do.
void check_head(bool listed, bool with_rest, bool head_trains, bool unused = false) {
  Fixture fx;
  const int64_t vocab = 23, n = 6, rows = 5, k = listed ? 4 : vocab;
  Param head("head", vocab, n, head_trains, false);
  randomize(head, fx.rng, 0.8f);
  std::vector<float> h = randn(rows * n, fx.rng);
  std::vector<int32_t> ids;
  std::vector<float> probs(static_cast<size_t>(rows * k)), rest(rows, 0.0f), weight(rows);
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0;
    for (int64_t e = 0; e < k; ++e) sum += probs[static_cast<size_t>(r * k + e)] = u(fx.rng);
    const float keep = with_rest ? 0.7f : 1.0f;
    for (int64_t e = 0; e < k; ++e) probs[static_cast<size_t>(r * k + e)] *= keep / sum;
    rest[static_cast<size_t>(r)] = 1.0f - keep;
    weight[static_cast<size_t>(r)] = std::pow(0.8f, static_cast<float>(r));
    if (listed)
      for (int64_t e = 0; e < k; ++e) ids.push_back(static_cast<int32_t>((r * 5 + e * 7) % vocab));
    if (unused)  // entry r % k of every row, and a second one in row 3
      for (int64_t e : {r % k, r == 3 ? (r + 2) % k : r % k}) {
        ids[static_cast<size_t>(r * k + e)] = -1;
        probs[static_cast<size_t>(r * k + e)] = 0.0f;
      }
  }
  const std::vector<uint8_t> mask = {1, 1, 0, 1, 1};
  SoftTargets t{rows,
                k,
                listed ? ids.data() : nullptr,
                probs.data(),
                with_rest ? rest.data() : nullptr,
                weight.data(),
                mask.data()};
  const auto f = [&] { return head_soft_cross_entropy(head, h.data(), t, nullptr, fx.c).loss; };
  std::vector<float> dh(h.size());
  const LossStats stats = head_soft_cross_entropy(head, h.data(), t, dh.data(), fx.c);
  EXPECT_EQ(stats.counted, 4);
  EXPECT_GT(stats.loss, 0.0);
  const std::string what =
      std::string(listed ? "top-k" : "full") + (with_rest ? " + rest" : "") + (unused ? " + unused" : "");
  check_grad(what + " dh", h, dh, f);
  if (head_trains) check_grad(what + " dW", head.value, head.grad, f);
  for (int64_t i = 2 * n; i < 3 * n; ++i) EXPECT_EQ(dh[static_cast<size_t>(i)], 0.0f) << "a masked row";
}

TEST(TrainGrad, HeadSoftCrossEntropy) {
  check_head(true, true, false);
  check_head(true, false, true);
  check_head(false, false, true);
  check_head(true, true, true, true);
  check_head(true, false, false, true);
}

// An unused entry (id -1, probability 0) is no outcome: the loss equals that of the row without it, and
// the row's other tokens still make up the left-over outcome.
TEST(TrainGrad, UnusedEntriesAreNoOutcome) {
  Fixture fx;
  Param head("head", 3, 1, false, false);
  head.value = {0.0f, 1.0f, 0.0f};
  const float h = std::log(2.0f);
  const std::vector<int32_t> ids = {-1, 1, -1};
  const std::vector<float> probs = {0.0f, 0.6f, 0.0f};
  const float rest = 0.4f;
  const SoftTargets t{.rows = 1, .top_k = 3, .ids = ids.data(), .probs = probs.data(), .rest = &rest};
  const LossStats st = head_soft_cross_entropy(head, &h, t, nullptr, fx.c);
  EXPECT_NEAR(st.loss, std::log(2.0), 1e-6);
  EXPECT_EQ(st.agree, 1) << "the argmax is id 1, the row's most probable listed id";
  const std::vector<float> weighted = {0.1f, 0.6f, 0.0f};
  const SoftTargets bad{.rows = 1, .top_k = 3, .ids = ids.data(), .probs = weighted.data(), .rest = &rest};
  EXPECT_THROW(head_soft_cross_entropy(head, &h, bad, nullptr, fx.c), tandem::Error)
      << "an unused entry with a probability";
}

// The loss against a hand computation: one row, logits (0, ln 2, 0) [q = (1/4, 1/2, 1/4)], target id 1
// with p 0.6 and 0.4 left over: L = -0.6 ln(1/2) - 0.4 ln(1/2) = ln 2.
TEST(TrainGrad, HeadLossByHand) {
  Fixture fx;
  Param head("head", 3, 1, false, false);
  head.value = {0.0f, 1.0f, 0.0f};
  const float h = std::log(2.0f);
  const int32_t id = 1;
  const float p = 0.6f, rest = 0.4f;
  const SoftTargets t{1, 1, &id, &p, &rest};
  EXPECT_NEAR(head_soft_cross_entropy(head, &h, t, nullptr, fx.c).loss, std::log(2.0), 1e-6);
}

TEST(TrainGrad, BadTargetsAreRefused) {
  Fixture fx;
  Param head("head", 5, 2, false, false);
  const std::vector<float> h(4, 0.0f), probs = {0.5f, 0.5f, 0.5f, 0.5f};
  const std::vector<int32_t> repeated = {1, 1, 0, 2}, outside = {1, 2, 0, 5};
  EXPECT_THROW(head_soft_cross_entropy(head, h.data(), {2, 2, repeated.data(), probs.data()}, nullptr, fx.c),
               tandem::Error);
  EXPECT_THROW(head_soft_cross_entropy(head, h.data(), {2, 2, outside.data(), probs.data()}, nullptr, fx.c),
               tandem::Error);
  EXPECT_THROW(head_soft_cross_entropy(head, h.data(), {2, 2, nullptr, probs.data()}, nullptr, fx.c),
               tandem::Error);
}

}  // namespace
