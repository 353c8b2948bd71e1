// Each `tandem` subcommand lives in its own cli/cmd_*.cpp and registers itself on the root app here.
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

// Registers a subcommand: its flags, help and the callback that runs it. Callbacks throw tandem::Error for
// user-facing failures; main() prints the message and exits with status 1.
void add_info_command(CLI::App& app);
void add_logprobs_command(CLI::App& app);

}  // namespace tandem::cli
