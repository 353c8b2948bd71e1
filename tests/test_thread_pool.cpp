#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "tandem/util/error.h"
#include "tandem/util/thread_pool.h"

#include "alloc_counter.inc"  // g_allocations, TANDEM_COUNTS_ALLOCATIONS

namespace {

using tandem::ThreadPool;

// Every index of [0, n) is visited exactly once, by each of the three loop forms, for grains that do and do
// not divide n.
TEST(ThreadPool, LoopsCoverEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 64, 1000}) {
      for (int64_t grain : {1, 3, 16}) {
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        const auto mark = [&](int64_t b, int64_t e, int t) {
          EXPECT_GE(t, 0);
          EXPECT_LT(t, threads);
          EXPECT_TRUE(b % grain == 0) << "chunk boundaries are multiples of the grain";
          for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
        };
        pool.parallel_for(n, grain, mark);
        pool.parallel_for_dynamic(n, grain, mark);
        pool.parallel_for_stealing(n, grain, mark);
        for (int64_t i = 0; i < n; ++i)
          EXPECT_EQ(seen[static_cast<size_t>(i)].load(), 3) << "n " << n << " grain " << grain << " i " << i;
      }
    }
  }
}

// parallel_for_stealing: each thread takes its own share from the front, in address order, and a thread
// whose share is done takes from the back of another's. Here thread 0 holds its first chunk until thread 1
// has finished its own share, so thread 1 must steal from thread 0's.
TEST(ThreadPool, StealingLoopTakesOwnShareInOrderThenSteals) {
  ThreadPool pool(2);
  const int64_t n = 100;  // shares [0, 50) and [50, 100)
  std::vector<std::atomic<int>> by(static_cast<size_t>(n));
  std::atomic<int64_t> share1_done{0};
  std::vector<int64_t> starts0;  // chunk starts thread 0 ran (its own thread only writes them)
  starts0.reserve(static_cast<size_t>(n));
  bool waited = false;
  pool.parallel_for_stealing(n, 1, [&](int64_t b, int64_t e, int t) {
    if (t == 0 && !waited) {
      waited = true;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (share1_done.load() < 50 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
    }
    if (t == 0) starts0.push_back(b);
    for (int64_t i = b; i < e; ++i) {
      by[static_cast<size_t>(i)].store(t + 1);
      if (t == 1 && i >= 50) share1_done.fetch_add(1);
    }
  });
  int stolen = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NE(by[static_cast<size_t>(i)].load(), 0) << "index " << i << " was not run";
    if (i < 50 && by[static_cast<size_t>(i)].load() == 2) ++stolen;
  }
  EXPECT_EQ(share1_done.load(), 50) << "thread 1 runs its own share";
  EXPECT_GT(stolen, 0) << "thread 1 takes from thread 0's share once its own is done";
  EXPECT_EQ(starts0.front(), 0);
  EXPECT_TRUE(std::is_sorted(starts0.begin(), starts0.end())) << "a share is taken front to back";
}

// run() calls the callable once per thread, each with its own index.
TEST(ThreadPool, RunGivesEachThreadItsIndex) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> calls(3);
  for (int rep = 0; rep < 100; ++rep) pool.run([&](int t) { calls[static_cast<size_t>(t)].fetch_add(1); });
  for (auto& c : calls) EXPECT_EQ(c.load(), 100);
}

// A parallel region allocates nothing, however much its loop body captures (the matmuls run a few hundred
// regions per token).
TEST(ThreadPool, RegionsDoNotAllocate) {
  if (!TANDEM_COUNTS_ALLOCATIONS) GTEST_SKIP() << "allocations are not counted under AddressSanitizer";
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  const int64_t a = 1, b = 2, c = 3, d = 4, e = 5;  // captured by reference: more than a small buffer holds
  const auto body = [&](int64_t lo, int64_t hi, int) {
    for (int64_t i = lo; i < hi; ++i) sum.fetch_add(i * a + b + c + d + e, std::memory_order_relaxed);
  };
  pool.parallel_for(100, 1, body);  // warm up
  const size_t before = g_allocations.load();
  for (int rep = 0; rep < 50; ++rep) {
    pool.parallel_for(100, 1, body);
    pool.parallel_for_dynamic(100, 1, body);
    pool.parallel_for_stealing(100, 1, body);
    pool.run([&](int t) { sum.fetch_add(t + a + b + c + d + e, std::memory_order_relaxed); });
  }
  EXPECT_EQ(g_allocations.load() - before, 0u);
}

// With more pool threads than cores, and other busy threads loading every core, many short regions in a row
// still finish in a time comparable to running the same work on one thread: a waiting thread spins only
// briefly, then blocks, so it does not hold a core that a thread with work (or the region's caller) needs.
// A pool whose waiting threads spun for long, and whose regions waited for every worker, took hundreds of
// times longer here (seconds); the bound allows a second of scheduling noise on a loaded machine.
TEST(ThreadPool, ShortRegionsStayFastWhenCoresAreOversubscribed) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::atomic<bool> stop_load{false};
  std::vector<std::thread> load;
  for (int i = 0; i < cores; ++i)
    load.emplace_back([&] {
      volatile uint64_t x = 0;
      while (!stop_load.load(std::memory_order_relaxed)) x = x + 1;
    });
  const int64_t n = 4096, regions = 400;
  std::vector<float> out(static_cast<size_t>(n));
  const auto work = [&](ThreadPool& pool) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < regions; ++r)
      pool.parallel_for(n, 64, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {
          float v = static_cast<float>(i + r);
          for (int k = 0; k < 8; ++k) v = v * 0.5f + 1.0f;
          out[static_cast<size_t>(i)] = v;
        }
      });
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  ThreadPool one(1), many(2 * cores + 1);
  // The smaller of two runs each, alternating, so that a burst of outside load hits both.
  double t_one = 1e9, t_many = 1e9;
  for (int rep = 0; rep < 2; ++rep) {
    t_one = std::min(t_one, work(one));
    t_many = std::min(t_many, work(many));
  }
  stop_load.store(true);
  for (auto& t : load) t.join();
  EXPECT_LT(t_many, 20 * t_one + 1.0) << "one thread " << t_one << " s, " << many.size() << " threads "
                                      << t_many << " s for " << regions << " regions";
}

TEST(ThreadPool, RejectsZeroThreads) {
  EXPECT_THROW(ThreadPool(0), tandem::Error);
}

}  // namespace
