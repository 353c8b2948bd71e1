// A persistent team of threads for data-parallel loops. Threads are created once; each parallel region wakes
// them through an atomic generation counter (spin briefly, then wait), so no thread is created per token.
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

  // Runs fn(thread_index) on every thread of the team (0..size()-1) and returns when all have finished.
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
    if (n <= 0) return;
    const int64_t units = (n + grain - 1) / grain;
    if (n_threads_ == 1 || units == 1) {
      fn(int64_t{0}, n, 0);
      return;
    }
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
    if (n <= 0) return;
    const int64_t units = (n + grain - 1) / grain;
    if (n_threads_ == 1 || units == 1) {
      fn(int64_t{0}, n, 0);
      return;
    }
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

  int n_threads_;
  std::vector<std::thread> threads_;
  Job job_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tandem
