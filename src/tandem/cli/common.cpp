#include "tandem/cli/common.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tandem/model/moe.h"
#include "tandem/util/error.h"
#include "tandem/util/thread_pool.h"

namespace tandem::cli {

int ModelOptions::resolved_threads() const {
  if (threads < 0) throw Error("thread count (-t) must be positive");
  return threads > 0 ? threads : ThreadPool::physical_cores();
}

cache::KvType ModelOptions::resolved_kv_type() const {
  return cache::kv_type_from_name(kv_type);
}

void add_model_options(CLI::App& cmd, ModelOptions& o, bool model_required) {
  auto* m = cmd.add_option("-m,--model", o.model_path, "GGUF model file");
  if (model_required) m->required();
  cmd.add_option("-t,--threads", o.threads, "Threads (default, or 0: physical cores)");
  cmd.add_option("-c,--ctx-size", o.n_ctx,
                 "Context size in tokens (default, or 0: the model's, at most 4096)");
  cmd.add_option(
      "--kv-type", o.kv_type,
      "KV cache type: f16 (default), f32, q8_0, q4, or q4r (4-bit after a per-head random rotation)");
  cmd.add_option("-b,--batch-size", o.batch, "Prompt tokens per forward (default 256)")
      ->check(CLI::Range(1, 1 << 16));
  auto* map =
      cmd.add_flag("--mmap", o.mmap,
                   "Map the model file instead of copying it into memory (by default it is copied when "
                   "it fits in half of the available memory, else mapped)");
  auto* copy =
      cmd.add_flag("--no-mmap", o.no_mmap,
                   "Copy the model file into memory (2 MB pages where the system gives them) even when "
                   "it does not fit in half of the available memory");
  map->excludes(copy);
}

gguf::LoadMode ModelOptions::load_mode() const {
  return mmap ? gguf::LoadMode::kMap : no_mmap ? gguf::LoadMode::kCopy : gguf::LoadMode::kAuto;
}

void add_expert_budget_option(CLI::App& cmd, std::string& budget) {
  cmd.add_option("--expert-budget", budget,
                 "Keep the most-read routed experts of a mixture-of-experts model resident (copied) within "
                 "SIZE bytes (suffix K, M or G; or a percentage of the routed experts' bytes, e.g. 50%), the "
                 "rest read from the model file; reports the fraction of expert reads served resident")
      ->type_name("SIZE");
}

size_t parse_expert_budget(const std::string& text, size_t experts) {
  const auto bad = [&] {
    return Error("--expert-budget '" + text + "': expected a size such as 4G, 512M or 50% (of the experts)");
  };
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  if (!(value >= 0)) throw bad();
  const std::string suffix = text.substr(used);
  double scale = 1;
  if (suffix == "%") {
    if (value > 100) throw bad();
    return static_cast<size_t>(value / 100.0 * static_cast<double>(experts));
  }
  if (suffix == "K" || suffix == "k")
    scale = 1024.0;
  else if (suffix == "M" || suffix == "m")
    scale = 1024.0 * 1024.0;
  else if (suffix == "G" || suffix == "g")
    scale = 1024.0 * 1024.0 * 1024.0;
  else if (!suffix.empty())
    throw bad();
  return static_cast<size_t>(value * scale);
}

std::unique_ptr<model::ExpertResidency> make_expert_residency(const std::string& budget,
                                                              const model::Model& model) {
  if (budget.empty()) return nullptr;
  const size_t bytes = parse_expert_budget(budget, model::expert_bytes(model).routed_all);
  return std::make_unique<model::ExpertResidency>(model, bytes);
}

std::string expert_residency_summary(const model::ResidencyStats& s, const std::string& reader) {
  char line[256];
  std::snprintf(line, sizeof line,
                "%.1f MB: %.1f MB resident (%lld of %lld experts); %s read %.1f%% of its expert bytes from "
                "resident copies",
                static_cast<double>(s.budget_bytes) / 1e6, static_cast<double>(s.resident_bytes) / 1e6,
                static_cast<long long>(s.resident_experts), static_cast<long long>(s.experts), reader.c_str(),
                100.0 * s.served_resident());
  return line;
}

std::string default_model_path() {
  if (const char* env = std::getenv("TANDEM_MODEL"); env && *env) return env;
  const std::string fallback = "../shared/models/stories260K.gguf";
  if (std::filesystem::exists(fallback)) return fallback;
  throw Error("no model given: pass one with -m FILE.gguf (or set TANDEM_MODEL)");
}

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      throw Error(what + ": '" + item +
                  "' is not a token id (expected comma-separated integers, e.g. 1,403)");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw Error(what + " is empty");
  return ids;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace tandem::cli
