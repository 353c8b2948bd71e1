// tandem train-drafter: trains a drafter that reads the target's hidden states (speculative/eagle_train.h)
// and writes it as a GGUF drafter checkpoint for `run` and `bench-spec --drafter`.
#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "tandem/cli/commands.h"
#include "tandem/cli/common.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/dflash_train.h"
#include "tandem/speculative/eagle_train.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"

namespace tandem::cli {
namespace {

// SIGINT and SIGTERM are blocked in every thread (the pool's threads inherit the mask, so it must exist
// before them) and taken by one watcher thread with sigwait(), which only raises a flag the training loop
// polls: no handler runs asynchronously and no global flag is needed.
class InterruptWatcher {
 public:
  InterruptWatcher() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, &previous_);
    thread_ = std::thread([this] {
      int sig = 0;
      sigwait(&set_, &sig);
      if (!done_.load()) interrupted_.store(true);
    });
  }
  ~InterruptWatcher() {
    done_.store(true);
    if (!interrupted_.load()) pthread_kill(thread_.native_handle(), SIGTERM);  // wakes sigwait
    thread_.join();
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  InterruptWatcher(const InterruptWatcher&) = delete;
  InterruptWatcher& operator=(const InterruptWatcher&) = delete;
  bool interrupted() const { return interrupted_.load(); }

 private:
  sigset_t set_{}, previous_{};
  std::atomic<bool> interrupted_{false}, done_{false};
  std::thread thread_;
};

void print_progress(const speculative::DrafterTrainProgress& p) {
  std::fprintf(stderr, "\r%-8s %6lld/%-6lld tokens %7lld", p.phase, static_cast<long long>(p.done),
               static_cast<long long>(p.total), static_cast<long long>(p.tokens));
  if (p.loss > 0) std::fprintf(stderr, "  loss %.4f", p.loss);
  if (!p.acceptance.empty()) {
    std::fprintf(stderr, "  held-out");
    for (size_t i = 0; i < p.acceptance.size() && i < 6; ++i) std::fprintf(stderr, " %.2f", p.acceptance[i]);
  }
  if (p.eta_seconds >= 0) std::fprintf(stderr, "  ETA %4.0f s", p.eta_seconds);
  std::fprintf(stderr, "   ");
  if (p.done == p.total) std::fprintf(stderr, "\n");
}

void print_draft_vocab(const train::DrafterInfo& info) {
  if (info.draft_vocab.empty())
    std::printf("; draft vocabulary: all %lld tokens", static_cast<long long>(info.vocab));
  else
    std::printf("; draft vocabulary: %zu of %lld tokens", info.draft_vocab.size(),
                static_cast<long long>(info.vocab));
}

// Trains a DFlash drafter on the prompts `texts` with the options it shares with EAGLE-3, `shared`, writes it
// to `out` and prints what it measured.
void train_dflash_drafter(const model::Model& target, const std::string& target_path,
                          const tokenizer::Tokenizer& tok, ThreadPool& pool,
                          const std::vector<std::string>& texts, const speculative::EagleTrainOptions& shared,
                          speculative::DflashTrainOptions d, const std::string& out) {
  for (const std::string& t : texts) d.data.prompts.push_back(tok.encode(t, true, false));
  d.data.tokens = shared.tokens;
  d.data.continuation = shared.continuation;
  d.data.seed = d.seed = shared.seed;
  d.data.is_eog = [&tok](int32_t id) { return tok.is_eog(id); };
  d.steps = shared.steps;
  d.draft_vocab = shared.draft_vocab;
  d.lr = shared.lr;
  d.on_progress = print_progress;
  speculative::DflashTrainResult r = speculative::train_dflash(target, pool, d);
  r.info.target_file_hash = speculative::file_fingerprint(target_path);
  std::vector<train::Param*> params = r.source->drafter().params();
  train::save_drafter(out, r.info, params);
  std::fprintf(
      stderr,
      "\ntext: %lld training and %lld held-out tokens; generate %.1f s, capture %.1f s, train %.1f s, "
      "evaluate %.1f s; final loss %.4f\n",
      static_cast<long long>(r.train_tokens), static_cast<long long>(r.heldout_tokens), r.generate_seconds,
      r.capture_seconds, r.train_seconds, r.eval_seconds, r.final_loss);
  std::printf("held-out acceptance by draft position:");
  for (float a : r.info.acceptance) std::printf(" %.3f", a);
  std::printf("\nwrote %s (block %lld, taps", out.c_str(), static_cast<long long>(d.block));
  for (int32_t l : r.info.tap_layers) std::printf(" %d", l);
  print_draft_vocab(r.info);
  std::printf(")\n");
}

}  // namespace

void add_train_drafter_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "train-drafter",
      "Train a drafter that reads the target's hidden states (EAGLE-3 or DFlash style) from the target's own "
      "continuations of prompts, and write it as a GGUF checkpoint for --drafter");
  struct Opts {
    ModelOptions model;
    std::string kind = "eagle3";
    std::string out;
    std::string prompts;
    speculative::EagleTrainOptions train;
    speculative::DflashTrainOptions dflash;
  };
  auto o = std::make_shared<Opts>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--kind", o->kind, "Drafter kind: eagle3 (default) or dflash");
  cmd->add_option("--block", o->dflash.block, "dflash: rows per block, the draft depth (default 8)");
  cmd->add_option("--anchors", o->dflash.anchors, "dflash: blocks per training step (default 32)");
  cmd->add_option("--gamma", o->dflash.gamma,
                  "dflash: block row k's loss is weighted by exp(-k / gamma) (default 4)");
  cmd->add_option("-o,--output", o->out, "Where to write the drafter checkpoint (.gguf)")->required();
  cmd->add_option("--prompts", o->prompts,
                  "A text file of training prompts, one a line (default: a built-in set of story openings)");
  cmd->add_option("--tokens", o->train.tokens,
                  "Tokens of training text the target generates (default 16384)");
  cmd->add_option("--steps", o->train.steps, "Training steps, one sequence each (default 800)");
  cmd->add_option("--seed", o->train.seed, "Seed of the sampled text and the initial weights (default 1)");
  cmd->add_option("--unroll", o->train.unroll, "Draft steps unrolled in training (default 4)");
  cmd->add_option("--lr", o->train.lr, "Peak learning rate (default 0.003)");
  cmd->add_option("--ffn", o->train.ffn, "The drafter's feed-forward width (default: the target's)");
  CLI::Option* layers =
      cmd->add_option("--layers", o->train.layers, "The drafter's decoder layers (default 1)");
  cmd->add_option("--draft-vocab", o->train.draft_vocab,
                  "Tokens the drafter's head scores: the N the target generated most often in the training "
                  "text, plus its end-of-generation tokens (0 or at least the target's vocabulary: all; "
                  "default: all up to 16384 tokens, else 8192)");
  cmd->add_option("--eval-every", o->train.eval_every,
                  "Training steps between held-out evaluations on the progress line (default: a tenth of "
                  "--steps)");
  cmd->add_flag("--resume", o->train.resume,
                "Continue the training that Ctrl-C interrupted, from the checkpoint it left at -o (give the "
                "options it was started with)");
  cmd->callback([o, layers] {
    if (o->kind != speculative::kEagleKind && o->kind != speculative::kDflashKind)
      throw Error("unknown --kind '" + o->kind + "': expected eagle3 or dflash");
    auto target = model::Model::load(o->model.model_path, o->model.load_mode());
    auto tok = tokenizer::Tokenizer::from_gguf(target->file());
    InterruptWatcher interrupt;
    ThreadPool pool(o->model.resolved_threads());

    std::vector<std::string> texts;
    if (o->prompts.empty()) {
      for (const char* p : speculative::default_training_prompts()) texts.emplace_back(p);
    } else {
      std::ifstream in(o->prompts);
      if (!in) throw Error("cannot read --prompts " + o->prompts + ": give a text file, one prompt a line");
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) texts.push_back(line);
      if (texts.empty()) throw Error("--prompts " + o->prompts + " holds no prompt (one a line)");
    }
    if (o->kind == speculative::kDflashKind && layers->count() > 0) o->dflash.layers = o->train.layers;
    if (o->kind == speculative::kDflashKind)
      return train_dflash_drafter(*target, o->model.model_path, *tok, pool, texts, o->train, o->dflash,
                                  o->out);
    for (const std::string& t : texts) o->train.prompts.push_back(tok->encode(t, true, false));
    o->train.is_eog = [&tok](int32_t id) { return tok->is_eog(id); };
    o->train.on_progress = print_progress;
    o->train.stop = [&interrupt] { return interrupt.interrupted(); };
    o->train.checkpoint = o->out;
    o->train.target_file_hash = speculative::file_fingerprint(o->model.model_path);

    speculative::EagleTrainResult r = speculative::train_eagle(*target, pool, o->train);
    if (r.stopped) {
      if (r.info.step > 0 || r.info.total_steps > 0)
        std::fprintf(stderr,
                     "\ninterrupted at step %lld of %lld: saved %s; continue with the same options and "
                     "--resume\n",
                     static_cast<long long>(r.info.step), static_cast<long long>(r.info.total_steps),
                     o->out.c_str());
      else
        std::fprintf(stderr, "\ninterrupted before training began: nothing saved\n");
      return;
    }
    std::vector<train::Param*> params = r.source->drafter().params();
    train::save_drafter(o->out, r.info, params);

    std::fprintf(
        stderr,
        "\ntext: %lld training and %lld held-out tokens; generate %.1f s, capture %.1f s, train %.1f s, "
        "evaluate %.1f s; final loss %.4f\n",
        static_cast<long long>(r.train_tokens), static_cast<long long>(r.heldout_tokens), r.generate_seconds,
        r.capture_seconds, r.train_seconds, r.eval_seconds, r.final_loss);
    std::printf("held-out acceptance by draft position:");
    for (float a : r.info.acceptance) std::printf(" %.3f", a);
    std::printf("\nwrote %s (taps", o->out.c_str());
    for (int32_t l : r.info.tap_layers) std::printf(" %d", l);
    print_draft_vocab(r.info);
    std::printf(")\n");
  });
}

}  // namespace tandem::cli
