// Batch invariance: a row's result is bit-identical whether it runs alone, inside a verify window or in a
// prefill batch, for every weight type and SIMD target (matmul), and through a whole model forward (logits of
// a synthetic model: one token at a time vs windows vs one batch).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include <unistd.h>

#include "tandem/kernels/matmul.h"
#include "tandem/kernels/repack.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/model/synth.h"
#include "tandem/tensor/quant.h"

namespace {

using namespace tandem;
using namespace tandem::kernels;

TEST(BatchInvariance, MatmulRowsAreIndependentOfTheirBatch) {
  const DType types[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1,
                         DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                         DType::Q4_K, DType::Q5_K, DType::Q6_K};
  // k = 1280: five super-blocks per row, so windows span several supers in every kernel.
  const int64_t k = 1280, n = 40, max_rows = 70;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(max_rows * k)), row(static_cast<size_t>(k));
  for (auto& v : x) v = dist(rng);
  ThreadPool pool(2);
  for (DType t : types) {
    const size_t rb = row_bytes(t, k);
    std::vector<uint8_t> w(rb * static_cast<size_t>(n));
    for (int64_t o = 0; o < n; ++o) {
      for (auto& v : row) v = dist(rng);
      quantize_row(t, row.data(), w.data() + static_cast<size_t>(o) * rb, k);
    }
    const MatrixView view{t, n, k, rb, w.data()};
    for (Target target : runnable_targets()) {
      MatmulScratch scratch(pool.size(), k, max_rows, target);
      std::vector<float> alone(static_cast<size_t>(max_rows * n));
      for (int64_t r = 0; r < max_rows; ++r)
        matmul(view, x.data() + r * k, 1, alone.data() + r * n, pool, scratch);
      for (int64_t rows : {2, 3, 4, 5, 8, 9, 11, 12, 16, 17, 64, 70}) {
        std::vector<float> batch(static_cast<size_t>(rows * n));
        matmul(view, x.data(), rows, batch.data(), pool, scratch);
        EXPECT_EQ(0, std::memcmp(batch.data(), alone.data(), batch.size() * sizeof(float)))
            << dtype_name(t) << " " << target_name(target) << " rows=" << rows;
      }
    }
  }
}

// Long rows, where the direct kernels take a window in several passes (QuantKernels::direct_pass_rows: the
// activations of fewer rows stay in the L1 cache) over blocks of weight rows: each row keeps its bits, in the
// file form and the repacked one, and the pass width never exceeds what one call takes.
TEST(BatchInvariance, WindowsInPassesOverLongRowsKeepTheirBits) {
  // 149 weight rows: a thread's share spans several blocks of 16 and a rest.
  const int64_t n = 149, max_rows = 17;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ThreadPool pool(2);
  for (int64_t k : {5632, 8192}) {
    std::vector<float> x(static_cast<size_t>(max_rows * k)), row(static_cast<size_t>(k));
    for (auto& v : x) v = dist(rng);
    for (DType t : {DType::Q4_0, DType::Q6_K, DType::Q4_K}) {
      const size_t rb = row_bytes(t, k);
      std::vector<uint8_t> w(rb * static_cast<size_t>(n));
      for (int64_t o = 0; o < n; ++o) {
        for (auto& v : row) v = dist(rng);
        quantize_row(t, row.data(), w.data() + static_cast<size_t>(o) * rb, k);
      }
      const std::vector<uint8_t> file = w;
      for (WeightForm form : {WeightForm::kFile, WeightForm::kInterleaved, WeightForm::kLanePairs}) {
        if (form == WeightForm::kInterleaved && !can_interleave(t, k)) continue;
        if (form == WeightForm::kLanePairs && !can_lane_pair(t, k)) continue;
        w = file;
        if (form != WeightForm::kFile) repack_rows(form, t, k, w.data(), w.size());
        const MatrixView view{t, n, k, rb, w.data(), form};
        for (Target target : runnable_targets()) {
          const QuantKernels& qk = quant_kernels(target);
          const int64_t most = qk.direct_max_rows(t, form, k, false);
          const int64_t pass = qk.direct_pass_rows(t, form, k, false);
          EXPECT_TRUE(most == 0 ? pass == 0 : pass >= 1 && pass <= most) << target_name(target);
          MatmulScratch scratch(pool.size(), k, max_rows, target);
          std::vector<float> alone(static_cast<size_t>(max_rows * n));
          for (int64_t r = 0; r < max_rows; ++r)
            matmul(view, x.data() + r * k, 1, alone.data() + r * n, pool, scratch);
          for (int64_t rows : {3, 5, 6, 7, 8, 9, 16, 17}) {
            std::vector<float> batch(static_cast<size_t>(rows * n));
            matmul(view, x.data(), rows, batch.data(), pool, scratch);
            EXPECT_EQ(0, std::memcmp(batch.data(), alone.data(), batch.size() * sizeof(float)))
                << dtype_name(t) << " " << target_name(target) << " k=" << k << " rows=" << rows
                << " form=" << static_cast<int>(form) << " pass=" << pass;
          }
        }
      }
    }
  }
}

// A group of matrices sharing one input (q/k/v, gate/up) gives each matrix the bits of matmul() alone,
// whether the group shares one quantized activation (same activation form) or falls back to one matmul each.
TEST(BatchInvariance, MatmulGroupEqualsSeparateMatmuls) {
  const int64_t k = 512;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(20 * k)), row(static_cast<size_t>(k));
  for (auto& v : x) v = dist(rng);
  const std::vector<std::vector<DType>> groups = {{DType::Q4_0, DType::Q4_0, DType::Q8_0},
                                                  {DType::Q4_K, DType::Q6_K, DType::Q4_K},
                                                  {DType::Q4_0, DType::Q6_K, DType::F16},
                                                  {DType::Q4_K, DType::Q4_K, DType::Q6_K, DType::Q4_0},
                                                  {DType::Q4_0, DType::Q8_0, DType::Q4_0}};
  const int64_t sizes[] = {48, 17, 32, 21};
  ThreadPool pool(2);
  for (const auto& types : groups) {
    std::vector<std::vector<uint8_t>> bytes(types.size());
    std::vector<MatrixView> views;
    for (size_t i = 0; i < types.size(); ++i) {
      const size_t rb = row_bytes(types[i], k);
      bytes[i].resize(rb * static_cast<size_t>(sizes[i]));
      for (int64_t o = 0; o < sizes[i]; ++o) {
        for (auto& v : row) v = dist(rng);
        quantize_row(types[i], row.data(), bytes[i].data() + static_cast<size_t>(o) * rb, k);
      }
      views.push_back({types[i], sizes[i], k, rb, bytes[i].data()});
    }
    // The last group repacked: Q4_K and Q4_0 in lane pairs, Q6_K interleaved. Targets that read lane pairs
    // quantize the activations in lane pairs for the first two and the last and once per 256 elements for
    // Q6_K, so the group runs as three calls there; the others share one copy.
    if (types.size() == 4) {
      for (size_t i = 0; i < types.size(); ++i) {
        views[i].form = can_lane_pair(types[i], k) ? WeightForm::kLanePairs : WeightForm::kInterleaved;
        repack_rows(views[i].form, types[i], k, bytes[i].data(), bytes[i].size());
      }
    }
    // The last group's Q4_0 matrices (48 and 32 rows) in row tiles: targets that read them quantize the
    // activations in natural order for those two, once per 32 elements in their legacy order for Q8_0 (three
    // calls); the others read row tiles through the file form and share one copy.
    if (&types == &groups.back()) {
      for (size_t i = 0; i < types.size(); ++i) {
        if (!can_row_tile(types[i], sizes[i], k)) continue;
        views[i].form = WeightForm::kRowTiles;
        repack_rows(views[i].form, types[i], k, bytes[i].data(), bytes[i].size());
      }
    }
    for (Target target : runnable_targets()) {
      MatmulScratch scratch(pool.size(), k, 20, target);
      for (int64_t rows : {1, 3, 8, 12, 20}) {
        std::vector<std::vector<float>> alone(types.size()), grouped(types.size());
        std::vector<MatmulOut> outs;
        for (size_t i = 0; i < types.size(); ++i) {
          alone[i].resize(static_cast<size_t>(rows * sizes[i]));
          grouped[i].resize(alone[i].size());
          matmul(views[i], x.data(), rows, alone[i].data(), pool, scratch);
          outs.push_back({&views[i], grouped[i].data()});
        }
        matmul_group(outs, x.data(), rows, pool, scratch);
        for (size_t i = 0; i < types.size(); ++i)
          EXPECT_EQ(alone[i], grouped[i])
              << dtype_name(types[i]) << " " << target_name(target) << " rows=" << rows;
      }
    }
  }
}

TEST(BatchInvariance, ForwardLogitsDoNotDependOnTheWindow) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem_batch_inv_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ThreadPool pool(2);
  // (Widths of 512 take lane pairs for Q4_0, Q4_K and Q8_0 where the kernels read them.)
  const std::pair<const char*, const char*> models[] = {
      {"tiny-llama-d256", "Q4_0"}, {"tiny-llama-d256", "Q8_0"}, {"tiny-llama-d256", "Q4_K_M"},
      {"tiny-llama-d256", "F16"},  {"tiny-llama-d512", "Q4_0"}, {"tiny-llama-d512", "Q4_K_M"},
      {"tiny-llama-d512", "Q8_0"}};
  for (const auto& [preset, type] : models) {
    const std::string path = (dir / (std::string(preset) + "-" + type + ".gguf")).string();
    model::write_synthetic_model(model::find_synth_preset(preset), model::find_file_type(type), path, pool);
    auto m = model::Model::load(path);
    const int64_t V = m->config().n_vocab;
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) ids.push_back(3 + (i * 37) % static_cast<int32_t>(V - 3));
    model::SessionOptions so;
    so.n_ctx = 64;
    so.batch = 64;
    // One batch of all tokens.
    model::Session batch(*m, pool, so);
    const auto all = batch.eval(ids, /*all_logits=*/true);
    const std::vector<float> want(all.begin(), all.end());
    // One token at a time, then windows of 1..16 rows.
    for (int64_t window : {1, 2, 5, 16}) {
      model::Session s(*m, pool, so);
      for (size_t i = 0; i < ids.size(); i += static_cast<size_t>(window)) {
        const size_t len = std::min(ids.size() - i, static_cast<size_t>(window));
        const auto got = s.eval(std::span<const int32_t>(ids).subspan(i, len), /*all_logits=*/true);
        ASSERT_EQ(
            0, std::memcmp(got.data(), want.data() + i * static_cast<size_t>(V), got.size() * sizeof(float)))
            << type << " window=" << window << " at token " << i;
      }
      // One and two tokens at a time, the forwards took both prefetch reaches of the kernels (the tuner of
      // their width tries each), with the same bits.
      if (window <= 2) {
        const kernels::PrefetchTuner& tuner = s.forward().reach_tuner(window);
        EXPECT_GT(tuner.forwards(PrefetchReach::kNear), 0) << type;
        EXPECT_GT(tuner.forwards(PrefetchReach::kFar), 0) << type;
      }
    }
  }
  fs::remove_all(dir);
}

}  // namespace
