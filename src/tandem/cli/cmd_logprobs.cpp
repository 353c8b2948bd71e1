// tandem logprobs: teacher-forced next-token distributions of a continuation, as JSON lines.
#include <algorithm>
#include <cstdio>
#include <numeric>

#include <nlohmann/json.hpp>

#include "tandem/cli/commands.h"
#include "tandem/cli/common.h"
#include "tandem/model/session.h"
#include "tandem/sampling/sampler.h"
#include "tandem/util/error.h"

namespace tandem::cli {

void add_logprobs_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "logprobs",
      "Print, for each continuation position i, the top log-probabilities (log-softmax of the raw logits) of "
      "the "
      "token that follows prompt + continuation[:i], one JSON object per line: {\"pos\": i, \"top\": [[id, "
      "logprob], ...]}");
  struct Opts {
    ModelOptions model;
    std::string prompt_ids, continuation_ids;
    int top = 5;
  };
  auto o = std::make_shared<Opts>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, comma-separated (e.g. 1,403)")
      ->required();
  cmd->add_option("--continuation-ids", o->continuation_ids, "Continuation token ids, comma-separated")
      ->required();
  cmd->add_option("--top", o->top, "Entries per position (default 5)");
  cmd->callback([o] {
    if (o->top <= 0) throw Error("--top must be positive");
    auto prompt = parse_id_list(o->prompt_ids, "--prompt-ids");
    auto cont = parse_id_list(o->continuation_ids, "--continuation-ids");
    auto model = model::Model::load(o->model.model_path, o->model.load_mode());
    ThreadPool pool(o->model.resolved_threads());
    std::vector<int32_t> ids = prompt;
    ids.insert(ids.end(), cont.begin(), cont.end() - 1);
    model::SessionOptions so;
    so.n_ctx = o->model.n_ctx > 0 ? o->model.n_ctx : static_cast<int64_t>(ids.size()) + 1;
    so.kv_type = o->model.resolved_kv_type();
    so.batch = o->model.batch;
    model::Session session(*model, pool, so);
    auto logits = session.eval(ids, /*all_logits=*/true);
    const size_t V = static_cast<size_t>(session.n_vocab());
    const size_t top = std::min(static_cast<size_t>(o->top), V);
    std::vector<double> lp(V);
    std::vector<int32_t> order(V);
    for (size_t i = 0; i < cont.size(); ++i) {
      sampling::log_softmax(logits.subspan((prompt.size() - 1 + i) * V, V), lp);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(top), order.end(),
                        [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
      nlohmann::json j;
      j["pos"] = i;
      j["top"] = nlohmann::json::array();
      for (size_t k = 0; k < top; ++k) j["top"].push_back({order[k], lp[static_cast<size_t>(order[k])]});
      std::printf("%s\n", j.dump().c_str());
    }
  });
}

}  // namespace tandem::cli
