// Drafter checkpoints: a round trip restores weights, optimizer state and metadata bit for bit (training
// resumes exactly), and bad files or a mismatched target are refused with a message naming what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tandem/gguf/writer.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/eagle.h"
#include "tandem/train/optimizer.h"
#include "tandem/util/error.h"
#include "tandem/util/thread_pool.h"
#include "test_util.h"

namespace {

using tandem::testing::TempDir;

using namespace tandem::train;
namespace fs = std::filesystem;

EagleConfig small() {
  EagleConfig cfg;
  cfg.d = 16;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.head_dim = 4;
  cfg.ffn = 24;
  cfg.vocab = 20;
  cfg.train_head = true;
  return cfg;
}

DrafterInfo info_for(const EagleConfig& cfg) {
  DrafterInfo info;
  info.kind = "eagle3";
  info.target_file_hash = "0123456789abcdef";
  info.target_vocab_hash = "fedcba9876543210";
  info.tap_layers = {2, 8, 13};
  info.block_size = 1;
  info.acceptance = {0.8f, 0.55f, 0.3f};
  info.d = cfg.d;
  info.n_head = cfg.n_head;
  info.n_kv_head = cfg.n_kv_head;
  info.head_dim = cfg.head_dim;
  info.ffn = cfg.ffn;
  info.vocab = cfg.vocab;
  info.own_head = cfg.train_head;
  info.step = 3;
  info.seed = 42;
  info.total_steps = 10;
  info.data_position = 0xF00DFACE12345678ull;  // past int64's range: a generator's state uses all 64 bits
  return info;
}

// A drafter with a few steps of training behind it, on a fixed random batch.
struct Trained {
  static constexpr int64_t kRows = 6;
  tandem::ThreadPool pool{2};
  Compute c{pool};
  EagleDrafter m{small(), kRows};
  std::vector<Param*> ps = m.params();
  AdamW opt{ps, {0.9, 0.95, 1e-8, 0.01}};
  std::vector<float> taps, probs = std::vector<float>(kRows, 1.0f);
  std::vector<int32_t> ids = {1, 4, 9, 16, 3, 7}, pos = {0, 1, 2, 3, 4, 5}, targets = {2, 5, 10, 17, 4, 8};
  AttentionMask mask = AttentionMask::causal(kRows);

  explicit Trained(uint64_t seed) {
    m.init(seed);
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (float& v : m.embedding().value) v = n(rng);
    taps.resize(static_cast<size_t>(kRows * 3 * small().d));
    for (float& v : taps) v = n(rng);
  }
  void step() {
    m.zero_grad();
    const EagleBatch b{.rows = kRows,
                       .taps = taps.data(),
                       .next_ids = ids.data(),
                       .pos = pos.data(),
                       .mask = &mask,
                       .targets = SoftTargets{kRows, 1, targets.data(), probs.data()}};
    m.forward_backward(b, c);
    opt.step(1e-2);
  }
};

TEST(TrainCheckpoint, RoundTripResumesExactly) {
  const TempDir dir("tandem-train-ckpt");
  const std::string path = dir.file("drafter.gguf");
  Trained a(1);
  for (int s = 0; s < 3; ++s) a.step();
  const DrafterInfo info = info_for(small());
  save_drafter(path, info, a.ps, &a.opt);

  Trained b(2);                                   // other weights, until loaded
  b.m.embedding().value = a.m.embedding().value;  // frozen: the target's, not in the checkpoint
  const DrafterInfo got = load_drafter(path, b.ps, &b.opt);
  EXPECT_EQ(got.kind, "eagle3");
  EXPECT_EQ(got.target_file_hash, info.target_file_hash);
  EXPECT_EQ(got.target_vocab_hash, info.target_vocab_hash);
  EXPECT_EQ(got.tap_layers, info.tap_layers);
  EXPECT_EQ(got.block_size, 1);
  EXPECT_EQ(got.acceptance, info.acceptance);
  EXPECT_EQ(got.d, 16);
  EXPECT_EQ(got.n_kv_head, 2);
  EXPECT_EQ(got.ffn, 24);
  EXPECT_EQ(got.vocab, 20);
  EXPECT_TRUE(got.own_head);
  EXPECT_EQ(got.step, 3);
  EXPECT_EQ(got.seed, 42u);
  EXPECT_EQ(got.total_steps, 10);
  EXPECT_EQ(got.data_position, 0xF00DFACE12345678ull);
  EXPECT_EQ(b.opt.steps(), 3);
  for (size_t i = 0; i < a.ps.size(); ++i) {
    if (a.ps[i]->trainable()) {
      EXPECT_EQ(a.ps[i]->value, b.ps[i]->value) << a.ps[i]->name;
    }
  }
  for (size_t i = 0; i < a.opt.params().size(); ++i) {
    EXPECT_EQ(a.opt.first_moment(i), b.opt.first_moment(i));
    EXPECT_EQ(a.opt.second_moment(i), b.opt.second_moment(i));
  }
  a.step();
  b.step();
  for (size_t i = 0; i < a.ps.size(); ++i) EXPECT_EQ(a.ps[i]->value, b.ps[i]->value) << a.ps[i]->name;

  // Weights only: loads without an optimizer, and refuses to resume one.
  const std::string weights = dir.file("weights.gguf");
  save_drafter(weights, info, a.ps);
  Trained c(3);
  EXPECT_NO_THROW(load_drafter(weights, c.ps));
  EXPECT_THROW(load_drafter(weights, c.ps, &c.opt), tandem::Error);
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TrainCheckpoint, RefusesBadInput) {
  const TempDir dir("tandem-train-ckpt");
  Trained a(1);
  DrafterInfo info = info_for(small());
  info.kind = "medusa";
  expect_error([&] { save_drafter(dir.file("x.gguf"), info, a.ps); }, "tandem.drafter.kind");
  info = info_for(small());
  info.target_vocab_hash.clear();
  expect_error([&] { save_drafter(dir.file("x.gguf"), info, a.ps); }, "tandem.drafter.target.vocab_hash");
  info = info_for(small());
  info.acceptance = {0.5f, 0.7f};
  expect_error([&] { save_drafter(dir.file("x.gguf"), info, a.ps); }, "tandem.drafter.acceptance");

  // A drafter of another width: the first tensor's shape is named.
  const std::string path = dir.file("drafter.gguf");
  save_drafter(path, info_for(small()), a.ps);
  EagleConfig wider = small();
  wider.d = 20;
  EagleDrafter other(wider, 4);
  const std::vector<Param*> ops = other.params();
  expect_error([&] { load_drafter(path, ops); }, "fc.weight is F32 [48, 16]");

  // A file that is not a drafter checkpoint.
  tandem::gguf::Writer w;
  w.add_string("general.architecture", "llama");
  w.write_file(dir.file("model.gguf"));
  expect_error([&] { load_drafter(dir.file("model.gguf"), a.ps); }, "is this a drafter checkpoint?");

  // The target the checkpoint names.
  const DrafterInfo ok = load_drafter(path, a.ps);
  EXPECT_NO_THROW(check_target(ok, "0123456789abcdef", "fedcba9876543210"));
  expect_error([&] { check_target(ok, "0123456789abcdef", "0000"); }, "vocabulary hash fedcba9876543210");
  expect_error([&] { check_target(ok, "1111", "fedcba9876543210"); },
               "target file with hash 0123456789abcdef");
}

}  // namespace
