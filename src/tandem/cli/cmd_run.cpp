// tandem run: stream a model's continuation of a prompt to stdout; timings go to stderr.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>

#include "tandem/cli/commands.h"
#include "tandem/cli/common.h"
#include "tandem/cli/spec_common.h"
#include "tandem/engine/generate.h"
#include "tandem/kernels/cpu_target.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"

namespace tandem::cli {

void add_sampling_options(CLI::App& cmd, sampling::Params& p, bool& seed_given) {
  cmd.add_option("--temp", p.temperature, "Temperature; 0 is greedy (default 0.8)");
  cmd.add_option("--top-k", p.top_k, "Keep the k most likely tokens; 0 or less disables (default 40)");
  cmd.add_option("--top-p", p.top_p, "Nucleus sampling mass; 1 disables (default 0.95)");
  cmd.add_option("--min-p", p.min_p,
                 "Drop tokens below min-p x the top probability; 0 disables (default 0.05)");
  cmd.add_option("--repeat-penalty", p.repeat_penalty, "Repetition penalty; 1 disables (default 1)");
  cmd.add_option("--repeat-last-n", p.repeat_last_n,
                 "Tokens the penalties look back over (default 64, -1 all)");
  cmd.add_option("--presence-penalty", p.presence_penalty, "Presence penalty (default 0)");
  cmd.add_option("--frequency-penalty", p.frequency_penalty, "Frequency penalty (default 0)");
  cmd.add_option("--seed", p.seed, "Random seed; a seeded run repeats exactly (default: random, printed)")
      ->each([&seed_given](const std::string&) { seed_given = true; });
}

void add_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate a continuation of a prompt, streamed to stdout");
  struct Opts {
    ModelOptions model;
    std::string prompt = "Once upon a time";
    std::string prompt_file, prompt_ids;
    int64_t n_predict = 128;
    sampling::Params sampling;
    bool seed_given = false;
    bool no_bos = false;
    SpecFlags spec;
    GrammarFlags grammar;
    std::string expert_budget;
  };
  auto o = std::make_shared<Opts>();
  add_model_options(*cmd, o->model, /*model_required=*/false);
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text (default: \"Once upon a time\")");
  cmd->add_option("-f,--file", o->prompt_file, "Read the prompt from a file");
  cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt as comma-separated token ids (skips tokenization)");
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate at most (default 128)");
  cmd->add_flag("--no-bos", o->no_bos, "Do not add the BOS token the model asks for");
  add_sampling_options(*cmd, o->sampling, o->seed_given);
  add_spec_options(*cmd, o->spec, /*with_replay=*/false);
  add_grammar_options(*cmd, o->grammar);
  add_expert_budget_option(*cmd, o->expert_budget);
  cmd->callback([o] {
    if (o->model.model_path.empty()) o->model.model_path = default_model_path();
    if (o->n_predict < 0) throw Error("-n must be zero or positive");
    if (!o->seed_given) o->sampling.seed = std::random_device{}();
    sampling::validate(o->sampling);

    auto t0 = std::chrono::steady_clock::now();
    auto model = model::Model::load(o->model.model_path, o->model.load_mode());
    const std::unique_ptr<model::ExpertResidency> residency = make_expert_residency(o->expert_budget, *model);
    auto tok = tokenizer::Tokenizer::from_gguf(model->file());
    ThreadPool pool(o->model.resolved_threads());
    model::SessionOptions so;
    so.n_ctx = o->model.n_ctx;
    so.kv_type = o->model.resolved_kv_type();
    so.batch = o->model.batch;
    so.rollback = o->spec.enabled();  // only a drafter's rounds roll the sequence back
    so.verify_rows = o->spec.draft_max + 1;
    model::Session session(*model, pool, so);
    session.forward().set_expert_residency(residency.get());
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    std::vector<int32_t> prompt;
    if (!o->prompt_ids.empty()) {
      prompt = parse_id_list(o->prompt_ids, "--prompt-ids");
    } else {
      const std::string text = o->prompt_file.empty() ? o->prompt : read_text_file(o->prompt_file);
      prompt = tok->encode(text, /*add_special=*/!o->no_bos, /*parse_special=*/true);
    }
    if (prompt.empty())
      throw Error(
          "the prompt tokenized to nothing; give a non-empty prompt (an empty one starts from BOS only "
          "where the model adds one and --no-bos is not given)");
    std::fprintf(
        stderr, "model: %s (%s, %lld layers), %d threads (kernels %s), context %lld, KV %s, seed %llu\n",
        o->model.model_path.c_str(), model->config().arch.c_str(),
        static_cast<long long>(model->config().n_layer), pool.size(),
        std::string(kernels::target_name(kernels::best_target())).c_str(),
        static_cast<long long>(session.n_ctx()), std::string(cache::kv_type_name(so.kv_type)).c_str(),
        static_cast<unsigned long long>(o->sampling.seed));

    engine::GenerateOptions go;
    go.max_tokens = o->n_predict;
    go.sampling = o->sampling;
    const auto grammar_start = std::chrono::steady_clock::now();
    go.grammar = make_output_grammar(o->grammar, *tok);
    if (go.grammar) {
      // The first mask is built here, so its cost shows apart from the decode steps.
      sampling::TokenMask first_mask;
      go.grammar->clone().fill_mask(first_mask);
      std::fprintf(
          stderr, "grammar: compiled and first mask ready in %.1f ms (%d of %d tokens allowed first)\n",
          1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - grammar_start).count(),
          first_mask.count(), first_mask.n_vocab());
    }
    // The output continues the prompt's text (prompt + output reads as one text), so a generated leading
    // space is printed, after an empty prompt too.
    tokenizer::StreamDecoder decoder(*tok, tokenizer::TextPosition::kContinuation);
    auto on_token = [&](int32_t id) {
      if (tok->is_eog(id)) return false;
      const std::string text = decoder.push(id);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      return true;
    };
    auto is_eog = [&](int32_t id) { return tok->is_eog(id); };
    engine::GenerateStats st;
    std::optional<engine::SpecStats> spec_stats;
    if (o->spec.enabled()) {
      SpecSetup setup = make_spec_setup(o->spec, *model, o->model, pool, so, false);
      setup.options.generate = go;
      engine::SpecStats ss =
          engine::generate_speculative(session, *setup.source, prompt, setup.options, on_token, is_eog);
      st = ss;
      spec_stats = ss;
    } else {
      st = engine::generate(session, prompt, go, on_token, is_eog);
    }
    const std::string rest = decoder.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (spec_stats) print_spec_report(stderr, *spec_stats);
    std::fprintf(stderr, "load: %.2f s (%s)\n", load_s,
                 model->file().copied() ? "copied into memory" : "mapped from the file");
    std::fprintf(stderr, "prompt: %lld tokens in %.3f s (%.1f tok/s)\n",
                 static_cast<long long>(st.prompt_tokens), st.prompt_seconds,
                 st.prompt_seconds > 0 ? st.prompt_tokens / st.prompt_seconds : 0.0);
    std::fprintf(stderr, "generation: %lld tokens in %.3f s (%.1f tok/s)%s\n",
                 static_cast<long long>(st.generated), st.generate_seconds,
                 st.generate_seconds > 0 ? st.generated / st.generate_seconds : 0.0,
                 st.stopped_by_context ? ", stopped at the end of the context" : "");
    if (go.grammar && !spec_stats && st.generated > 0)
      std::fprintf(stderr, "grammar: %.3f ms per token masking and sampling (%.1f%% of a decode step)\n",
                   1e3 * st.grammar_seconds / st.generated,
                   st.generate_seconds > 0 ? 100.0 * st.grammar_seconds / st.generate_seconds : 0.0);
    if (residency)
      std::fprintf(stderr, "expert budget: %s\n",
                   expert_residency_summary(residency->stats(), "the run").c_str());
  });
}

}  // namespace tandem::cli
