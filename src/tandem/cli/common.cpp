#include "tandem/cli/common.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

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
