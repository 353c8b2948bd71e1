// Matrix multiplication of activations by a weight matrix in its file format, for any number of rows.
//
// The kernel is chosen by row class once per call: one row (decode), a window of 2..16 rows (speculative
// verify: each weight row is decoded once and applied to every row of the window) and many rows (prefill:
// activation rows in cache-sized chunks). Quantized weights multiply 8-bit activations (each activation row
// quantized once per call, 32-element blocks) with integer dot products; F32/F16/BF16 weights multiply f32
// activations. Where the target has direct kernels for the type (quant_layout.h), weight rows are decoded
// from their file bytes straight into registers for up to 8 activation rows at a time (decode, windows and
// prefill tiles); otherwise each weight row is unpacked once into a per-thread buffer.
//
// Every row's result depends only on that row (fixed reduction order per output element, the same in every
// row class), so a row computes the same bits alone, inside a verify window or in a batch: the basis of exact
// speculative and batched decoding.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/kernels/cpu_target.h"
#include "tandem/kernels/quant_layout.h"
#include "tandem/tensor/weight.h"
#include "tandem/util/thread_pool.h"

namespace tandem::kernels {

// Row classes (the boundaries are part of the kernel contract, not tuning knobs: results do not depend on
// them).
constexpr int64_t kMaxWindowRows = 16;  // 2..16 rows: a verify window
constexpr int64_t kPrefillChunk = 64;   // many rows: activation rows per pass over the weights

// Calls of at most this many rows (decode, short windows) quantize their activations on every thread into
// its own copy (MatmulScratch::own_activations): see matmul_group.
constexpr int64_t kOwnActivationRows = 4;

// Scratch for matmul, sized once for the widest matrix and the most rows (no allocation per call):
// quantized activations [max_rows][super_count(max_cols)], per thread one unpacked weight row, one row in the
// file's form and its own copy of the activations of up to kMaxWindowRows rows.
class MatmulScratch {
 public:
  MatmulScratch() = default;
  MatmulScratch(int n_threads, int64_t max_cols, int64_t max_rows = 1, Target target = best_target());

  int64_t max_cols() const { return max_cols_; }
  int64_t max_rows() const { return max_rows_; }
  Target target() const { return target_; }
  ActSuper* activations() { return act_.data(); }
  UnpackedSuper* unpack_buffer(int thread) {
    return unpacked_.data() + static_cast<size_t>(thread) * supers_;
  }
  // Thread `thread`'s buffer for one weight row in the file's form (a row of a form its target's kernels do
  // not read: row tiles).
  uint8_t* file_row_buffer(int thread) {
    return file_rows_.data() + static_cast<size_t>(thread) * supers_ * kFileRowBytesPerSuper;
  }
  // Thread `thread`'s own activations [kMaxWindowRows][super_count(max_cols)] (matmul_group fills up to
  // kOwnActivationRows rows of them, matmul_on_thread up to kMaxWindowRows). fill_own(thread, call)
  // is true once per call number for each thread (the first time that thread asks): it then quantizes
  // them. Each thread touches only its own entry, a cache line apart from the others'.
  ActSuper* own_activations(int thread) { return own_[static_cast<size_t>(thread)].act.data(); }
  bool fill_own(int thread, uint64_t call) {
    uint64_t& last = own_[static_cast<size_t>(thread)].call;
    if (last == call) return false;
    last = call;
    return true;
  }
  // Marks thread `thread`'s own activations as overwritten outside any call number (fill_own is then true for
  // every number).
  void forget_own(int thread) { own_[static_cast<size_t>(thread)].call = 0; }
  // A new call number for fill_own (on the calling thread, before the parallel region).
  uint64_t next_call() { return ++calls_; }
  // Grows the activation buffer (called outside the steady state only: the first call with more rows).
  void reserve_rows(int64_t rows);
  // The direct kernels' prefetch reach for the matmuls that take this scratch (PrefetchReach).
  PrefetchReach prefetch_reach() const { return reach_; }
  void set_prefetch_reach(PrefetchReach reach) { reach_ = reach; }

 private:
  struct alignas(64) OwnActivations {
    std::vector<ActSuper> act;
    uint64_t call = 0;
  };
  std::vector<ActSuper> act_;
  // The most bytes a quantized row takes per 256 elements in the file (Q8_0).
  static constexpr size_t kFileRowBytesPerSuper = 272;
  std::vector<UnpackedSuper> unpacked_;
  std::vector<uint8_t> file_rows_;
  std::vector<OwnActivations> own_;
  uint64_t calls_ = 0;
  size_t supers_ = 0;  // super_count(max_cols)
  int64_t max_cols_ = 0;
  int64_t max_rows_ = 0;
  Target target_ = Target::kScalar;
  PrefetchReach reach_ = PrefetchReach::kNear;
};

// y[r][o] = sum_k W[o][k] * x[r][k]
//   w: [rows = N, cols = K] in its block format; x: [n_rows, K] f32 (row stride K); y: [n_rows, N] f32
//   (stride N). scratch: made for at least pool.size() threads and K columns.
void matmul(const MatrixView& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool,
            MatmulScratch& scratch);

// One output of matmul_group: y = x W^T for weights w ([rows = N, cols = K]; y: [n_rows, N], stride N).
struct MatmulOut {
  const MatrixView* w;
  float* y;
};

// Several matmuls of the same input (a layer's q, k and v, or its gate and up projections) in one parallel
// region: the activations are quantized once and the threads share one pool of work, so there is one
// barrier instead of one per matrix. Each result is bit-identical to matmul() of that matrix alone.
void matmul_group(std::span<const MatmulOut> outs, const float* x, int64_t n_rows, ThreadPool& pool,
                  MatmulScratch& scratch);

// The products of an encoder's forward (model/encoder.cpp): matmul_group's, with float weights (F32, F16,
// BF16) through the encoder GEMM (float_gemm.h) instead of the row classes' kernels, and quantized weights as
// matmul_group multiplies them. The GEMM's sum order differs from the row classes' but depends on nothing but
// the width, so a row gets the same bits in any batch, at any position; since it differs from decode's, only
// rows that never meet another row class may take it (an encoder runs whole sequences; decoders never call
// these).
void encoder_matmul_group(std::span<const MatmulOut> outs, const float* x, int64_t n_rows, ThreadPool& pool,
                          MatmulScratch& scratch);
void encoder_matmul(const MatrixView& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool,
                    MatmulScratch& scratch);

// matmul() computed wholly by the calling thread, as thread `thread` of a parallel region of the pool that
// `scratch` was made for (it uses that thread's buffers): for many small products of different inputs (one
// per attention head) run as one task each in a single region, rather than one region each. Row r of the
// input at x + r * x_stride, its outputs at y + r * y_stride. Every row's result has the same bits as
// matmul() gives it. w.cols <= scratch.max_cols() for quantized weights.
// `call`: 0, or a number from scratch.next_call() (taken before the region) that the caller gives every task
// of one input (the same x, rows and width, weights of one type and form; tasks of output-row ranges of one
// matrix, or of several with that input): a thread then quantizes up to kMaxWindowRows rows of it once for
// all its tasks with that number, not once per task, and multiplies them in one pass as matmul() does. The
// input must not change while the number is in use.
void matmul_on_thread(const MatrixView& w, const float* x, int64_t x_stride, int64_t n_rows, float* y,
                      int64_t y_stride, MatmulScratch& scratch, int thread, uint64_t call = 0);

// Scalar reference: dequantizes each weight row and accumulates in double. Tests compare kernels with it.
void matmul_reference(const MatrixView& w, const float* x, int64_t n_rows, float* y);

// The quantized kernels of a target.
const QuantKernels& quant_kernels(Target t);

// Dot product of two f32 vectors with a fixed reduction order (8 interleaved partial sums, combined
// pairwise).
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace tandem::kernels
