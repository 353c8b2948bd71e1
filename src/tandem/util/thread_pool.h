// A persistent team of threads for data-parallel loops. Threads are created once; each parallel region wakes
// them through an atomic generation counter, so no thread is created per token. A waiting thread (a worker
// between regions, the caller at the end of one) spins for a bounded time, then blocks.
// The calling thread takes part as thread 0. Not reentrant: one region at a time per pool.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  // n_threads >= 1 (the caller counts as one).
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(t) once for each index t of the team (0..size()-1), each on one thread, and returns when all have
  // finished: index 0 on the caller, index t on worker t, unless worker t has not started it by the time the
  // caller is done with its own (a worker the system has not scheduled, where more threads are runnable
  // than there are cores); the caller then runs it itself. Each index runs on one thread at a time, so
  // per-index scratch needs no lock; nothing may rely on which thread runs an index.
  // The callable must not throw. It is referred to, not copied: a region allocates nothing (a
  // std::function of the loops' lambdas, which capture more than its inline buffer holds, allocated per
  // region).
  template <typename Fn>
  void run(Fn&& fn) {
    run_job(Job{std::addressof(fn),
                [](const void* f, int t) { (*static_cast<const std::remove_reference_t<Fn>*>(f))(t); }});
  }

  // Splits [0, n) into size() contiguous chunks (sizes differ by at most one `grain`) and runs
  // fn(begin, end, thread_index) for each non-empty chunk. Chunk boundaries are multiples of `grain` except
  // the last. The split depends only on n, grain and size(), never on timing.
  template <typename Fn>
  void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
    const int64_t units = units_or_inline(n, grain, fn);
    if (units == 0) return;
    run([&](int t) {
      const int64_t per = units / n_threads_, extra = units % n_threads_;
      const int64_t u0 = t * per + (t < extra ? t : extra);
      const int64_t u1 = u0 + per + (t < extra ? 1 : 0);
      const int64_t b = u0 * grain, e = u1 * grain < n ? u1 * grain : n;
      if (b < e) fn(b, e, t);
    });
  }

  // Runs fn(begin, end, thread_index) over [0, n) in chunks handed out as threads ask for them (guided: a
  // chunk is half of the remaining work's even share, at least `grain`; boundaries are multiples of `grain`
  // except the last), so a thread slowed by the machine never leaves the others idle at the barrier. Which
  // thread runs a chunk depends on timing: fn's results must not depend on the thread index (use it only to
  // pick per-thread scratch).
  template <typename Fn>
  void parallel_for_dynamic(int64_t n, int64_t grain, Fn&& fn) {
    const int64_t units = units_or_inline(n, grain, fn);
    if (units == 0) return;
    std::atomic<int64_t> next{0};
    const int64_t split = 2 * static_cast<int64_t>(n_threads_);
    run([&](int t) {
      int64_t u0 = next.load(std::memory_order_relaxed);
      while (u0 < units) {
        const int64_t take = std::max<int64_t>(1, (units - u0) / split);
        if (!next.compare_exchange_weak(u0, u0 + take, std::memory_order_relaxed)) continue;
        const int64_t b = u0 * grain, e = std::min(n, (u0 + take) * grain);
        fn(b, e, t);
        u0 = next.load(std::memory_order_relaxed);
      }
    });
  }

  // Runs fn(begin, end, thread_index) over [0, n) so that each thread reads one contiguous run: thread t owns
  // the t-th of size() near-equal contiguous shares (in whole `grain`s) and takes it from the front, a
  // quarter of what is left of it at a time; a thread whose share is done takes half of what is left of
  // another's from its back (boundaries are multiples of `grain` except the last), so a thread slowed by the
  // machine never leaves the others idle at the barrier, yet each thread's reads run on in address order
  // until it steals. Which thread runs a chunk depends on timing: fn's results must not depend on the thread
  // index.
  template <typename Fn>
  void parallel_for_stealing(int64_t n, int64_t grain, Fn&& fn) {
    const int64_t units = units_or_inline(n, grain, fn);
    if (units == 0) return;
    if (units > INT32_MAX) {  // a share's bounds pack in 32 bits each
      parallel_for_dynamic(n, grain, fn);
      return;
    }
    const int64_t T = n_threads_;
    for (int64_t t = 0; t < T; ++t)
      shares_[static_cast<size_t>(t)].bounds.store(pack(t * units / T, (t + 1) * units / T),
                                                   std::memory_order_relaxed);
    run([&](int t) {
      // Claims [lo, lo + take) (from the front) or [hi - take, hi) (from the back) of a share by one
      // compare-and-swap of its packed bounds; false once the share is empty.
      const auto claim = [&](Share& share, bool front) {
        uint64_t b = share.bounds.load(std::memory_order_relaxed);
        for (;;) {
          const int64_t lo = static_cast<int64_t>(b >> 32), hi = static_cast<int64_t>(b & 0xFFFFFFFFu);
          if (lo >= hi) return false;
          const int64_t take = std::max<int64_t>(1, (hi - lo) / (front ? 4 : 2));
          const int64_t u0 = front ? lo : hi - take;
          if (share.bounds.compare_exchange_weak(b, front ? pack(lo + take, hi) : pack(lo, hi - take),
                                                 std::memory_order_relaxed)) {
            fn(u0 * grain, std::min(n, (u0 + take) * grain), t);
            return true;
          }
        }
      };
      while (claim(shares_[static_cast<size_t>(t)], true)) {
      }
      for (int64_t k = 1; k < T; ++k)
        while (claim(shares_[static_cast<size_t>((t + k) % T)], false)) {
        }
    });
  }

  // Number of physical cores (best effort: logical CPUs divided by SMT siblings), at least 1.
  static int physical_cores();

 private:
  // A callable and how to call it, by reference.
  struct Job {
    const void* fn = nullptr;
    void (*call)(const void*, int) = nullptr;
    void operator()(int t) const { call(fn, t); }
  };
  void run_job(Job job);
  void worker(int index);

  // One index's state, a cache line each: its share for parallel_for_stealing ([lo, hi) in units, lo in the
  // high 32 bits), so that owners claiming from their own shares do not contend; and the generation of the
  // last region whose index was claimed (by its worker or by the caller).
  struct alignas(64) Share {
    std::atomic<uint64_t> bounds{0};
    std::atomic<uint64_t> claimed{0};
  };
  // Claims index t for region `generation`; false where it is claimed already (a worker that woke late).
  bool claim(int t, uint64_t generation);
  // The grains of a loop over [0, n), or 0 where there was nothing to share: no work, or run inline on the
  // caller as fn(0, n, 0) (one thread, or a single grain).
  template <typename Fn>
  int64_t units_or_inline(int64_t n, int64_t grain, Fn& fn) {
    if (n <= 0) return 0;
    const int64_t units = (n + grain - 1) / grain;
    if (n_threads_ > 1 && units > 1) return units;
    fn(int64_t{0}, n, 0);
    return 0;
  }
  static uint64_t pack(int64_t lo, int64_t hi) {
    return (static_cast<uint64_t>(lo) << 32) | static_cast<uint64_t>(hi);
  }

  int n_threads_;
  std::unique_ptr<Share[]> shares_;
  std::vector<std::thread> threads_;
  Job job_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tandem
