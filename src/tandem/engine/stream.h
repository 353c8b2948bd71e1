// What the scheduler tells a request's consumer: generated tokens, then one final event. A Stream is shared
// by the scheduler thread (which pushes) and one consumer thread (which pops and may cancel).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tandem::engine {

enum class Finish {
  kStop,       // an end-of-generation token (not reported as a token)
  kLength,     // max_tokens or the context reached
  kCancelled,  // the consumer cancelled, or the scheduler was stopped while the sequence ran
  kError,      // the engine failed this sequence (message in Event::error)
  kDrained,    // never started: the scheduler began draining (or stopped) first; nothing was generated
};
inline constexpr int kFinishReasons = 5;
const char* finish_name(Finish f);

struct TokenEvent {
  int32_t id = 0;
  double logprob = 0;                           // log-softmax of the raw logits (when requested)
  std::vector<std::pair<int32_t, double>> top;  // the top_logprobs alternatives, most likely first
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt positions reused from an earlier request
};

struct Event {
  enum class Kind { kToken, kDone };
  Kind kind = Kind::kToken;
  TokenEvent token;               // kToken
  Finish finish = Finish::kStop;  // kDone
  std::string error;              // kDone with kError
  Usage usage;                    // kDone
};

class Stream {
 public:
  // Waits up to `timeout` for the next event; false when none came.
  bool next(Event& out, std::chrono::milliseconds timeout);
  // Asks the scheduler to stop this request; it frees the sequence within one iteration and then pushes a
  // kDone event with kCancelled (unless the request finished first). Safe from any thread.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  // True once the kDone event has been pushed.
  bool done() const { return done_.load(std::memory_order_acquire); }

  // Scheduler side.
  void push(Event event);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> done_{false};
};

}  // namespace tandem::engine
