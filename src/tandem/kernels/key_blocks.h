// Attention scores over key blocks stored dimension-major. The f16 key cache keeps each block of B positions
// of one KV head as `dim` runs of B halves, element i of position p at i * B + p, so that one vector load
// holds one dimension of consecutive positions: the scores of a run of positions accumulate in vector lanes
// against the query's elements broadcast, with no horizontal sum per score and each key element converted
// once for all the queries of a group.
#pragma once

#include <cstdint>

namespace tandem::kernels {

// s[h * s_stride + j] = q_h . (position off + j) for j < n and G queries (q_h at q + h * q_stride), over a
// dimension-major block of B positions of `dim` f16 elements. A score is two chains of fused multiply-adds,
// over the even and over the odd dimensions in increasing order, then their sum: the same bits whatever G,
// off, n or B, on every target with fused multiply-add (others, and blocks whose B is not a multiple of the
// vector, take the reference).
void dots_dim_major_f16(const float* q, int64_t G, int64_t q_stride, const uint16_t* block, int64_t B,
                        int64_t off, int64_t n, int64_t dim, float* s, int64_t s_stride);

// The same in scalar code (std::fma in the same order).
void dots_dim_major_f16_reference(const float* q, int64_t G, int64_t q_stride, const uint16_t* block,
                                  int64_t B, int64_t off, int64_t n, int64_t dim, float* s, int64_t s_stride);

}  // namespace tandem::kernels
