// tandem calibrate: measures the target's forward cost by row count (and a draft model's cost per token) on
// this machine and caches it for the speculative gate.
#include <cstdio>

#include "tandem/cli/commands.h"
#include "tandem/cli/common.h"
#include "tandem/speculative/calibration.h"
#include "tandem/util/error.h"

namespace tandem::cli {

void add_calibrate_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("calibrate",
                         "Measure verify-window costs by row count (and a draft model's cost per token) on "
                         "this machine; cached per model file, CPU and thread count for the adaptive gate");
  struct Opts {
    ModelOptions model;
    std::string draft_model;
    speculative::CalibrateOptions calibrate;
  };
  auto o = std::make_shared<Opts>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--draft-model", o->draft_model, "Also measure this draft model's decode cost per token");
  cmd->add_option(
      "--max-rows", o->calibrate.max_rows,
      "Widest forward measured, in rows: every row count to 16, then 24, 32, 48 and 64 where below "
      "it, and this one (default 64)");
  cmd->add_option(
      "--repeats", o->calibrate.repeats,
      "Timings per row count, each paired with a one-row forward; the median ratio is kept (default 5)");
  cmd->callback([o] {
    auto target = model::Model::load(o->model.model_path, o->model.load_mode());
    std::unique_ptr<model::Model> draft;
    if (!o->draft_model.empty()) draft = model::Model::load(o->draft_model, o->model.load_mode());
    ThreadPool pool(o->model.resolved_threads());
    const auto c =
        speculative::calibrate(*target, o->model.model_path, draft.get(), o->draft_model, pool, o->calibrate);
    const std::string path = speculative::calibration_file_path();
    speculative::store_calibration(path, c);
    std::printf("model %s (%s), CPU %s, %d threads: one-row forward %.3f ms\n", o->model.model_path.c_str(),
                c.model_hash.c_str(), c.cpu.c_str(), c.threads, 1e3 * c.decode_seconds);
    // The measured widths, after the monotone fit; the row counts between them are interpolated.
    std::printf("rows  cost (x one row)  cost per row\n");
    for (int w : c.widths) {
      const auto r = static_cast<size_t>(w);
      std::printf("%4zu  %16.3f  %12.3f\n", r, c.verify[r], c.verify[r] / static_cast<double>(r));
    }
    for (const auto& [hash, cost] : c.draft_per_token)
      std::printf("draft model %s (%s): %.3f of a target decode step per drafted token\n",
                  o->draft_model.c_str(), hash.c_str(), cost);
    std::printf("cached in %s\n", path.c_str());
  });
}

}  // namespace tandem::cli
