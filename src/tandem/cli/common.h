// Options shared by the commands that load a model and run it.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "tandem/cache/kv_cache.h"
#include "tandem/model/expert_residency.h"
#include "tandem/model/model.h"

namespace tandem::cli {

struct ModelOptions {
  std::string model_path;
  int threads = 0;    // 0: physical cores
  int64_t n_ctx = 0;  // 0: the model's, capped at 4096
  std::string kv_type = "f16";
  int64_t batch = 256;
  bool mmap = false;     // --mmap: always map the model file
  bool no_mmap = false;  // --no-mmap: always copy it into memory

  int resolved_threads() const;
  gguf::LoadMode load_mode() const;
  cache::KvType resolved_kv_type() const;
};

// Adds -m, -t, -c, --kv-type, -b, --mmap, --no-mmap. With model_required false, -m may be omitted (see
// default_model_path()).
void add_model_options(CLI::App& cmd, ModelOptions& options, bool model_required = true);

// Adds --expert-budget SIZE (the same flag and help in every command that has it).
void add_expert_budget_option(CLI::App& cmd, std::string& budget);

// SIZE for --expert-budget: bytes with an optional K, M or G suffix (powers of 1024), or a percentage of
// `experts` (the routed experts' bytes). Throws tandem::Error saying what a size looks like.
size_t parse_expert_budget(const std::string& text, size_t experts);

// The residency --expert-budget asks for (null when `budget` is empty); throws tandem::Error for a bad size
// or a model without routed experts.
std::unique_ptr<model::ExpertResidency> make_expert_residency(const std::string& budget,
                                                              const model::Model& model);

// "B MB: R MB resident (r of n experts); READER read P% of its expert bytes from resident copies".
std::string expert_residency_summary(const model::ResidencyStats& stats, const std::string& reader);

// The model `tandem run` uses when -m is absent: $TANDEM_MODEL, else ../shared/models/stories260K.gguf if it
// exists; else throws tandem::Error saying how to pass -m.
std::string default_model_path();

// Parses "1,403,9" into ids; throws tandem::Error naming the bad item.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& what);

// Reads a whole file into a string; throws tandem::Error naming the path.
std::string read_text_file(const std::string& path);

}  // namespace tandem::cli
