#include "tandem/util/thread_pool.h"

#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "tandem/util/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define TANDEM_PAUSE() asm volatile("yield")
#else
#define TANDEM_PAUSE() ((void)0)
#endif

namespace tandem {
namespace {

// How long a waiting thread spins before it blocks. Back-to-back regions (a forward's matmuls, a few
// microseconds of serial work apart) find the workers still spinning and pay no system call. Where more
// threads are runnable than there are cores, a spinning thread holds a core that a thread with work (or the
// region's caller) needs, for up to a scheduler time slice; blocking after a bounded spin gives it back.
// (Yielding the core while spinning instead handed it to the other processes' threads for whole slices.)
constexpr auto kSpinTime = std::chrono::microseconds(50);

// Spins until done() holds or kSpinTime has passed; returns done() at the end. The clock is read once per
// few pauses (a read costs about as much as one pause).
template <typename Done>
bool spin_until(Done&& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (done()) return true;
      TANDEM_PAUSE();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  if (n_threads < 1) throw Error("thread count must be at least 1 (got " + std::to_string(n_threads) + ")");
  shares_ = std::make_unique<Share[]>(static_cast<size_t>(n_threads));
  threads_.reserve(static_cast<size_t>(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run_job(Job fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  job_ = fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  const uint64_t g = generation_.fetch_add(1, std::memory_order_acq_rel) + 1;
  generation_.notify_all();
  fn(0);
  // Indices whose workers have not started them run here, after a short wait for the workers to claim them:
  // a region never waits for a thread that the system has not scheduled.
  const auto all_claimed = [&] {
    for (int t = 1; t < n_threads_; ++t)
      if (shares_[static_cast<size_t>(t)].claimed.load(std::memory_order_acquire) < g) return false;
    return true;
  };
  if (!spin_until(all_claimed)) {
    for (int t = 1; t < n_threads_; ++t) {
      if (!claim(t, g)) continue;
      fn(t);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
  if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    for (int left; (left = pending_.load(std::memory_order_acquire)) != 0;)
      pending_.wait(left, std::memory_order_acquire);
  }
  job_ = Job{};
}

bool ThreadPool::claim(int t, uint64_t generation) {
  std::atomic<uint64_t>& claimed = shares_[static_cast<size_t>(t)].claimed;
  uint64_t last = claimed.load(std::memory_order_acquire);
  while (last < generation)
    if (claimed.compare_exchange_weak(last, generation, std::memory_order_acq_rel, std::memory_order_acquire))
      return true;
  return false;
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = seen;
    if (!spin_until([&] { return (g = generation_.load(std::memory_order_acquire)) != seen; })) {
      while ((g = generation_.load(std::memory_order_acquire)) == seen)
        generation_.wait(seen, std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    // A worker that woke after the caller ran its index (or after the region ended: every index of a region
    // is claimed before it ends) skips it.
    if (!claim(index, g)) continue;
    job_(index);
    // The last index to finish wakes the caller if it blocked (a notify without waiters is one load).
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

int ThreadPool::physical_cores() {
  // Count distinct (physical id, core id) pairs in /proc/cpuinfo; fall back to hardware_concurrency.
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, phys = "0";
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    std::string val = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "physical id") phys = val;
    if (key == "core id") cores.emplace(phys, val);
  }
  int n = static_cast<int>(cores.size());
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return n > 0 ? n : 1;
}

}  // namespace tandem
