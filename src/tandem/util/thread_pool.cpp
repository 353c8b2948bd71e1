#include "tandem/util/thread_pool.h"

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
constexpr int kSpinIterations = 1 << 14;
}

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
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0);
  // Wait for the workers: spin first (regions are short), then yield.
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < kSpinIterations) {
      TANDEM_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = Job{};
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    int spins = 0;
    while (g == seen) {
      if (++spins < kSpinIterations) {
        TANDEM_PAUSE();
      } else {
        generation_.wait(g, std::memory_order_acquire);
      }
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    job_(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
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
