// Measured costs that the gate plans with: the target's forward time by row count relative to one decode row,
// and a draft model's decode time per token relative to the target's. Measured on the machine that serves and
// cached in a JSON file, one entry per (target file, CPU model, threads).
//
// Cache file: $XDG_CACHE_HOME/tandem/calibration.json, else $HOME/.cache/tandem/calibration.json.
// Entries are keyed by machine_key(), which carries a revision: a change to what calibration measures or how
// (such as the widths below, or the monotone fit) bumps it, so entries measured the older way are no longer
// found and are measured again; an older build still reads the file (it ignores keys it does not know).
//
// Verify curve. Calibration times the row counts calibration_widths(max_rows) gives (every count to 16, then
// sparse ones up to max_rows; cost_curve.h), fits the measured costs to a non-decreasing curve
// (make_nondecreasing: timing noise must not make a wider forward look cheaper) and stores the dense curve
// verify[1 .. max_rows], linear between the measured widths, with the measured widths beside it ("widths").
// Row counts past max_rows extend the last measured segment (CostModel::extrapolate_from).
//
// Model identity: file_fingerprint(), a 64-bit hash of the file's size and three 1 MiB samples (head, middle,
// tail), in hex. It reads at most 3 MiB, so it is quick for any model; two files that agree on size and all
// three samples are treated as the same model.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/model/model.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/speculative/gate.h"
#include "tandem/util/thread_pool.h"

namespace tandem::speculative {

struct Calibration {
  std::string model_hash;  // file_fingerprint() of the target
  std::string cpu;         // machine_key()
  int threads = 0;
  double decode_seconds = 0;   // one-row target forward (median)
  std::vector<double> verify;  // [rows] cost relative to one row; index 0 unused, verify[1] == 1
  // The row counts measured, ascending from 1, the last one verify.size() - 1; the others of verify[] are
  // interpolated. Empty: every row count was measured.
  std::vector<int> widths;
  std::map<std::string, double> draft_per_token;  // draft model fingerprint -> its decode cost / target's

  // The gate's cost model; draft_hash names a calibrated draft model ("" for drafters of negligible cost).
  CostModel cost_model(const std::string& draft_hash = "") const;
};

std::string file_fingerprint(const std::string& path);
std::string cpu_model_name();
// The CPU model name, the SIMD target the kernels run and the kernels' revision: a calibration measured with
// other kernels (an older build, another target) is not reused.
std::string machine_key();
std::string calibration_file_path();

// The cached entry for (model_hash, cpu, threads), if any. A missing or unreadable cache file gives nullopt.
std::optional<Calibration> load_calibration(const std::string& path, const std::string& model_hash,
                                            const std::string& cpu, int threads);
// The entry of calibration_file_path() for this model file on this machine (machine_key()) with `threads`.
std::optional<Calibration> cached_calibration(const std::string& model_path, int threads);
// Adds or replaces the entry with the same key (written atomically: temporary file, then rename). Throws
// tandem::Error when the file cannot be written.
void store_calibration(const std::string& path, const Calibration& calibration);

struct CalibrateOptions {
  // Widest forward measured, in rows: calibration_widths(max_rows) are timed (at most the model's training
  // context less `context` and one row, when the model states one).
  int max_rows = 64;
  int context = 64;  // tokens in the cache before the measured forwards
  int repeats = 5;   // each row count is timed this often, after a one-row forward each time; the median
                     // ratio is kept
};

// Window costs relative to one row, measured in pairs: each repeat times every width right after a one-row
// forward, and a width's cost is the median of its paired ratios (at least 1). The machine's memory bandwidth
// can drift within seconds: a one-row forward (bound by bandwidth) timed at a fast moment against windows
// (bound by compute) timed at others would skew every ratio, as minima or medians taken separately do.
// run_rows(n) runs one forward of n rows; one_row, when given, receives the one-row times (a repeat with no
// widths still times one).
std::vector<double> paired_window_costs(const std::function<void(int)>& run_rows, std::span<const int> widths,
                                        int repeats, std::vector<double>* one_row = nullptr);

// The widest forward calibrate() measures for `target` with these options: max_rows, or less for a model
// trained on a shorter context. A cached curve narrower than this was measured with smaller options.
int calibrated_rows(const model::Model& target, const CalibrateOptions& options);

// Measures the target (and, when given, a draft model) with `pool`. model_path/draft_path name the files for
// the fingerprints.
Calibration calibrate(const model::Model& target, const std::string& target_path, const model::Model* draft,
                      const std::string& draft_path, ThreadPool& pool, const CalibrateOptions& options);

// The cost of one drafted token of a drafter that reads the target (EAGLE-3, MTP) relative to a target decode
// step of `decode_seconds`: the median over `rounds` of a proposal of `depth` tokens (one real row and depth
// - 1 drafted rows, as each round of speculation runs) after a context of `context` positions (at most n_ctx
// - depth; token ids below `vocab`), divided by depth. The source is begun anew and left empty. `kind` names
// the drafter in errors.
double measure_drafting_cost(DraftSource& source, std::string_view kind, int64_t n_ctx, int64_t vocab,
                             double decode_seconds, int64_t context, int depth, int rounds);

}  // namespace tandem::speculative
