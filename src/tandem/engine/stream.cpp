#include "tandem/engine/stream.h"

namespace tandem::engine {

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::kStop:
      return "stop";
    case Finish::kLength:
      return "length";
    case Finish::kCancelled:
      return "cancelled";
    case Finish::kError:
      return "error";
    case Finish::kDrained:
      return "drained";
  }
  return "?";
}

bool Stream::next(Event& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  out = std::move(events_.front());
  events_.pop_front();
  return true;
}

void Stream::push(Event event) {
  const bool last = event.kind == Event::Kind::kDone;
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  if (last) done_.store(true, std::memory_order_release);
  cv_.notify_one();
}

}  // namespace tandem::engine
