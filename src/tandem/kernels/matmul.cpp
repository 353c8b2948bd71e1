#include "tandem/kernels/matmul.h"

#include <algorithm>

#include "tandem/kernels/float_gemm.h"
#include "tandem/kernels/float_kernels.h"
#include "tandem/kernels/ops.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/quant.h"
#include "tandem/util/error.h"

namespace tandem::kernels {
namespace {

// Output features per scheduling unit: threads take equal contiguous runs of whole units.
constexpr int64_t kOutputGrain = 16;
// The same for the encoder GEMM: a whole number of its panels on every target (16 or 32 weight rows), as each
// range a thread takes is one more pass over the activations.
constexpr int64_t kGemmGrain = 32;

}  // namespace

MatmulScratch::MatmulScratch(int n_threads, int64_t max_cols, int64_t max_rows, Target target)
    : supers_(static_cast<size_t>(super_count(max_cols))), max_cols_(max_cols), target_(target) {
  unpacked_.resize(supers_ * static_cast<size_t>(n_threads));
  file_rows_.resize(supers_ * kFileRowBytesPerSuper * static_cast<size_t>(n_threads));
  own_.resize(static_cast<size_t>(n_threads));
  for (OwnActivations& own : own_) own.act.resize(supers_ * static_cast<size_t>(kMaxWindowRows));
  reserve_rows(max_rows);
}

void MatmulScratch::reserve_rows(int64_t rows) {
  if (rows <= max_rows_) return;
  max_rows_ = rows;
  act_.resize(supers_ * static_cast<size_t>(rows));
}

const QuantKernels& quant_kernels(Target t) {
  switch (t) {
    case Target::kAVX512:
      return quant_kernels_avx512();
    case Target::kAVX512VBMI:
      return quant_kernels_avx512_vbmi();
    case Target::kAMX:
      return quant_kernels_amx();
    case Target::kAVX2:
      return quant_kernels_avx2();
    case Target::kAVX2VNNI:
      return quant_kernels_avx2_vnni();
    case Target::kNEON:
      return quant_kernels_neon();
    case Target::kNEONDot:
      return quant_kernels_neon_dot();
    default:
      return quant_kernels_scalar();
  }
}

float dot_f32(const float* a, const float* b, int64_t n) {
  return interleaved_sum8<float>(n, [a, b](int64_t i) { return a[i] * b[i]; });
}

namespace {

// The activation form a quantized matrix meets on a target (ActForm).
ActForm activation_form(const QuantKernels& qk, const MatrixView& w) {
  if (w.form == WeightForm::kLanePairs && qk.lane_pairs) return ActForm::kLanePairs;
  if (w.form == WeightForm::kRowTiles && qk.row_tiles) return ActForm::kNatural;
  if (in_k4_block_lanes(qk, w.type)) return ActForm::kSuperLanes;
  return per_super_activations(w.type) ? ActForm::kSupers : ActForm::kBlocks;
}

// Whether the matrices can share one quantized copy of the activations (same width, same activation form).
bool shares_activations(const QuantKernels& qk, std::span<const MatmulOut> outs) {
  const MatrixView& w0 = *outs[0].w;
  if (!is_quantized_weight(w0.type)) return false;
  for (const MatmulOut& o : outs)
    if (!is_quantized_weight(o.w->type) || o.w->cols != w0.cols ||
        activation_form(qk, *o.w) != activation_form(qk, w0))
      return false;
  return true;
}

void float_matmul(const MatrixView& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool) {
  TANDEM_CHECK(w.type == DType::F32 || w.type == DType::F16 || w.type == DType::BF16,
               "matmul: unsupported weight type " + std::string(dtype_name(w.type)));
  const int64_t N = w.rows, K = w.cols;
  pool.parallel_for_stealing(N, kOutputGrain, [&](int64_t o0, int64_t o1, int) {
    float_matmul_rows(w.type, w.data, w.row_bytes, o0, o1, K, x, K, n_rows, y, N);
  });
}

// Output rows [o0, o1) of one quantized matrix over activations already quantized.
// y: row r's outputs at y + r * y_stride.
void quant_rows(const QuantKernels& qk, const MatrixView& w, const ActSuper* act, int64_t n_rows, float* y,
                int64_t y_stride, int64_t o0, int64_t o1, UnpackedSuper* buf, uint8_t* file_row,
                PrefetchReach reach) {
  const int64_t K = w.cols, ns = super_count(K);
  const bool signed_codes = w.type == DType::Q8_0 && qk.signed_q8;
  // Decode and verify windows: one pass over the weights, each weight row decoded once for all rows (straight
  // from the file bytes where the target has a direct kernel). Prefill: the same per chunk of activation
  // rows, so a chunk stays in cache while the weights stream by.
  // More rows than one direct pass takes (direct_pass_rows) go in passes of near-equal size (9 rows: 4 + 5,
  // not 8 + 1: a pass of one or two rows decodes every weight super-block for too few rows), all passes over
  // one block of kOutputGrain weight rows before the next, so that later passes read those rows from the L2
  // cache (over a thread's whole share, 1-2 MB at TinyLlama's FFN, they came from memory again). Targets
  // whose direct kernels take no passes (QuantKernels::direct_prefill) unpack the rows of wider matmuls.
  // (Row tiles meet the direct kernels only on targets that read them; others unpack their rows.)
  const bool tiles_unread = w.form == WeightForm::kRowTiles && !qk.row_tiles;
  const int64_t direct = tiles_unread ? 0 : qk.direct_pass_rows(w.type, w.form, K, signed_codes);
  if (direct > 0 && (n_rows <= direct || qk.direct_prefill)) {
    const int64_t passes = (n_rows + direct - 1) / direct;
    const int64_t block = passes == 1 ? o1 - o0 : kOutputGrain;
    for (int64_t b0 = o0; b0 < o1; b0 += block) {
      const int64_t b1 = std::min(o1, b0 + block);
      for (int64_t p = 0, r0 = 0; p < passes; ++p) {
        const int64_t nr = (n_rows - r0) / (passes - p);
        qk.direct_rows(w.type, w.form, w.row(b0), static_cast<int64_t>(w.row_bytes), b1 - b0, K,
                       act + r0 * ns, ns, nr, y + r0 * y_stride + b0, y_stride, reach);
        r0 += nr;
      }
    }
    return;
  }
  // (Lane-pair activations meet only the direct kernels, which take every row count.)
  TANDEM_CHECK(!(w.form == WeightForm::kLanePairs && qk.lane_pairs),
               "matmul: lane pairs without direct kernels");
  const int64_t chunk = n_rows <= kMaxWindowRows ? n_rows : kPrefillChunk;
  for (int64_t r0 = 0; r0 < n_rows; r0 += chunk) {
    const int64_t nr = std::min(chunk, n_rows - r0);
    for (int64_t o = o0; o < o1; ++o) {
      if (tiles_unread) {
        file_form_row(w, o, file_row);
        qk.unpack_row(w.type, WeightForm::kFile, file_row, K, signed_codes, buf);
      } else {
        qk.unpack_row(w.type, w.form, w.row(o), K, signed_codes, buf);
      }
      qk.dot_rows(buf, ns, act + r0 * ns, ns, nr, w.type, signed_codes, y + r0 * y_stride + o, y_stride);
    }
  }
}

}  // namespace

void matmul_group(std::span<const MatmulOut> outs, const float* x, int64_t n_rows, ThreadPool& pool,
                  MatmulScratch& scratch) {
  if (n_rows <= 0 || outs.empty()) return;
  const QuantKernels& qk = quant_kernels(scratch.target());
  if (!shares_activations(qk, outs)) {
    // Runs of adjacent matrices that can share one quantized copy, one call each (Q4_K_M's query and key in
    // lane pairs, then a Q6_K value), and float matrices one at a time.
    for (size_t i = 0, j; i < outs.size(); i = j) {
      j = i + 1;
      if (!is_quantized_weight(outs[i].w->type)) {
        float_matmul(*outs[i].w, x, n_rows, outs[i].y, pool);
        continue;
      }
      while (j < outs.size() && shares_activations(qk, outs.subspan(i, j + 1 - i))) ++j;
      matmul_group(outs.subspan(i, j - i), x, n_rows, pool, scratch);
    }
    return;
  }
  const int64_t K = outs[0].w->cols;
  TANDEM_CHECK(K <= scratch.max_cols(), "matmul scratch too small");
  scratch.reserve_rows(n_rows);
  const int64_t ns = super_count(K);
  const ActForm form = activation_form(qk, *outs[0].w);
  ActSuper* act = scratch.activations();

  // Each activation row is quantized once per call: the rows of a wide call in parallel into the shared
  // buffer; up to kOwnActivationRows rows by every thread into its own copy as it takes its first chunk, so
  // that no thread writes lines another has read. One or two rows quantized on the caller into the shared
  // buffer (as before) waited on the other threads' copies of its lines, read by the call before, being
  // invalidated, several times as long as quantizing into a buffer of the caller's own, the other thread
  // idle meanwhile. Own copies made decode and windows of up to four rows faster, wider ones alike or slower
  // (performance.md).
  const bool own = n_rows <= kOwnActivationRows;
  const uint64_t call = scratch.next_call();
  if (!own) {
    pool.parallel_for(n_rows, 1, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) qk.quantize_row(x + r * K, K, form, act + r * ns);
    });
  }

  // The output rows of all matrices, end to end, in units of kOutputGrain rows of one matrix. Each thread
  // streams its own contiguous share of them and then steals from the others' tails
  // (parallel_for_stealing), so its weight reads, and the kernels' software prefetch ahead of them, run on
  // in address order; handed out in guided chunks instead, each thread's reads jumped at every chunk and
  // the prefetch ran into rows another thread took. Decode steps took less time in either memory state, and
  // windows, which bind on arithmetic, a little less (performance.md).
  int64_t units = 0;
  for (const MatmulOut& o : outs) units += (o.w->rows + kOutputGrain - 1) / kOutputGrain;
  pool.parallel_for_stealing(units, 1, [&](int64_t u0, int64_t u1, int thread) {
    UnpackedSuper* buf = scratch.unpack_buffer(thread);
    const ActSuper* a = act;
    if (own) {
      ActSuper* mine = scratch.own_activations(thread);
      if (scratch.fill_own(thread, call))
        for (int64_t r = 0; r < n_rows; ++r) qk.quantize_row(x + r * K, K, form, mine + r * ns);
      a = mine;
    }
    int64_t first = 0;  // first unit of the current matrix
    for (const MatmulOut& o : outs) {
      const int64_t n = (o.w->rows + kOutputGrain - 1) / kOutputGrain;
      const int64_t b = std::max(u0, first), e = std::min(u1, first + n);
      if (b < e)
        quant_rows(qk, *o.w, a, n_rows, o.y, o.w->rows, (b - first) * kOutputGrain,
                   std::min(o.w->rows, (e - first) * kOutputGrain), buf, scratch.file_row_buffer(thread),
                   scratch.prefetch_reach());
      first += n;
    }
  });
}

namespace {

// Float matrices of one input through the encoder GEMM in one parallel region: their output rows end to end
// in units of kGemmGrain rows of one matrix, shared out as matmul_group shares its units.
void gemm_group(std::span<const MatmulOut> outs, const float* x, int64_t n_rows, ThreadPool& pool) {
  int64_t units = 0;
  for (const MatmulOut& o : outs) {
    const DType t = o.w->type;
    TANDEM_CHECK(t == DType::F32 || t == DType::F16 || t == DType::BF16,
                 "matmul: unsupported weight type " + std::string(dtype_name(t)));
    units += (o.w->rows + kGemmGrain - 1) / kGemmGrain;
  }
  pool.parallel_for_stealing(units, 1, [&](int64_t u0, int64_t u1, int) {
    int64_t first = 0;  // first unit of the current matrix
    for (const MatmulOut& o : outs) {
      const MatrixView& w = *o.w;
      const int64_t n = (w.rows + kGemmGrain - 1) / kGemmGrain;
      const int64_t b = std::max(u0, first), e = std::min(u1, first + n);
      if (b < e)
        float_gemm_rows(w.type, w.data, w.row_bytes, (b - first) * kGemmGrain,
                        std::min(w.rows, (e - first) * kGemmGrain), w.cols, x, w.cols, n_rows, o.y, w.rows);
      first += n;
    }
  });
}

}  // namespace

void encoder_matmul_group(std::span<const MatmulOut> outs, const float* x, int64_t n_rows, ThreadPool& pool,
                          MatmulScratch& scratch) {
  if (n_rows <= 0) return;
  // Runs of adjacent float matrices through the GEMM, runs of quantized ones through matmul_group.
  for (size_t i = 0, j; i < outs.size(); i = j) {
    const bool quantized = is_quantized_weight(outs[i].w->type);
    j = i + 1;
    while (j < outs.size() && is_quantized_weight(outs[j].w->type) == quantized) ++j;
    if (quantized)
      matmul_group(outs.subspan(i, j - i), x, n_rows, pool, scratch);
    else
      gemm_group(outs.subspan(i, j - i), x, n_rows, pool);
  }
}

void encoder_matmul(const MatrixView& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool,
                    MatmulScratch& scratch) {
  if (w.rows <= 0) return;
  const MatmulOut out{&w, y};
  encoder_matmul_group(std::span<const MatmulOut>(&out, 1), x, n_rows, pool, scratch);
}

void matmul(const MatrixView& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool,
            MatmulScratch& scratch) {
  if (n_rows <= 0 || w.rows <= 0) return;
  if (!is_quantized_weight(w.type)) return float_matmul(w, x, n_rows, y, pool);
  const MatmulOut out{&w, y};
  matmul_group(std::span<const MatmulOut>(&out, 1), x, n_rows, pool, scratch);
}

void matmul_on_thread(const MatrixView& w, const float* x, int64_t x_stride, int64_t n_rows, float* y,
                      int64_t y_stride, MatmulScratch& scratch, int thread, uint64_t call) {
  if (n_rows <= 0 || w.rows <= 0) return;
  const int64_t N = w.rows, K = w.cols;
  if (!is_quantized_weight(w.type)) {
    TANDEM_CHECK(w.type == DType::F32 || w.type == DType::F16 || w.type == DType::BF16,
                 "matmul: unsupported weight type " + std::string(dtype_name(w.type)));
    float_matmul_rows(w.type, w.data, w.row_bytes, 0, N, K, x, x_stride, n_rows, y, y_stride);
    return;
  }
  TANDEM_CHECK(K <= scratch.max_cols(), "matmul scratch too small");
  const QuantKernels& qk = quant_kernels(scratch.target());
  const ActForm form = activation_form(qk, w);
  const int64_t ns = super_count(K);
  // The thread's own activations: under a call number all rows of a window at once, kept for the call's
  // other tasks on this thread and multiplied in matmul()'s passes; otherwise kOwnActivationRows rows at a
  // time (each row's result depends only on that row, so the grouping changes no bits). They are refilled by
  // the next matmul call (a new call number).
  ActSuper* act = scratch.own_activations(thread);
  if (call != 0 && n_rows <= kMaxWindowRows) {
    if (scratch.fill_own(thread, call))
      for (int64_t r = 0; r < n_rows; ++r) qk.quantize_row(x + r * x_stride, K, form, act + r * ns);
    quant_rows(qk, w, act, n_rows, y, y_stride, 0, N, scratch.unpack_buffer(thread),
               scratch.file_row_buffer(thread), scratch.prefetch_reach());
    return;
  }
  scratch.forget_own(thread);
  for (int64_t r0 = 0; r0 < n_rows; r0 += kOwnActivationRows) {
    const int64_t nr = std::min(kOwnActivationRows, n_rows - r0);
    for (int64_t r = 0; r < nr; ++r) qk.quantize_row(x + (r0 + r) * x_stride, K, form, act + r * ns);
    quant_rows(qk, w, act, nr, y + r0 * y_stride, y_stride, 0, N, scratch.unpack_buffer(thread),
               scratch.file_row_buffer(thread), scratch.prefetch_reach());
  }
}

void matmul_reference(const MatrixView& w, const float* x, int64_t n_rows, float* y) {
  std::vector<float> buf(static_cast<size_t>(w.cols));
  std::vector<uint8_t> file_row(w.row_bytes);
  for (int64_t o = 0; o < w.rows; ++o) {
    file_form_row(w, o, file_row.data());
    dequantize_row(w.type, file_row.data(), buf.data(), w.cols);
    for (int64_t r = 0; r < n_rows; ++r) {
      double acc = 0;
      for (int64_t k = 0; k < w.cols; ++k) acc += static_cast<double>(buf[k]) * x[r * w.cols + k];
      y[r * w.rows + o] = static_cast<float>(acc);
    }
  }
}

}  // namespace tandem::kernels
