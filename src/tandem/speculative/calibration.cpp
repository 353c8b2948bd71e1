#include "tandem/speculative/calibration.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tandem/kernels/cpu_target.h"
#include "tandem/model/session.h"
#include "tandem/sampling/rng.h"
#include "tandem/speculative/cost_curve.h"
#include "tandem/util/error.h"

namespace tandem::speculative {
namespace {

constexpr size_t kSample = size_t{1} << 20;

uint64_t hash_bytes(uint64_t h, const char* data, size_t n) {
  uint64_t word = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::memcpy(&word, data + i, 8);
    h = sampling::mix64(h ^ word);
  }
  word = 0;
  if (i < n) {
    std::memcpy(&word, data + i, n - i);
    h = sampling::mix64(h ^ word ^ (uint64_t{n - i} << 56));
  }
  return h;
}

// Seconds of one call to fn.
template <typename Fn>
double time_once(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The median of a non-empty set (the mean of the middle two for an even count).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A deterministic token sequence inside the vocabulary (the costs do not depend on which tokens run).
std::vector<int32_t> filler_tokens(int64_t n, int64_t n_vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    ids[static_cast<size_t>(i)] =
        static_cast<int32_t>(sampling::mix64(static_cast<uint64_t>(i)) % static_cast<uint64_t>(n_vocab));
  return ids;
}

nlohmann::json read_cache(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    if (j.is_object() && j.contains("entries") && j["entries"].is_array()) return j;
  } catch (const std::exception&) {
  }
  return nlohmann::json::object();
}

bool same_key(const nlohmann::json& e, const std::string& hash, const std::string& cpu, int threads) {
  return e.value("model_hash", "") == hash && e.value("cpu", "") == cpu && e.value("threads", 0) == threads;
}

}  // namespace

CostModel Calibration::cost_model(const std::string& draft_hash) const {
  CostModel c;
  c.verify = verify;
  if (c.verify.size() < 2) c.verify = {1.0, 1.0};
  // Past the curve's end, along its last measured segment.
  if (widths.size() >= 2 && static_cast<size_t>(widths.back()) + 1 == c.verify.size())
    c.extrapolate_from = widths[widths.size() - 2];
  if (!draft_hash.empty()) {
    auto it = draft_per_token.find(draft_hash);
    if (it != draft_per_token.end()) c.draft_per_token = it->second;
  }
  return c;
}

std::string file_fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read '" + path + "' to fingerprint it");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  uint64_t h = sampling::mix64(size);
  std::vector<char> buf(kSample);
  const uint64_t offsets[] = {0, size / 2 > kSample / 2 ? size / 2 - kSample / 2 : 0,
                              size > kSample ? size - kSample : 0};
  for (uint64_t off : offsets) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(off));
    in.read(buf.data(), static_cast<std::streamsize>(std::min<uint64_t>(kSample, size - off)));
    h = hash_bytes(h, buf.data(), static_cast<size_t>(in.gcount()));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    if (key == "model name" || key == "Model" || key == "Hardware") {
      const auto start = line.find_first_not_of(" \t", colon + 1);
      return start == std::string::npos ? "unknown" : line.substr(start);
    }
  }
  return "unknown";
}

std::string machine_key() {
  // Bump kKernelRevision whenever kernel (or calibration) changes move the verify cost curve.
  constexpr int kKernelRevision = 57;
  return cpu_model_name() + " | " + std::string(kernels::target_name(kernels::best_target())) + " r" +
         std::to_string(kKernelRevision);
}

std::string calibration_file_path() {
  namespace fs = std::filesystem;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return (fs::path(xdg) / "tandem" / "calibration.json").string();
  if (const char* home = std::getenv("HOME"); home && *home)
    return (fs::path(home) / ".cache" / "tandem" / "calibration.json").string();
  return (fs::path(".cache") / "tandem" / "calibration.json").string();
}

std::optional<Calibration> load_calibration(const std::string& path, const std::string& model_hash,
                                            const std::string& cpu, int threads) {
  const nlohmann::json j = read_cache(path);
  if (!j.contains("entries")) return std::nullopt;
  for (const auto& e : j["entries"]) {
    if (!same_key(e, model_hash, cpu, threads)) continue;
    try {
      Calibration c;
      c.model_hash = model_hash;
      c.cpu = cpu;
      c.threads = threads;
      c.decode_seconds = e.value("decode_seconds", 0.0);
      c.verify = e.at("verify").get<std::vector<double>>();
      if (e.contains("widths")) c.widths = e["widths"].get<std::vector<int>>();
      if (e.contains("draft_per_token"))
        c.draft_per_token = e["draft_per_token"].get<std::map<std::string, double>>();
      if (c.verify.size() < 2) return std::nullopt;
      return c;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::optional<Calibration> cached_calibration(const std::string& model_path, int threads) {
  return load_calibration(calibration_file_path(), file_fingerprint(model_path), machine_key(), threads);
}

void store_calibration(const std::string& path, const Calibration& c) {
  namespace fs = std::filesystem;
  nlohmann::json j = read_cache(path);
  if (!j.contains("entries")) j = {{"version", 1}, {"entries", nlohmann::json::array()}};
  nlohmann::json entries = nlohmann::json::array();
  std::map<std::string, double> drafts = c.draft_per_token;
  for (const auto& e : j["entries"]) {
    if (!same_key(e, c.model_hash, c.cpu, c.threads)) {
      entries.push_back(e);
      continue;
    }
    // Keep the draft models measured earlier against the same target unless this calibration re-measured
    // them.
    if (e.contains("draft_per_token") && e["draft_per_token"].is_object())
      for (const auto& [hash, cost] : e["draft_per_token"].items())
        if (cost.is_number()) drafts.emplace(hash, cost.get<double>());
  }
  entries.push_back({{"model_hash", c.model_hash},
                     {"cpu", c.cpu},
                     {"threads", c.threads},
                     {"decode_seconds", c.decode_seconds},
                     {"verify", c.verify},
                     {"widths", c.widths},
                     {"draft_per_token", drafts}});
  j["entries"] = std::move(entries);
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    if (!out) throw Error("cannot write the calibration cache '" + tmp + "'");
    out << j.dump(2) << "\n";
    if (!out) throw Error("cannot write the calibration cache '" + tmp + "'");
  }
  fs::rename(tmp, path, ec);
  if (ec) throw Error("cannot replace the calibration cache '" + path + "': " + ec.message());
}

std::vector<double> paired_window_costs(const std::function<void(int)>& run_rows, std::span<const int> widths,
                                        int repeats, std::vector<double>* one_row) {
  std::vector<std::vector<double>> ratios(widths.size());
  for (int rep = 0; rep < repeats; ++rep) {
    for (size_t i = 0; i < std::max<size_t>(1, widths.size()); ++i) {
      const double t1 = time_once([&] { run_rows(1); });
      if (one_row) one_row->push_back(t1);
      if (i < widths.size()) ratios[i].push_back(time_once([&] { run_rows(widths[i]); }) / t1);
    }
  }
  std::vector<double> costs;
  for (const auto& r : ratios) costs.push_back(r.empty() ? 1.0 : std::max(1.0, median(r)));
  return costs;
}

int calibrated_rows(const model::Model& target, const CalibrateOptions& o) {
  // The measured windows sit after the context; a model trained on a shorter context keeps them inside it.
  const int64_t trained = target.config().n_ctx_train;
  if (trained <= 0) return std::max(1, o.max_rows);
  return static_cast<int>(std::clamp<int64_t>(trained - o.context - 1, 1, std::max(1, o.max_rows)));
}

Calibration calibrate(const model::Model& target, const std::string& target_path, const model::Model* draft,
                      const std::string& draft_path, ThreadPool& pool, const CalibrateOptions& o) {
  if (o.max_rows < 1 || o.context < 1 || o.repeats < 1)
    throw Error("calibration needs max_rows, context and repeats >= 1");
  Calibration c;
  c.model_hash = file_fingerprint(target_path);
  c.cpu = machine_key();
  c.threads = pool.size();

  const int max_rows = calibrated_rows(target, o);
  model::SessionOptions so;
  so.n_ctx = o.context + max_rows + 1;
  so.batch = std::max<int64_t>(256, max_rows);
  model::Session session(target, pool, so);
  const auto tokens = filler_tokens(o.context + max_rows, session.n_vocab());
  const std::span<const int32_t> all(tokens);
  session.eval(all.first(static_cast<size_t>(o.context)));
  const std::span<const int32_t> window = all.subspan(static_cast<size_t>(o.context));

  const auto run_rows = [&](int rows) {
    session.eval(window.first(static_cast<size_t>(rows)), /*all_logits=*/true);
    session.truncate(o.context);
  };
  run_rows(1);  // warm up caches and thread team
  c.widths = calibration_widths(max_rows);
  std::vector<double> one_row;
  const std::vector<double> measured =
      paired_window_costs(run_rows, std::span<const int>(c.widths).subspan(1), o.repeats, &one_row);
  c.decode_seconds = median(one_row);
  std::vector<double> costs = {1.0};
  costs.insert(costs.end(), measured.begin(), measured.end());
  c.verify = interpolate_curve(c.widths, nondecreasing(costs));

  if (draft) {
    model::Session ds(*draft, pool, so);
    const auto dt = filler_tokens(o.context + 1, ds.n_vocab());
    const std::span<const int32_t> dall(dt);
    ds.eval(dall.first(static_cast<size_t>(o.context)));
    const auto draft_token = [&] {
      ds.eval(dall.subspan(static_cast<size_t>(o.context), 1));
      ds.truncate(o.context);
    };
    draft_token();  // warm up
    std::vector<double> draft_ratios;
    for (int rep = 0; rep < 2 * o.repeats + 1; ++rep) {
      const double t1 = time_once([&] { run_rows(1); });
      draft_ratios.push_back(time_once(draft_token) / t1);
    }
    c.draft_per_token[file_fingerprint(draft_path)] = median(draft_ratios);
  }
  return c;
}

double measure_drafting_cost(DraftSource& source, std::string_view kind, int64_t n_ctx, int64_t vocab,
                             double decode_seconds, int64_t context, int depth, int rounds) {
  if (!(decode_seconds > 0) || context < 2 || depth < 1 || rounds < 1 || vocab < 1)
    throw Error("measuring the " + std::string(kind) +
                " drafter's cost needs a positive decode time, context, depth and vocabulary");
  const int64_t n = std::max<int64_t>(2, std::min<int64_t>(context, n_ctx - depth));
  std::vector<int32_t> committed(static_cast<size_t>(n));
  for (size_t i = 0; i < committed.size(); ++i) committed[i] = static_cast<int32_t>((7 * i + 1) % vocab);
  DraftSettings settings;
  settings.sampling.temperature = 0.0f;
  source.begin(committed, settings);
  Draft draft;
  source.propose(committed, depth, draft);  // the real rows, once, as the target's prompt would
  source.accept(committed, 0);
  std::vector<double> seconds;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    source.propose(committed, depth, draft);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    source.accept(committed, 0);
  }
  std::nth_element(seconds.begin(), seconds.begin() + rounds / 2, seconds.end());
  source.begin({}, settings);
  return seconds[static_cast<size_t>(rounds / 2)] / depth / decode_seconds;
}

}  // namespace tandem::speculative
