// Drafter checkpoints: a round trip restores weights, optimizer state and metadata bit for bit (training
// resumes exactly), and bad files or a mismatched target are refused with a message naming what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
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
  EXPECT_TRUE(got.draft_vocab.empty()) << "a file without a draft vocabulary drafts over the whole";
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

// The draft vocabulary: its token ids round-trip in order, and a file whose list names a token outside the
// vocabulary or one token twice, or whose size key disagrees with its list, is refused saying so.
TEST(TrainCheckpoint, DraftVocabularyRoundTripsAndBadListsAreRefused) {
  const TempDir dir("tandem-train-ckpt");
  EagleConfig cfg = small();
  cfg.draft_vocab = {3, 11, 17};
  Trained a(1);
  EagleDrafter reduced(cfg, 2);
  const std::vector<Param*> ps = reduced.params();
  ASSERT_EQ(ps.back()->rows, 3) << "the head scores the draft vocabulary only";
  DrafterInfo info = info_for(cfg);
  info.draft_vocab = cfg.draft_vocab;
  const std::string path = dir.file("reduced.gguf");
  save_drafter(path, info, ps);
  EXPECT_EQ(load_drafter(path, ps).draft_vocab, cfg.draft_vocab);
  // A head of the whole vocabulary does not fit a file of three rows.
  expect_error([&] { load_drafter(path, a.ps); }, "output.weight");

  info.draft_vocab = {3, 20};
  expect_error([&] { save_drafter(dir.file("x.gguf"), info, ps); }, "token id 20, outside");
  info.draft_vocab = {3, 3};
  expect_error([&] { save_drafter(dir.file("x.gguf"), info, ps); }, "token id 3 twice");

  // The same refusals when reading a damaged file: its id list patched in place.
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int32_t list[3] = {3, 11, 17};
  const auto at = std::search(bytes.begin(), bytes.end(), reinterpret_cast<const char*>(list),
                              reinterpret_cast<const char*>(list) + sizeof list);
  ASSERT_NE(at, bytes.end()) << "the id list is stored as int32";
  const auto damaged = [&](int32_t second, const std::string& name) {
    std::vector<char> b = bytes;
    std::memcpy(b.data() + (at - bytes.begin()) + 4, &second, 4);
    const std::string file = dir.file(name);
    std::ofstream(file, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
    return file;
  };
  const std::string outside = damaged(25, "outside.gguf"), twice = damaged(17, "twice.gguf");
  expect_error([&] { load_drafter(outside, ps); }, "token id 25, outside the target's vocabulary of 20");
  expect_error([&] { load_drafter(twice, ps); }, "lists token id 17 twice");

  // A size key that disagrees with the list.
  const std::vector<char>::const_iterator size_key = std::search(
      bytes.begin(), bytes.end(), std::begin("draft_vocab.size"), std::end("draft_vocab.size") - 1);
  ASSERT_NE(size_key, bytes.end());
  std::vector<char> b = bytes;
  const size_t value = static_cast<size_t>(size_key - bytes.begin()) + std::strlen("draft_vocab.size") + 4;
  uint32_t stored = 0;
  std::memcpy(&stored, b.data() + value, 4);
  ASSERT_EQ(stored, 3u) << "the size is a u32 after its type";
  const uint32_t wrong = 4;
  std::memcpy(b.data() + value, &wrong, 4);
  std::ofstream(dir.file("size.gguf"), std::ios::binary)
      .write(b.data(), static_cast<std::streamsize>(b.size()));
  expect_error([&] { load_drafter(dir.file("size.gguf"), ps); }, "draft_vocab.size is 4 but");
}

}  // namespace
