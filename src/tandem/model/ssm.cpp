#include "tandem/model/ssm.h"

#include <algorithm>
#include <string>

#include "tandem/kernels/ops.h"
#include "tandem/kernels/ssm.h"
#include "tandem/model/forward.h"
#include "tandem/util/error.h"

namespace tandem::model {

namespace {
// Channels per task: whole vectors of any width, and enough work per task to pay for the hand-off.
constexpr int64_t kChannelGrain = 64;

// Calls fn(r, c0, c1) for every block [c0, c1) of a thread's channels and, inside it, every row r < rows in
// order: the block's states, weights and A stay in the L1 cache across the rows of a window.
template <typename Fn>
void channel_blocks_by_row(ThreadPool& pool, int64_t channels, int64_t rows, Fn fn) {
  pool.parallel_for(channels, kChannelGrain, [&](int64_t i0, int64_t i1, int) {
    for (int64_t c0 = i0; c0 < i1; c0 += kChannelGrain) {
      const int64_t c1 = std::min(i1, c0 + kChannelGrain);
      for (int64_t r = 0; r < rows; ++r) fn(r, c0, c1);
    }
  });
}
}  // namespace

SsmMixer::SsmMixer(const Config& config, int64_t max_rows) : c_(config) {
  auto alloc = [&](std::vector<float>& v, int64_t width) {
    v.assign(static_cast<size_t>(max_rows * width), 0.0f);
  };
  alloc(xz_, 2 * c_.ssm_d_inner);
  alloc(xc_, c_.ssm_d_inner);
  alloc(xdb_, c_.ssm_dt_rank + 2 * c_.ssm_d_state);
  alloc(dtr_, c_.ssm_dt_rank);
  alloc(dt_, c_.ssm_d_inner);
  alloc(y_, c_.ssm_d_inner);
  alloc(out_, c_.n_embd);
  replay_xc_.assign(static_cast<size_t>(c_.ssm_d_inner), 0.0f);
  replay_y_.assign(static_cast<size_t>(c_.ssm_d_inner), 0.0f);
}

void SsmMixer::check_rows(std::span<const Row> rows, std::span<cache::KvCache* const> caches) {
  if (next_.size() < caches.size()) next_.resize(caches.size());
  std::fill(next_.begin(), next_.end(), -1);
  for (const Row& row : rows) {
    int64_t& next = next_[static_cast<size_t>(row.seq)];
    if (next < 0) {
      const cache::RecurrentState* state = caches[static_cast<size_t>(row.seq)]->recurrent();
      TANDEM_CHECK(state != nullptr, "a recurrent model's cache lacks its recurrent state");
      if (row.pos != 0 && (row.pos < state->oldest() || row.pos > state->newest()))
        throw Error("row position " + std::to_string(row.pos) + " of sequence " + std::to_string(row.seq) +
                    " starts from a recurrent state that is no longer held (held: after " +
                    std::to_string(state->oldest()) + " to " + std::to_string(state->newest()) +
                    " positions)");
    } else if (row.pos != next) {
      throw Error("rows of sequence " + std::to_string(row.seq) + " are at positions " +
                  std::to_string(next - 1) + " then " + std::to_string(row.pos) +
                  "; a recurrent model needs each sequence's rows at consecutive positions, in order");
    }
    next = row.pos + 1;
  }
}

void SsmMixer::replay(const LayerWeights& l, int64_t layer, cache::RecurrentState& st, Slot slot,
                      int64_t from, int64_t to, int64_t i0, int64_t i1) {
  const int64_t N = c_.ssm_d_inner, S = c_.ssm_d_state;
  // Rows inside channel blocks, so that a block's state stays in cache across the rows.
  for (int64_t c0 = i0; c0 < i1; c0 += kChannelGrain) {
    const int64_t c1 = std::min(i1, c0 + kChannelGrain);
    for (int64_t p = from; p < to; ++p) {
      const float* in = st.inputs(layer, p);
      kernels::SsmConvArgs a;
      a.d_inner = N;
      a.d_conv = c_.ssm_d_conv;
      a.state_in = a.state_out = st.conv(layer, slot);
      a.x = in;
      a.w = l.ssm_conv_t;
      a.b = l.ssm_conv1d_b.data;
      a.y = replay_xc_.data();
      kernels::ssm_conv_step(a, c0, c1);
      kernels::SsmScanArgs b;
      b.d_inner = N;
      b.d_state = S;
      b.state_in = b.state_out = st.ssm(layer, slot);
      b.x = replay_xc_.data();
      b.dt = in + N;
      b.a = l.ssm_a_t;
      b.b = in + 2 * N;
      b.c = in + 2 * N + S;
      b.d = l.ssm_d.data;
      b.z = in;  // the output is not used: any finite gate
      b.y = replay_y_.data();
      kernels::ssm_scan_step(b, c0, c1);
    }
  }
}

void SsmMixer::prepare(const LayerWeights& l, int64_t layer, cache::RecurrentState& st, int64_t i0,
                       int64_t i1) {
  const cache::RecurrentState::Append& plan = st.append();
  if (plan.replay_from < plan.replay_to)
    replay(l, layer, st, Slot::kBase, plan.replay_from, plan.replay_to, i0, i1);
}

void SsmMixer::run(const LayerWeights& l, int64_t layer, std::span<const Row> rows,
                   std::span<cache::KvCache* const> caches, const float* xb, float* x, ThreadPool& pool,
                   kernels::MatmulScratch& scratch) {
  const int64_t R = static_cast<int64_t>(rows.size());
  const int64_t N = c_.ssm_d_inner, S = c_.ssm_d_state, K = c_.ssm_d_conv, DR = c_.ssm_dt_rank;
  const int64_t XDB = DR + 2 * S;
  const auto state_of = [&](int64_t r) -> cache::RecurrentState& {
    return *caches[static_cast<size_t>(rows[static_cast<size_t>(r)].seq)]->recurrent();
  };

  kernels::matmul(l.ssm_in, xb, R, xz_.data(), pool, scratch);
  // Both passes take a thread's channels in blocks, each block through every row (channel_blocks_by_row; one
  // row after another over the whole range read them from further out once per row). A channel's
  // operations, in row order, are the same.
  channel_blocks_by_row(pool, N, R, [&](int64_t r, int64_t c0, int64_t c1) {
    cache::RecurrentState& st = state_of(r);
    const cache::RecurrentState::Append& plan = st.append();
    const int64_t pos = rows[static_cast<size_t>(r)].pos;
    if (pos == plan.first) prepare(l, layer, st, c0, c1);
    kernels::SsmConvArgs a;
    a.d_inner = N;
    a.d_conv = K;
    a.state_in = st.conv_at(layer, st.read_slot(pos));
    a.state_out = st.conv_at(layer, st.write_slot(pos));
    a.x = xz_.data() + r * 2 * N;
    a.w = l.ssm_conv_t;
    a.b = l.ssm_conv1d_b.data;
    a.y = xc_.data() + r * N;
    kernels::ssm_conv_step(a, c0, c1);
    if (pos >= plan.new_base) std::copy(a.x + c0, a.x + c1, st.inputs(layer, pos) + c0);
  });
  kernels::matmul(l.ssm_x, xc_.data(), R, xdb_.data(), pool, scratch);
  if (!l.ssm_dt_norm.empty()) {
    for (int64_t r = 0; r < R; ++r) {
      float* dbc = xdb_.data() + r * XDB;
      kernels::rms_norm(dbc, l.ssm_dt_norm.data, dbc, DR, c_.norm_eps);
      kernels::rms_norm(dbc + DR, l.ssm_b_norm.data, dbc + DR, S, c_.norm_eps);
      kernels::rms_norm(dbc + DR + S, l.ssm_c_norm.data, dbc + DR + S, S, c_.norm_eps);
    }
  }
  for (int64_t r = 0; r < R; ++r) std::copy_n(xdb_.data() + r * XDB, DR, dtr_.data() + r * DR);
  kernels::matmul(l.ssm_dt, dtr_.data(), R, dt_.data(), pool, scratch);
  for (int64_t r = 0; r < R; ++r) kernels::add_in_place(dt_.data() + r * N, l.ssm_dt_b.data, N);
  channel_blocks_by_row(pool, N, R, [&](int64_t r, int64_t c0, int64_t c1) {
    cache::RecurrentState& st = state_of(r);
    const cache::RecurrentState::Append& plan = st.append();
    const int64_t pos = rows[static_cast<size_t>(r)].pos;
    kernels::SsmScanArgs a;
    a.d_inner = N;
    a.d_state = S;
    a.state_in = st.ssm_at(layer, st.read_slot(pos));
    a.state_out = st.ssm_at(layer, st.write_slot(pos));
    a.x = xc_.data() + r * N;
    a.dt = dt_.data() + r * N;
    a.a = l.ssm_a_t;
    a.b = xdb_.data() + r * XDB + DR;
    a.c = xdb_.data() + r * XDB + DR + S;
    a.d = l.ssm_d.data;
    a.z = xz_.data() + r * 2 * N + N;
    a.y = y_.data() + r * N;
    kernels::ssm_scan_step(a, c0, c1);
    if (pos >= plan.new_base) {
      float* in = st.inputs(layer, pos);
      std::copy(a.dt + c0, a.dt + c1, in + N + c0);
      if (c0 == 0) std::copy_n(a.b, 2 * S, in + 2 * N);  // B then C
    }
  });
  kernels::matmul(l.ssm_out, y_.data(), R, out_.data(), pool, scratch);
  for (int64_t r = 0; r < R; ++r)
    kernels::add_in_place(x + r * c_.n_embd, out_.data() + r * c_.n_embd, c_.n_embd);
}

}  // namespace tandem::model
