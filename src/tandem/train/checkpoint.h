// Drafter checkpoints: GGUF files (general.architecture "tandem-drafter") holding a drafter's trained
// weights in f32, the metadata that ties it to its target and says how to run it (the tandem.drafter.* keys,
// docs/training.md), and optionally AdamW's moments to resume training. Frozen parameters (the target's
// embedding and head) are not stored: they are read from the target the hashes name.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tandem/train/optimizer.h"
#include "tandem/train/param.h"

namespace tandem::train {

inline constexpr const char* kDrafterArchitecture = "tandem-drafter";

struct DrafterInfo {
  std::string kind;                 // "eagle3" or "dflash"
  std::string target_file_hash;     // names the target's GGUF file (non-empty)
  std::string target_vocab_hash;    // names the target's vocabulary (non-empty)
  std::vector<int32_t> tap_layers;  // target layers whose inputs the drafter reads, in order (non-empty)
  int64_t block_size = 1;           // positions drafted per forward (DFlash's block; 1 for EAGLE)
  // Held-out acceptance: entry k is the fraction of held-out rounds whose first k + 1 drafts the target
  // accepted (non-increasing, in [0, 1]); empty when not measured.
  std::vector<float> acceptance;

  // Shape.
  int64_t layer_count = 1;
  int64_t d = 0;
  int64_t n_head = 0;
  int64_t n_kv_head = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;
  int64_t vocab = 0;
  float rope_theta = 10000.0f;
  std::string rope_layout = "interleaved";  // or "halves"
  float norm_eps = 1e-5f;
  bool own_head = false;  // the head is the drafter's (stored) rather than the target's
  // The reduced draft vocabulary: the target ids the head scores, draft id i being draft_vocab[i] (distinct,
  // each below vocab; written ascending). Empty: the whole vocabulary (files from before it load so).
  std::vector<int32_t> draft_vocab;

  // Training provenance.
  int64_t step = 0;
  uint64_t seed = 0;
  int64_t total_steps = 0;     // the run's planned steps (its schedule); 0 when not recorded
  uint64_t data_position = 0;  // where the run's walk through its training data stands after `step`
};

// The draft vocabulary is stored as tandem.drafter.draft_vocab.size (u32) and tandem.drafter.draft_vocab.ids
// (an int32 array of that many target ids), both absent for the whole vocabulary.
//
// Writes the trainable parameters (by name, f32, [rows, cols] as GGUF ne {cols, rows}, vectors 1-D), the
// metadata and, with opt, its moments ("adam.m.NAME", "adam.v.NAME") and step count; atomically (the
// writer's temporary file and rename). Throws tandem::Error when the metadata is incomplete or invalid.
void save_drafter(const std::string& path, const DrafterInfo& info, std::span<Param* const> params,
                  const AdamW* opt = nullptr);

// Reads a checkpoint's metadata and fills every trainable parameter in params from the tensor of its name,
// and, with opt, AdamW's moments and step count (which must then be present). Throws tandem::Error naming
// the file and what is missing or mismatched: a key, a tensor, a shape or a type.
DrafterInfo load_drafter(const std::string& path, std::span<Param* const> params, AdamW* opt = nullptr);

// Throws tandem::Error unless the checkpoint was trained for the target with these hashes.
void check_target(const DrafterInfo& info, const std::string& file_hash, const std::string& vocab_hash);

}  // namespace tandem::train
