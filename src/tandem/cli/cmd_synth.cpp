// tandem synth / tandem quantize: random-weight checkpoints of real shapes, and re-quantization of a GGUF
// file.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "tandem/cli/commands.h"
#include "tandem/model/synth.h"
#include "tandem/util/error.h"
#include "tandem/util/thread_pool.h"

namespace tandem::cli {

void add_synth_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "synth", "Write a random-weight checkpoint of a real model's shapes (for benchmarks)");
  struct Opts {
    std::string preset, type = "Q4_0", out;
    int threads = 0;
    uint64_t seed = 1;
    int mtp_layers = -1;  // -1: the preset's own
    bool mla_split = false;
  };
  auto o = std::make_shared<Opts>();
  std::string presets;
  for (const auto& p : model::synth_presets()) presets += (presets.empty() ? "" : ", ") + std::string(p.name);
  std::string types;
  for (const auto& t : model::file_types()) types += (types.empty() ? "" : ", ") + std::string(t.name);
  cmd->add_option("--preset", o->preset, "Shape preset: " + presets)->required();
  cmd->add_option("--type", o->type, "File type: " + types + " (default Q4_0)");
  cmd->add_option("-o,--output", o->out, "Output GGUF file")->required();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: physical cores)");
  cmd->add_option("--seed", o->seed, "Random seed (default 1)");
  cmd->add_option(
      "--mtp-layers", o->mtp_layers,
      "deepseek2 presets: next-token-prediction (MTP) layers after the main ones, for --draft mtp "
      "(default: the preset's own, 1 for tiny-deepseek-v3-d64, else 0)");
  cmd->add_flag(
      "--mla-split", o->mla_split,
      "deepseek2 presets: write each layer's attn_kv_b split per head into attn_k_b and attn_v_b, as "
      "recent converters do (the same values)");
  cmd->callback([o] {
    model::SynthPreset preset =
        o->mtp_layers == -1 ? model::find_synth_preset(o->preset)
                            : model::with_mtp_layers(model::find_synth_preset(o->preset), o->mtp_layers);
    if (o->mla_split) preset = model::with_split_kv_b(preset);
    const auto& type = model::find_file_type(o->type);
    ThreadPool pool(o->threads > 0 ? o->threads : ThreadPool::physical_cores());
    const auto t0 = std::chrono::steady_clock::now();
    model::write_synthetic_model(preset, type, o->out, pool, o->seed);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "wrote %s (%s, %s): %.1f MB in %.1f s\n", o->out.c_str(),
                 std::string(preset.name).c_str(), std::string(type.name).c_str(),
                 static_cast<double>(std::filesystem::file_size(o->out)) / 1e6, s);
  });
}

void add_quantize_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("quantize", "Re-quantize the matrices of a GGUF file: tandem quantize IN OUT TYPE");
  struct Opts {
    std::string in, out, type;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("input", o->in, "Input GGUF file")->required();
  cmd->add_option("output", o->out, "Output GGUF file")->required();
  cmd->add_option("type", o->type, "File type (Q4_0, Q8_0, Q4_K_M, ...)")->required();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: physical cores)");
  cmd->callback([o] {
    const auto& type = model::find_file_type(o->type);
    if (std::filesystem::exists(o->out) && std::filesystem::equivalent(o->in, o->out))
      throw Error("output must differ from the input file");
    ThreadPool pool(o->threads > 0 ? o->threads : ThreadPool::physical_cores());
    model::quantize_model(o->in, o->out, type, pool);
    std::fprintf(stderr, "wrote %s (%s)\n", o->out.c_str(), std::string(type.name).c_str());
  });
}

}  // namespace tandem::cli
