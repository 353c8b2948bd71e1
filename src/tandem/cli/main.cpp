// tandem: command-line entry point. Each subcommand is registered from its own file (see commands.h).
#include <cstdio>
#include <exception>

#include "tandem/cli/commands.h"
#include "tandem/kernels/cpu_target.h"
#include "tandem/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Tandem: LLM inference on the CPU with lossless speculative decoding.\n"
      "Loads GGUF checkpoints (llama, qwen2, qwen3, gemma2 families; bert encoders for embeddings).\n"
      "Environment: TANDEM_MODEL, the model when -m is not given; TANDEM_KERNELS, a kernel target to run\n"
      "instead of the best this CPU runs (scalar, avx2, avx2-vnni, avx512-vnni, avx512-vnni-vbmi,\n"
      "avx512-amx, neon, neon-dotprod)."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tandem 0.1.0");
  tandem::cli::add_info_command(app);
  tandem::cli::add_logprobs_command(app);
  tandem::cli::add_run_command(app);
  tandem::cli::add_chat_command(app);
  tandem::cli::add_bench_command(app);
  tandem::cli::add_synth_command(app);
  tandem::cli::add_quantize_command(app);
  tandem::cli::add_kld_command(app);
  tandem::cli::add_tokenize_command(app);
  tandem::cli::add_template_command(app);
  tandem::cli::add_embed_command(app);
  tandem::cli::add_serve_command(app);
  tandem::cli::add_bench_serve_command(app);
  tandem::cli::add_calibrate_command(app);
  tandem::cli::add_bench_spec_command(app);
  tandem::cli::add_train_drafter_command(app);

  try {
    tandem::kernels::best_target();  // a TANDEM_KERNELS this CPU cannot run fails here, before any work
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
