// Each `tandem` subcommand lives in its own cli/cmd_*.cpp and registers itself on the root app here.
#pragma once

#include <CLI/CLI.hpp>

#include "tandem/sampling/sampler.h"

namespace tandem::cli {

// Registers a subcommand: its flags, help and the callback that runs it. Callbacks throw tandem::Error for
// user-facing failures; main() prints the message and exits with status 1.
void add_info_command(CLI::App& app);
void add_logprobs_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_synth_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_kld_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_calibrate_command(CLI::App& app);
void add_bench_spec_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_bench_serve_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_template_command(CLI::App& app);
void add_train_drafter_command(CLI::App& app);
void add_embed_command(CLI::App& app);
// Sampling flags shared by run and the speculative commands; seed_given is set when --seed is passed.
void add_sampling_options(CLI::App& cmd, sampling::Params& params, bool& seed_given);

}  // namespace tandem::cli
