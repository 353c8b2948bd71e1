#include "tandem/train/layers.h"

#include <cmath>
#include <cstring>
#include <string>

#include "tandem/kernels/float_kernels.h"
#include "tandem/train/linalg.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

constexpr int64_t kRowGrain = 8;         // rows per chunk of row-wise loops
constexpr int64_t kElementGrain = 4096;  // elements per chunk of element-wise loops

}  // namespace

void linear_forward(const Param& w, const Param* b, const float* x, int64_t rows, float* y, Compute& c) {
  matmul_xwt(x, rows, w.cols, w.value.data(), w.rows, y, c);
  if (b == nullptr) return;
  const int64_t n = w.rows;
  const float* bias = b->value.data();
  c.pool.parallel_for(rows, kRowGrain, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t o = 0; o < n; ++o) y[r * n + o] += bias[o];
  });
}

void linear_backward(Param& w, Param* b, const float* x, const float* dy, int64_t rows, float* dx,
                     bool accumulate_dx, Compute& c) {
  const int64_t n = w.rows, k = w.cols;
  if (dx != nullptr) matmul_dyw(dy, rows, n, w.value.data(), k, dx, accumulate_dx, c);
  if (w.trainable()) matmul_dyt_x(dy, rows, n, x, k, w.grad.data(), c);
  if (b != nullptr && b->trainable()) {
    float* db = b->grad.data();
    c.pool.parallel_for(n, 16, [&](int64_t o0, int64_t o1, int) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = o0; o < o1; ++o) db[o] += dy[r * n + o];
    });
  }
}

void rmsnorm_forward(const Param& g, float eps, const float* x, int64_t rows, float* y, float* inv_rms,
                     Compute& c) {
  const int64_t n = g.rows;
  const float* gain = g.value.data();
  c.pool.parallel_for(rows, kRowGrain, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
      inv_rms[r] = inv;
      float* yr = y + r * n;
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * gain[i];
    }
  });
}

void rmsnorm_backward(Param& g, const float* x, const float* inv_rms, const float* dy, int64_t rows,
                      float* dx, bool accumulate_dx, Compute& c) {
  const int64_t n = g.rows;
  const float* gain = g.value.data();
  c.pool.parallel_for(rows, kRowGrain, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      const float* dyr = dy + r * n;
      const float inv = inv_rms[r];
      double dot = 0;  // sum_i g_i dy_i xhat_i
      for (int64_t i = 0; i < n; ++i) dot += static_cast<double>(gain[i]) * dyr[i] * (xr[i] * inv);
      const float mean = static_cast<float>(dot / static_cast<double>(n));
      float* dxr = dx + r * n;
      for (int64_t i = 0; i < n; ++i) {
        const float v = inv * (gain[i] * dyr[i] - xr[i] * inv * mean);
        dxr[i] = accumulate_dx ? dxr[i] + v : v;
      }
    }
  });
  if (!g.trainable()) return;
  float* dg = g.grad.data();
  c.pool.parallel_for(n, 16, [&](int64_t i0, int64_t i1, int) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = i0; i < i1; ++i) dg[i] += dy[r * n + i] * (x[r * n + i] * inv_rms[r]);
  });
}

void embedding_forward(const Param& table, const int32_t* ids, int64_t rows, float* y) {
  const int64_t n = table.cols;
  for (int64_t r = 0; r < rows; ++r)
    if (ids[r] < 0 || ids[r] >= table.rows)
      throw Error("token id " + std::to_string(ids[r]) + " at row " + std::to_string(r) + " is outside the " +
                  table.name + " table of " + std::to_string(table.rows) + " entries");
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(y + r * n, table.value.data() + ids[r] * n, static_cast<size_t>(n) * sizeof(float));
}

void embedding_backward(Param& table, const int32_t* ids, const float* dy, int64_t rows) {
  if (!table.trainable()) return;
  const int64_t n = table.cols;
  for (int64_t r = 0; r < rows; ++r) {
    float* g = table.grad.data() + ids[r] * n;
    for (int64_t i = 0; i < n; ++i) g[i] += dy[r * n + i];
  }
}

namespace {

// Turns every head's pairs of each row by +angle (sign 1) or -angle (sign -1).
void rope_turn(const Rope& rope, float* x, int64_t rows, int64_t n_heads, const int32_t* pos, double sign,
               Compute& c) {
  const int64_t hd = rope.head_dim, half = hd / 2;
  TANDEM_CHECK(hd % 2 == 0, "rotary embedding needs an even head size");
  c.pool.parallel_for(rows, kRowGrain, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < half; ++i) {
        const double freq = std::pow(static_cast<double>(rope.theta), -2.0 * static_cast<double>(i) / hd);
        const double angle = sign * static_cast<double>(pos[r]) * freq;
        const auto cs = static_cast<float>(std::cos(angle)), sn = static_cast<float>(std::sin(angle));
        const int64_t a = rope.layout == RopeLayout::kInterleaved ? 2 * i : i;
        const int64_t b = rope.layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + half;
        for (int64_t h = 0; h < n_heads; ++h) {
          float* xh = x + r * n_heads * hd + h * hd;
          const float u = xh[a], v = xh[b];
          xh[a] = u * cs - v * sn;
          xh[b] = u * sn + v * cs;
        }
      }
    }
  });
}

}  // namespace

void rope_forward(const Rope& rope, float* x, int64_t rows, int64_t n_heads, const int32_t* pos, Compute& c) {
  rope_turn(rope, x, rows, n_heads, pos, 1.0, c);
}

void rope_backward(const Rope& rope, float* dx, int64_t rows, int64_t n_heads, const int32_t* pos,
                   Compute& c) {
  rope_turn(rope, dx, rows, n_heads, pos, -1.0, c);
}

void swiglu_forward(const float* gate, const float* up, int64_t n, float* out, Compute& c) {
  c.pool.parallel_for(n, kElementGrain, [&](int64_t b, int64_t e, int) {
    kernels::silu_mul(gate + b, up + b, out + b, e - b);
  });
}

void swiglu_backward(const float* gate, const float* up, const float* dout, int64_t n, float* dgate,
                     float* dup, Compute& c) {
  c.pool.parallel_for(n, kElementGrain, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const float s = 1.0f / (1.0f + std::exp(-gate[i]));
      const float silu = gate[i] * s;
      dup[i] = dout[i] * silu;
      dgate[i] = dout[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
    }
  });
}

void add_into(float* dst, const float* src, int64_t n, Compute& c) {
  c.pool.parallel_for(n, kElementGrain, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) dst[i] += src[i];
  });
}

}  // namespace tandem::train
