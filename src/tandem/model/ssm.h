// The Mamba-1 mixer of a recurrent layer over a batch of forward rows. Rows of different sequences run
// together: the projections are packed matrix products over all rows; the convolution and the scan run per
// channel range across the team, each range in blocks of 64 channels and each block taking the rows in batch
// order, so a sequence's rows see the state its previous row left (and a window's rows find the block's state
// in the L1 cache). Before a sequence's first row, each layer carries out the plan its
// RecurrentState recorded (cache/recurrent.h): where a rollback found no kept state, it brings the base state
// up to the accepted length by replaying the kept inputs of the accepted rows through the same kernels (so
// the bits are those decoding gave), or moves the base state forward. Each row reads and writes the state
// slots the plan names (a verify window's rows each write a slot of their own, so that accepting part of it
// needs no replay) and keeps its inputs for later replays. Workspace is allocated once for `max_rows`; run()
// does not allocate (except to track more sequences than any batch before).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/cache/kv_cache.h"
#include "tandem/kernels/matmul.h"
#include "tandem/model/config.h"
#include "tandem/model/weights.h"
#include "tandem/util/thread_pool.h"

namespace tandem::model {

struct Row;

class SsmMixer {
 public:
  SsmMixer(const Config& config, int64_t max_rows);

  // Throws tandem::Error unless each sequence's rows are at consecutive positions in batch order (a
  // recurrent state runs forward only), or when a row starts from a state its cache no longer holds.
  // Checked before any cache is touched.
  void check_rows(std::span<const Row> rows, std::span<cache::KvCache* const> caches);

  // x [R, n_embd] += mixer(xb [R, n_embd]) for layer `layer` (weights l), R = rows.size().
  void run(const LayerWeights& l, int64_t layer, std::span<const Row> rows,
           std::span<cache::KvCache* const> caches, const float* xb, float* x, ThreadPool& pool,
           kernels::MatmulScratch& scratch);

 private:
  using Slot = cache::RecurrentState::Slot;
  // Channels [i0, i1) of a layer: the replay of st.append(), before the forward's first row.
  void prepare(const LayerWeights& l, int64_t layer, cache::RecurrentState& st, int64_t i0, int64_t i1);
  // Runs the kept rows [from, to) on `slot` in place, for channels [i0, i1).
  void replay(const LayerWeights& l, int64_t layer, cache::RecurrentState& st, Slot slot, int64_t from,
              int64_t to, int64_t i0, int64_t i1);

  const Config& c_;
  // Activations, [max_rows, width] each.
  std::vector<float> xz_;         // [, 2 * d_inner]: x then z
  std::vector<float> xc_;         // [, d_inner]: silu(conv(x))
  std::vector<float> xdb_;        // [, dt_rank + 2 * d_state]: dt, B, C
  std::vector<float> dtr_;        // [, dt_rank]
  std::vector<float> dt_;         // [, d_inner]: dt projection + bias (before softplus)
  std::vector<float> y_;          // [, d_inner]
  std::vector<float> out_;        // [, n_embd]
  std::vector<float> replay_xc_;  // [d_inner] a replayed row's convolution output
  std::vector<float> replay_y_;   // [d_inner] a replayed row's (unused) output
  std::vector<int64_t> next_;     // per sequence, the position its next row must have (-1: none yet)
};

}  // namespace tandem::model
