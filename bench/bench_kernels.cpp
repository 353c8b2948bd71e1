// Microbenchmarks of the matmul kernels, per weight type, row class and SIMD target:
//   Matmul/TYPE/ROWS   whole matmul (2048 x 2048 weights) on one thread, best target
//   MatmulHot/TYPE/ROWS  the same with 256 x 2048 weights, which stay in the L2 cache: the kernel's compute
//                      throughput, with memory out of the way (decode-class rows should run far above DRAM
//                      speed)
//   MatmulCold/TYPE/ROWS  the same with 32768 x 2048 weights (38-71 MB), copies in turn beyond the
//                      last-level cache (twice its size, at least 96 MB): the kernel's rate with the weights
//                      streaming from memory, to set beside the bandwidth probe
//   MatmulK/TYPE/ROWS/K  whole matmul of 2048 weight rows of K elements (TinyLlama's 2048 and 5632): time
//                      per row and super-block at either row length
//   MatmulKCold2/TYPE/ROWS/K  MatmulK with the weights streaming from memory (copies in turn, as
//                      MatmulCold's), on two threads as the model runs them: MatmulK's matrices fit in an L3
//   MatmulWidth/TYPE/ROWS/K  512 weight rows of K elements (768, 896, 1024) in cache, one thread: rows of a
//                      partial last super-block (896) against whole ones, per byte
//   MatmulWidthCold2/TYPE/ROWS/K  the same, 2048 rows from memory on two threads
//   MatmulHotTarget/TYPE/ROWS/TARGET  MatmulHot on one given SIMD target (kernels::Target: 0 scalar, 1 AVX2,
//                      2 AVX2 with AVX-VNNI, 3 AVX-512, ...), the weights repacked for it as the loader
//                      would under TANDEM_KERNELS, to compare the targets a CPU can run
//   Unpack/TYPE        decoding one 2048-element weight row into the kernel form
//   QuantizeRow/K/PER_SUPER  quantizing one activation row of K elements (per-32 scales for the legacy types,
//                      PER_SUPER 0; per-256 for the K-quants, 1), best target: matmuls of up to four rows
//                      do it on every thread (kOwnActivationRows), wider ones once per row
//   DotRows/TYPE/ROWS  the integer dot product of one unpacked row with ROWS activation rows
//   VnniPeak           peak vpdpbusd (512-bit) throughput of one core: 16 independent chains. The window and
//                      prefill kernels need four per 256 weights per activation row, so this bounds them.
//   RowWorkFloor       the window kernels' per-row work alone (loads, vpdpbusd, convert, scaling), weights in
//                      registers: the floor of MatmulHot at 8 rows, without the decoding of the weights.
//   RowWorkFloorPair<2>  the same for the pair tiles (two weight rows sharing each activation load), and
//                      RowWorkFloorPair<1> for lane pairs, one lane per block over two super-blocks
//   RowWorkFloorAvx2<NR>  the same for the AVX2 Q4_0 tiles (vpmaddubsw, vpmaddwd) at NR rows
//   AttentionDots/G    attention scores of G query heads sharing one KV head against 256 cached f16 key rows
//                      of 64 dims, in blocks of 16 positions as the paged cache holds them (TinyLlama: G = 8)
//   AttentionDotsDimMajor/G  the same scores from key blocks stored dimension-major (the f16 key cache)
//   AttentionValues/G  the weighted sum of the same rows' values for G heads
//   Softmax/N          one query's softmax over N scores (its exponentials and their sum)
//   AttendWindow/ROWS/CTX/TOGETHER  attention of a window of ROWS rows (one KV head of TinyLlama's layer: 8
//                      query heads of 64 dims, f16 cache of CTX positions), its rows' queries sharing each
//                      pass over the cache (TOGETHER 1, cache::attend_rows) or one row at a time (0)
// Weights are in the form the model loader leaves them in (repacked where kernels/repack.h says it pays).
// Bytes/s counts weight bytes, so decode-class numbers compare directly with memory bandwidth.
#include <benchmark/benchmark.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <vector>

#include "tandem/cache/attention.h"
#include "tandem/kernels/float_kernels.h"
#include "tandem/kernels/key_blocks.h"
#include "tandem/kernels/matmul.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/fp16.h"
#include "tandem/tensor/quant.h"

namespace {

using namespace tandem;
using namespace tandem::kernels;

constexpr int64_t kK = 2048, kN = 2048;

const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0,
                        DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                        DType::Q4_K, DType::Q5_K, DType::Q6_K};

// Weights on a page, as the loader's copy of a file puts them (at least 32-byte aligned, which lane pairs
// ask).
struct Weights {
  ZeroedMemory bytes;
  MatrixView view;
};

// Repacked as the model loader repacks them for `target` (the loader takes the best one, or the one
// TANDEM_KERNELS names): a lower target's kernels would read another's form through a slow path.
Weights make_weights(DType t, int64_t n, int64_t k, Target target) {
  Weights w;
  const size_t rb = row_bytes(t, k);
  w.bytes = ZeroedMemory(rb * static_cast<size_t>(n));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t o = 0; o < n; ++o) {
    for (auto& v : row) v = dist(rng);
    quantize_row(t, row.data(), w.bytes.data() + static_cast<size_t>(o) * rb, k);
  }
  w.view = {t, n, k, rb, w.bytes.data()};
  w.view.form = repack_form(t, n, k, w.bytes.data(), target);
  if (w.view.form != WeightForm::kFile) repack_rows(w.view.form, t, k, w.bytes.data(), w.bytes.size());
  return w;
}

std::vector<float> make_activations(int64_t rows, int64_t k) {
  std::vector<float> x(static_cast<size_t>(rows * k));
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : x) v = dist(rng);
  return x;
}

// Bytes of copies that one pass over leaves beyond the last-level cache: twice its size as the C library
// reports it (a server core's shared L3 may hold 300 MB), and at least 96 MB.
size_t beyond_last_level_cache() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max<size_t>(size_t{96} << 20, l3 > 0 ? 2 * static_cast<size_t>(l3) : 0);
}

// from_memory: each iteration takes the next of as many copies of the weights as fill
// beyond_last_level_cache(), for matrices that would otherwise stay in it.
void run_matmul(benchmark::State& state, int64_t n, Target target = best_target(), int64_t k = kK,
                int threads = 1, bool from_memory = false) {
  const DType t = kTypes[state.range(0)];
  const int64_t rows = state.range(1);
  const Weights w = make_weights(t, n, k, target);
  // (Copies 64 bytes apart keep every pair's place in its cache line: lane pairs lie by their address.)
  const size_t stride = (w.bytes.size() + 63) / 64 * 64;
  const size_t n_copies = from_memory ? std::max<size_t>(4, beyond_last_level_cache() / stride + 1) : 1;
  ZeroedMemory copies(from_memory ? stride * n_copies : 0);
  for (size_t c = 0; c < copies.size(); c += stride)
    std::memcpy(copies.data() + c, w.bytes.data(), w.bytes.size());
  const auto x = make_activations(rows, k);
  std::vector<float> y(static_cast<size_t>(rows * n));
  ThreadPool pool(threads);
  MatmulScratch scratch(threads, k, rows, target);
  MatrixView v = w.view;
  size_t c = 0;
  for (auto _ : state) {
    if (from_memory) {
      v.data = copies.data() + c * stride;
      c = (c + 1) % n_copies;
    }
    matmul(v, x.data(), rows, y.data(), pool, scratch);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(dtype_name(t)) + " rows=" + std::to_string(rows) + " " +
                 std::string(target_name(target)));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.view.bytes()));
}

void BM_Matmul(benchmark::State& state) {
  run_matmul(state, kN);
}

void BM_MatmulHot(benchmark::State& state) {
  run_matmul(state, 256);
}

void BM_MatmulCold(benchmark::State& state) {
  run_matmul(state, 16 * kN, best_target(), kK, 1, true);
}

// As MatmulCold on two threads, as decode runs (wall time): both cores stream at once.
void BM_MatmulCold2(benchmark::State& state) {
  run_matmul(state, 16 * kN, best_target(), kK, 2, true);
}

void BM_MatmulHotTarget(benchmark::State& state) {
  run_matmul(state, 256, static_cast<Target>(state.range(2)));
}

// TinyLlama's two row lengths, 2048 weight rows (4.5-12.7 MB): the FFN down projection's 5632-element
// activation rows need 2.75x the cache of the others. Items: rows x super-blocks, so that the time per item
// compares across k and with RowWorkFloorAvx2.
void BM_MatmulK(benchmark::State& state) {
  const int64_t k = state.range(2);
  run_matmul(state, kN, best_target(), k);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * state.range(1) * kN * (k / 256));
}

// MatmulK with the weights streaming from memory, on two threads as the model runs.
void BM_MatmulKCold2(benchmark::State& state) {
  const int64_t k = state.range(2);
  run_matmul(state, kN, best_target(), k, 2, true);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * state.range(1) * kN * (k / 256));
}

// Model widths that are not whole super-blocks (Qwen2.5-0.5B's 896 beside 768 and 1024) for the same bytes
// per second: 512 weight rows in cache on one thread, and 2048 from memory on two.
void BM_MatmulWidth(benchmark::State& state) {
  run_matmul(state, 512, best_target(), state.range(2));
}

void BM_MatmulWidthCold2(benchmark::State& state) {
  run_matmul(state, kN, best_target(), state.range(2), 2, true);
}

void BM_Unpack(benchmark::State& state) {
  const DType t = kTypes[state.range(0)];
  const Target target = static_cast<Target>(state.range(1));
  const QuantKernels& qk = quant_kernels(target);
  const Weights w = make_weights(t, 64, kK, target);
  std::vector<UnpackedSuper> buf(static_cast<size_t>(super_count(kK)));
  int64_t o = 0;
  for (auto _ : state) {
    qk.unpack_row(t, w.view.form, w.view.row(o), kK, qk.signed_q8, buf.data());
    benchmark::DoNotOptimize(buf.data());
    o = (o + 1) % 64;
  }
  state.SetLabel(std::string(dtype_name(t)) + " " + std::string(target_name(target)));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.view.row_bytes));
}

void BM_QuantizeRow(benchmark::State& state) {
  const int64_t k = state.range(0);
  const auto form = static_cast<ActForm>(state.range(1));
  const Target target = best_target();
  const QuantKernels& qk = quant_kernels(target);
  const auto x = make_activations(1, k);
  std::vector<ActSuper> out(static_cast<size_t>(super_count(k)));
  for (auto _ : state) {
    qk.quantize_row(x.data(), k, form, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(target_name(target)));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * k);
}

void BM_DotRows(benchmark::State& state) {
  const Target target = static_cast<Target>(state.range(0));
  const int64_t rows = state.range(1);
  const QuantKernels& qk = quant_kernels(target);
  const int64_t ns = super_count(kK);
  const Weights w = make_weights(DType::Q4_0, 1, kK, target);
  std::vector<UnpackedSuper> buf(static_cast<size_t>(ns));
  qk.unpack_row(DType::Q4_0, w.view.form, w.view.row(0), kK, false, buf.data());
  const auto x = make_activations(rows, kK);
  std::vector<ActSuper> act(static_cast<size_t>(ns * rows));
  for (int64_t r = 0; r < rows; ++r)
    qk.quantize_row(x.data() + r * kK, kK, ActForm::kBlocks, act.data() + r * ns);
  std::vector<float> y(static_cast<size_t>(rows));
  for (auto _ : state) {
    qk.dot_rows(buf.data(), ns, act.data(), ns, rows, DType::Q4_0, false, y.data(), 1);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(target_name(target)) + " rows=" + std::to_string(rows));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * rows * kK);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void vnni_chains(int64_t n, int32_t* out) {
  __m512i acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
  __m512i sum = acc[0];
  for (int j = 1; j < 16; ++j) sum = _mm512_add_epi32(sum, acc[j]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, sum);
  *out = lanes[0];
}

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsic headers as uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// The per-row work of the window kernels alone (accumulate_super with a folded offset): per 256 weights and
// activation row, six 64-byte activation loads, four vpdpbusd, a convert, a scale multiply and an FMA, for 8
// rows that share 4 weight vectors held in registers. Activations stay in L1. Items = rows x super-blocks.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void row_work(int64_t n, const uint8_t* act,
                                                                     float* out) {
  __m512 acc[8];
  for (int r = 0; r < 8; ++r) acc[r] = _mm512_setzero_ps();
  __m512i u0 = _mm512_set1_epi8(1), u1 = _mm512_set1_epi8(2), u2 = _mm512_set1_epi8(3),
          u3 = _mm512_set1_epi8(4);
  __m512 a = _mm512_set1_ps(0.5f);
  for (int64_t i = 0; i < n; ++i) {
    // Weights of a new super-block, activations of the next one (the compiler may assume neither).
    __asm__ volatile("" : "+v"(u0), "+v"(u1), "+v"(u2), "+v"(u3), "+v"(a), "+r"(act));
    for (int r = 0; r < 8; ++r) {
      const uint8_t* x = act + 384 * r;
      __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(x + 320), u0, _mm512_load_si512(x));
      s = _mm512_dpbusd_epi32(s, u1, _mm512_load_si512(x + 64));
      s = _mm512_dpbusd_epi32(s, u2, _mm512_load_si512(x + 128));
      s = _mm512_dpbusd_epi32(s, u3, _mm512_load_si512(x + 192));
      acc[r] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                          _mm512_mul_ps(a, _mm512_load_ps(reinterpret_cast<const float*>(x + 256))), acc[r]);
    }
  }
  for (int r = 1; r < 8; ++r) acc[0] = _mm512_add_ps(acc[0], acc[r]);
  *out = _mm512_reduce_add_ps(acc[0]);
}

// The pair tiles' per-row work (accumulate_signed with two weight rows), weights in registers: per two
// super-blocks (kSupers = 2; n counts super-blocks), activation row and weight row, eight vpdpbusd, and per
// super-block one convert, scale multiply and FMA, each 32-element block's sum split over two lanes
// (kBlockLanes 2, the interleaved form). With kBlockLanes 1, the floor of lane pairs (repack.h): one lane
// per block across two super-blocks (the codes of block b in lane b of eight vectors), so one convert,
// multiply and FMA per two super-blocks. 8 activation rows stay in L1. Items = rows x weight rows x
// super-blocks.
template <int kBlockLanes>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void row_work_pair(int64_t n, const uint8_t* act,
                                                                          float* out) {
  constexpr int kNR = 8, kVecs = 8, kStep = kVecs * 64 + 64;  // codes of two super-blocks, then the scales
  constexpr int kConverts = kBlockLanes;  // per two super-blocks, activation row and weight row
  __m512 acc[2][kNR];
  for (auto& row : acc)
    for (__m512& a : row) a = _mm512_setzero_ps();
  __m512i w[2][kVecs], init[2];
  __m512 a[2][kConverts];
  for (int i = 0; i < 2; ++i) {
    for (int v = 0; v < kVecs; ++v) w[i][v] = _mm512_set1_epi8(static_cast<char>(v + i + 1));
    init[i] = _mm512_set1_epi32(i);
    for (int c = 0; c < kConverts; ++c) a[i][c] = _mm512_set1_ps(0.5f + static_cast<float>(i + c));
  }
  for (int64_t it = 0; it < n; it += 2) {
    // Weights of new super-blocks (the compiler may assume nothing of them).
    for (int i = 0; i < 2; ++i) {
      __asm__ volatile("" : "+v"(w[i][0]), "+v"(w[i][1]), "+v"(w[i][2]), "+v"(w[i][3]), "+r"(act));
      __asm__ volatile("" : "+v"(w[i][4]), "+v"(w[i][5]), "+v"(w[i][6]), "+v"(w[i][7]), "+v"(init[i]));
    }
    for (int r = 0; r < kNR; ++r) {
      const uint8_t* x = act + kStep * r;
      for (int c = 0; c < kConverts; ++c) {
        constexpr int kPer = kVecs / kConverts;  // vectors per convert
        __m512i sum[2] = {init[0], init[1]};
        for (int v = c * kPer; v < (c + 1) * kPer; ++v) {
          const __m512i q = _mm512_load_si512(x + 64 * v);
          for (int i = 0; i < 2; ++i) sum[i] = _mm512_dpbusd_epi32(sum[i], q, w[i][v]);
        }
        const __m512 d = _mm512_load_ps(reinterpret_cast<const float*>(x + kVecs * 64));
        for (int i = 0; i < 2; ++i)
          acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i]), _mm512_mul_ps(a[i][c], d), acc[i][r]);
      }
    }
  }
  for (int r = 0; r < kNR; ++r) acc[0][0] = _mm512_add_ps(acc[0][0], _mm512_add_ps(acc[0][r], acc[1][r]));
  *out = _mm512_reduce_add_ps(acc[0][0]);
}

// 16-byte pieces into one vector (as the one-row tiles read repacked codes: load64_by16).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline __m512i pieces64(const uint8_t* p) {
  const auto q = [p](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)); };
  return _mm512_inserti32x4(
      _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(q(0)), q(1), 1), q(2), 2), q(3), 3);
}

// A one-row Q4_0 tile in cache over repacked weight rows in two layouts of the same bytes, each row's result
// reduced at its end (kLanes: the 32-element block's lanes). kLanes 2: the kernels' form (direct_tile<1>
// with load_q4_0x_super<true>, the interleaved form), per 144-byte super-block the 8 scales converted and
// permuted onto their two lane groups, two code vectors in pieces split into four nibble quarters, four
// vpdpbusd from the -8 fold's offset sums, the activation scales, a multiply, a convert and an FMA. kLanes 1:
// lane pairs (repack.h), one lane per block across two super-blocks (288 bytes: the 16 scales, then four code
// vectors whose lane b holds block b's bytes 4v..4v+3), so per two super-blocks one scale convert (no
// permute), one offset-sum and one activation-scale load, one multiply, convert and FMA
// (quant_lane_pairs_avx512.h, which also splits each block's sum over two dependency chains). Three L2
// prefetches per 144 bytes (five per 288), as the tile issues them 6 KB ahead. Items = weight rows x
// super-blocks.
template <int kLanes>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void one_row_q4_0(int64_t rows, int64_t n_super,
                                                                         const uint8_t* w, const uint8_t* act,
                                                                         float* out) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i spread = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const int64_t row_bytes = n_super * 144;
  for (int64_t o = 0; o < rows; ++o) {
    const uint8_t* wr = w + o * row_bytes;
    __m512 acc = _mm512_setzero_ps();
    if constexpr (kLanes == 2) {
      for (int64_t s = 0; s < n_super; ++s) {
        const uint8_t* sb = wr + 144 * s;
        const uint8_t* x = act + 384 * s;
        for (int b = 0; b < 144; b += 64)
          _mm_prefetch(reinterpret_cast<const char*>(sb + 6144 + b), _MM_HINT_T1);
        const __m512 a = _mm512_permutexvar_ps(
            spread,
            _mm512_cvtph_ps(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb)))));
        const __m512i lo = pieces64(sb + 16), hi = pieces64(sb + 80);
        __m512i sum = _mm512_load_si512(x + 256);
        sum = _mm512_dpbusd_epi32(sum, _mm512_and_si512(lo, nib), _mm512_load_si512(x));
        sum = _mm512_dpbusd_epi32(sum, _mm512_and_si512(hi, nib), _mm512_load_si512(x + 64));
        sum = _mm512_dpbusd_epi32(sum, _mm512_and_si512(_mm512_srli_epi16(lo, 4), nib),
                                  _mm512_load_si512(x + 128));
        sum = _mm512_dpbusd_epi32(sum, _mm512_and_si512(_mm512_srli_epi16(hi, 4), nib),
                                  _mm512_load_si512(x + 192));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                              _mm512_mul_ps(a, _mm512_load_ps(reinterpret_cast<const float*>(x + 320))), acc);
      }
    } else {
      for (int64_t s = 0; s < n_super; s += 2) {
        const uint8_t* sb = wr + 144 * s;
        const uint8_t* x = act + 384 * s;  // 768 bytes a pair: 8 code vectors, offset sums, scales
        for (int b = 0; b < 288; b += 64)
          _mm_prefetch(reinterpret_cast<const char*>(sb + 6144 + b), _MM_HINT_T1);
        const __m512 a = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb)));
        __m512i sum = _mm512_load_si512(x + 512);
        for (int v = 0; v < 4; ++v) {
          const __m512i p = pieces64(sb + 32 + 64 * v);
          sum = _mm512_dpbusd_epi32(sum, _mm512_and_si512(p, nib), _mm512_load_si512(x + 64 * v));
          sum = _mm512_dpbusd_epi32(sum, _mm512_and_si512(_mm512_srli_epi16(p, 4), nib),
                                    _mm512_load_si512(x + 256 + 64 * v));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                              _mm512_mul_ps(a, _mm512_load_ps(reinterpret_cast<const float*>(x + 576))), acc);
      }
    }
    out[o] = _mm512_reduce_add_ps(acc);
  }
}

#pragma GCC diagnostic pop

bool runs_avx512_vnni() {
  const std::vector<Target> t = runnable_targets();
  return std::find(t.begin(), t.end(), Target::kAVX512) != t.end();
}

// Times fn(4096, activations, &sink) on an aligned buffer of `bytes` activation bytes, `items` per call.
template <typename Fn>
void time_row_work(benchmark::State& state, size_t bytes, Fn fn, int64_t items, const char* label) {
  if (!runs_avx512_vnni()) {
    state.SkipWithError("no AVX-512 VNNI on this CPU");
    return;
  }
  std::vector<uint8_t> buf(bytes + 64, 1);
  const uint8_t* act = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  float sink = 0;
  for (auto _ : state) {
    fn(4096, act, &sink);
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * items);
  state.SetLabel(label);
}

void BM_RowWorkFloor(benchmark::State& state) {
  time_row_work(state, 8 * 384, row_work, 4096 * 8, "items = rows x super-blocks");
}
BENCHMARK(BM_RowWorkFloor);

template <int kBlockLanes>
void BM_RowWorkFloorPair(benchmark::State& state) {
  time_row_work(state, 8 * 576, row_work_pair<kBlockLanes>, 4096 * 8 * 2,
                "items = rows x weight rows x super-blocks");
}
BENCHMARK(BM_RowWorkFloorPair<2>);
BENCHMARK(BM_RowWorkFloorPair<1>);

template <int kLanes>
void BM_OneRowQ4_0Layout(benchmark::State& state) {
  if (!runs_avx512_vnni()) {
    state.SkipWithError("no AVX-512 VNNI on this CPU");
    return;
  }
  // TinyLlama's 2048 or 5632 columns (arg): 295 or 811 KB of weights, in L2.
  const int64_t rows = 256, supers = state.range(0);
  std::vector<uint8_t> w(rows * supers * 144 + 8192 + 64, 0x37);
  std::vector<uint8_t> act(supers * 384 + 128, 1);
  const auto aligned = [](std::vector<uint8_t>& v) {
    return v.data() + (64 - reinterpret_cast<uintptr_t>(v.data()) % 64) % 64;
  };
  uint8_t* wa = aligned(w);
  // Weight scales zero in either layout (no product is subnormal); the times do not depend on the values.
  for (int64_t i = 0; i < rows * supers; ++i) std::memset(wa + 144 * i, 0, 32);
  std::vector<float> out(static_cast<size_t>(rows));
  for (auto _ : state) {
    one_row_q4_0<kLanes>(rows, supers, wa, aligned(act), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * rows * supers);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * rows * supers * 144);
  state.SetLabel("items = weight rows x super-blocks");
}
BENCHMARK(BM_OneRowQ4_0Layout<2>)->Arg(8)->Arg(22);
BENCHMARK(BM_OneRowQ4_0Layout<1>)->Arg(8)->Arg(22);

void BM_VnniPeak(benchmark::State& state) {
  if (!runs_avx512_vnni()) {
    state.SkipWithError("no AVX-512 VNNI on this CPU");
    return;
  }
  int32_t sink = 0;
  for (auto _ : state) {
    vnni_chains(4096, &sink);
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * 4096 * 16);
  state.SetLabel("items = vpdpbusd zmm");
}
BENCHMARK(BM_VnniPeak);
// The AVX2 form of RowWorkFloor: per 256 weights and activation row, as the Q4_0 window tiles do it in block
// lanes (quant_layout.h), eight vpmaddubsw, seven 16-bit adds, one vpmaddwd, the offset sums, one convert,
// scale multiply and FMA, in two passes of four vectors, for NR rows sharing one super-block's 8 weight
// vectors held in registers. Items = rows x super-blocks.
#define XQ(v) _mm256_load_si256(reinterpret_cast<const __m256i*>(x + 32 * (v)))
// Vectors v0, v0 + 1, v0 + 4 and v0 + 5 of row x (a macro: a lambda would not take the function's target).
#define QUAD(v0)                                                                                          \
  _mm256_add_epi16(                                                                                       \
      _mm256_add_epi16(_mm256_maddubs_epi16(u[v0], XQ(v0)), _mm256_maddubs_epi16(u[v0 + 1], XQ(v0 + 1))), \
      _mm256_add_epi16(_mm256_maddubs_epi16(u[v0 + 4], XQ(v0 + 4)),                                       \
                       _mm256_maddubs_epi16(u[v0 + 5], XQ(v0 + 5))))
template <int NR>
__attribute__((target("avx2,fma"))) void row_work_avx2(int64_t n, const uint8_t* act, float* out) {
  __m256 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
  __m256i u[8];
  for (int v = 0; v < 8; ++v) u[v] = _mm256_set1_epi8(static_cast<char>(v + 1));
  __m256 a = _mm256_set1_ps(0.5f);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < n; ++i) {
    __asm__ volatile("" : "+x"(u[0]), "+x"(u[1]), "+x"(u[2]), "+x"(u[3]), "+r"(act));
    __asm__ volatile("" : "+x"(u[4]), "+x"(u[5]), "+x"(u[6]), "+x"(u[7]), "+x"(a));
    __m256i part[NR];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* x = act + 384 * r;
      part[r] = QUAD(0);
      __asm__("" : "+x"(part[r]));
    }
    for (int r = 0; r < NR; ++r) {
      const uint8_t* x = act + 384 * r;
      const __m256i sum = _mm256_add_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(x + 320)),
                                           _mm256_madd_epi16(_mm256_add_epi16(part[r], QUAD(2)), ones));
      acc[r] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum),
                          _mm256_mul_ps(a, _mm256_load_ps(reinterpret_cast<const float*>(x + 256))), acc[r]);
    }
  }
  for (int r = 1; r < NR; ++r) acc[0] = _mm256_add_ps(acc[0], acc[r]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  *out = lanes[0];
}
#undef QUAD
#undef XQ

template <int NR>
void BM_RowWorkFloorAvx2(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    state.SkipWithError("no AVX2 on this CPU");
    return;
  }
  std::vector<uint8_t> buf(NR * 384 + 64, 1);
  uint8_t* act = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  for (int r = 0; r < NR; ++r) {  // scales of 1 (bytes of 1 read as floats would make denormal products)
    const float one = 1.0f;
    for (int i = 0; i < 16; ++i) std::memcpy(act + 384 * r + 256 + 4 * i, &one, 4);
  }
  float sink = 0;
  for (auto _ : state) {
    row_work_avx2<NR>(4096, act, &sink);
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * 4096 * NR);
  state.SetLabel("items = rows x super-blocks");
}
BENCHMARK(BM_RowWorkFloorAvx2<1>);
BENCHMARK(BM_RowWorkFloorAvx2<4>);
BENCHMARK(BM_RowWorkFloorAvx2<8>);

#endif

// One KV head's cache of 256 positions (f16, 64 dims) and G queries or weights.
struct AttentionInputs {
  static constexpr int64_t kPositions = 256, kDim = 64, kBlock = 16;
  std::vector<uint16_t> rows;
  std::vector<float> q, s;
  explicit AttentionInputs(int64_t G) : rows(kPositions * kDim), q(G * kDim), s(G * kPositions) {
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto& v : rows) v = f32_to_fp16(dist(rng));
    for (auto& v : q) v = dist(rng);
    for (auto& v : s) v = std::fabs(dist(rng)) / kPositions;
  }
};

void BM_AttentionDots(benchmark::State& state) {
  const int64_t G = state.range(0);
  AttentionInputs in(G);
  using A = AttentionInputs;
  for (auto _ : state) {
    for (int64_t b = 0; b < A::kPositions; b += A::kBlock)
      dots_group_f16(in.q.data(), G, A::kDim, in.rows.data() + b * A::kDim, A::kBlock, A::kDim,
                     in.s.data() + b, A::kPositions);
    benchmark::DoNotOptimize(in.s.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * G * A::kPositions);
  state.SetLabel("items = scores");
}
BENCHMARK(BM_AttentionDots)->Arg(1)->Arg(2)->Arg(4)->Arg(6)->Arg(8);

// The same scores from dimension-major blocks (kernels/key_blocks.h), as the f16 key cache holds them.
void BM_AttentionDotsDimMajor(benchmark::State& state) {
  const int64_t G = state.range(0);
  AttentionInputs in(G);
  using A = AttentionInputs;
  std::vector<uint16_t> blocks(in.rows.size());
  for (int64_t p = 0; p < A::kPositions; ++p)
    for (int64_t i = 0; i < A::kDim; ++i)
      blocks[static_cast<size_t>((p / A::kBlock) * A::kBlock * A::kDim + i * A::kBlock + p % A::kBlock)] =
          in.rows[static_cast<size_t>(p * A::kDim + i)];
  for (auto _ : state) {
    for (int64_t b = 0; b < A::kPositions; b += A::kBlock)
      dots_dim_major_f16(in.q.data(), G, A::kDim, blocks.data() + b * A::kDim, A::kBlock, 0, A::kBlock,
                         A::kDim, in.s.data() + b, A::kPositions);
    benchmark::DoNotOptimize(in.s.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * G * A::kPositions);
  state.SetLabel("items = scores");
}
BENCHMARK(BM_AttentionDotsDimMajor)->Arg(1)->Arg(2)->Arg(4)->Arg(6)->Arg(8);

// The value sums of G queries (arg 1) over 16-row blocks, arg 2 blocks a call (accumulate_runs_f16, as
// attention weighs a paged cache's blocks).
void BM_AttentionValues(benchmark::State& state) {
  const int64_t G = state.range(0), per_call = state.range(1);
  AttentionInputs in(G);
  using A = AttentionInputs;
  std::vector<float> acc(static_cast<size_t>(G * A::kDim));
  std::vector<ValueRun> runs;
  for (int64_t b = 0; b < A::kPositions; b += A::kBlock)
    runs.push_back({reinterpret_cast<const uint8_t*>(in.rows.data() + b * A::kDim), A::kBlock, b});
  const auto n_runs = static_cast<int64_t>(runs.size());
  for (auto _ : state) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k = 0; k < n_runs; k += per_call)
      accumulate_runs_f16(in.s.data(), G, A::kPositions, runs.data() + k, std::min(per_call, n_runs - k),
                          A::kDim, acc.data(), A::kDim);
    benchmark::DoNotOptimize(acc.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * G * A::kPositions);
  state.SetLabel("items = weighted rows");
}
BENCHMARK(BM_AttentionValues)->ArgsProduct({{1, 2, 4, 6, 8}, {1, 4}});

// The softmax of one query's scores over N positions (kernels::softmax, attention's scale 1/8): per element,
// to set beside the scores' and value sums' work (64 multiply-adds each per position at head size 64).
void BM_Softmax(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> x(static_cast<size_t>(n)), work(x.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 8.0f);
  for (auto& v : x) v = dist(rng);
  for (auto _ : state) {
    std::copy(x.begin(), x.end(), work.begin());
    softmax(work.data(), n, 0.125f, 0.0f);
    benchmark::DoNotOptimize(work.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * n);
  state.SetLabel("items = scores");
}
BENCHMARK(BM_Softmax)->Arg(256)->Arg(2048);

// One layer's new K or V of a decode step (four KV heads of 64) into f16 cache bits: the kernel
// (kernels::f32_to_f16, arg 1) against the scalar reference element by element (arg 0).
void BM_KvStoreF16(benchmark::State& state) {
  constexpr int64_t kN = 256;
  std::vector<float> x(kN);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : x) v = dist(rng);
  std::vector<uint8_t> out(2 * kN);
  for (auto _ : state) {
    if (state.range(0) == 1) {
      f32_to_f16(x.data(), kN, out.data());
    } else {
      for (int64_t i = 0; i < kN; ++i) {
        const uint16_t h = f32_to_fp16(x[static_cast<size_t>(i)]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kN);
}
BENCHMARK(BM_KvStoreF16)->Arg(0)->Arg(1);

void BM_AttendWindow(benchmark::State& state) {
  const int64_t rows = state.range(0), ctx = state.range(1), G = 8, dim = 64;
  const bool together = state.range(2) != 0;
  cache::Geometry c;
  c.n_layer = 1;
  c.n_head_kv = 1;
  c.head_dim = c.head_dim_v = dim;
  cache::KvCache kv(c, ctx, cache::KvType::kF16);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(dim)), v(static_cast<size_t>(dim));
  kv.prepare_append(0, ctx);
  for (int64_t p = 0; p < ctx; ++p) {
    for (auto& e : k) e = dist(rng);
    for (auto& e : v) e = dist(rng);
    kv.store(0, p, k.data(), v.data());
  }
  std::vector<float> q(static_cast<size_t>(rows * G * dim)), out(q.size());
  for (auto& e : q) e = 0.125f * dist(rng);
  std::vector<float> scores(static_cast<size_t>(cache::kMaxWindowQueries * ctx));
  const cache::AttentionParams params{0.125f, 0.0f};
  const int64_t last = ctx - rows;
  for (auto _ : state) {
    if (together) {
      cache::attend_rows(kv, 0, 0, q.data(), rows, G, {G * dim, dim, G * dim, dim}, 0, last, params,
                         scores.data(), ctx, out.data());
    } else {
      for (int64_t r = 0; r < rows; ++r)
        cache::attend_group(kv, 0, 0, q.data() + r * G * dim, G, dim, 0, last + r, params, scores.data(), ctx,
                            out.data() + r * G * dim, dim);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * rows);
  state.SetLabel("items = window rows");
}
BENCHMARK(BM_AttendWindow)
    ->ArgsProduct({{1, 4, 8}, {256, 1024, 4096}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

void matmul_args(benchmark::internal::Benchmark* b) {
  for (int t = 0; t < static_cast<int>(std::size(kTypes)); ++t)
    for (int rows : {1, 2, 4, 6, 8, 12, 16, 64}) b->Args({t, rows});
}
void k_args(benchmark::internal::Benchmark* b) {
  for (int t : {3, 4, 5, 6, 8, 10, 11, 12})  // Q8_0, Q4_0, Q4_1, Q5_0, Q2_K, Q4_K, Q5_K, Q6_K
    for (int rows : {1, 4, 5, 8})
      for (int k : {2048, 5632}) b->Args({t, rows, k});
}
void width_args(benchmark::internal::Benchmark* b) {
  for (int t : {3, 4, 6})  // Q8_0, Q4_0, Q5_0
    for (int rows : {1, 4})
      for (int k : {768, 896, 1024}) b->Args({t, rows, k});
}
void cold_args(benchmark::internal::Benchmark* b) {
  for (int t : {3, 4, 10, 12})  // Q8_0, Q4_0, Q4_K, Q6_K
    for (int rows : {1, 4, 8}) b->Args({t, rows});
}
void matmul_target_args(benchmark::internal::Benchmark* b) {
  for (int t = 0; t < static_cast<int>(std::size(kTypes)); ++t)
    for (int rows : {1, 4, 8, 16, 64})
      for (Target target : runnable_targets()) b->Args({t, rows, static_cast<int>(target)});
}
void unpack_args(benchmark::internal::Benchmark* b) {
  for (int t = 3; t < static_cast<int>(std::size(kTypes)); ++t)
    for (Target target : runnable_targets()) b->Args({t, static_cast<int>(target)});
}
void dot_args(benchmark::internal::Benchmark* b) {
  for (Target target : runnable_targets())
    for (int rows : {1, 2, 4, 8, 16}) b->Args({static_cast<int>(target), rows});
}

BENCHMARK(BM_Matmul)->Apply(matmul_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatmulHot)->Apply(matmul_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatmulCold)->Apply(cold_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatmulCold2)->Apply(cold_args)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_MatmulK)->Apply(k_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatmulKCold2)->Apply(k_args)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_MatmulWidth)->Apply(width_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatmulWidthCold2)->Apply(width_args)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_MatmulHotTarget)->Apply(matmul_target_args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Unpack)->Apply(unpack_args);
BENCHMARK(BM_QuantizeRow)->ArgsProduct({{2048, 5632}, {0, 1, 2}});  // ActForm
BENCHMARK(BM_DotRows)->Apply(dot_args);

}  // namespace

BENCHMARK_MAIN();
