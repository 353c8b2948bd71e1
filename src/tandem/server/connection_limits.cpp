#include "tandem/server/connection_limits.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <vector>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace tandem::server {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Headers cpp-httplib adds to every request itself; they do not count against max_headers.
constexpr const char* kAddedHeaders[] = {"REMOTE_ADDR", "REMOTE_PORT", "LOCAL_ADDR", "LOCAL_PORT"};
// A request that read at least this much body asks for freed memory to go back to the system.
constexpr size_t kLargeBody = 256u << 10;
// Between two trims under continuous load; an idle server trims at once.
constexpr auto kTrimInterval = std::chrono::seconds(1);
// Requests one connection may carry before it is closed (cpp-httplib's default is 5).
constexpr size_t kKeepAliveRequests = 1000;
// Longest wait, after an error response, for the rest of a request the client is still sending.
constexpr int64_t kLingerMs = 2000;

// Waits up to `timeout` for `events` on the socket; false on timeout, error or hang-up without them.
bool poll_for(socket_t sock, short events, milliseconds timeout) {
  pollfd p{sock, events, 0};
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (r > 0) return (p.revents & events) != 0;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

std::string canned_response(const ApiError& e, const char* reason, int retry_after) {
  const std::string body = dump(e.to_json());
  std::string head = "HTTP/1.1 " + std::to_string(e.status) + " " + reason +
                     "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                     "\r\nConnection: close\r\n";
  if (retry_after > 0) head += "Retry-After: " + std::to_string(retry_after) + "\r\n";
  return head + "\r\n" + body;
}

const char* reason_of(int status) {
  switch (status) {
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    default:
      return "Service Unavailable";
  }
}

// Every read of a request goes through here: bytes are counted against the head or body limit as they are
// handed to the parser, and no read waits past the request's deadline. Reads are buffered (the parser asks
// for one byte at a time); bytes of a pipelined next request stay buffered for it.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(socket_t sock, const ConnectionLimits& limits, ConnectionState& state)
      : sock_(sock), limits_(limits), state_(state) {}

  // Waits for the first byte of the next request; false when the connection idles past idle_timeout, closes,
  // or `stopping` turns true (checked every 100 ms).
  template <typename Stop>
  bool wait_for_request(Stop stopping) {
    if (pos_ < len_) return true;
    const auto deadline = Clock::now() + limits_.idle_timeout;
    while (!stopping()) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      if (poll_for(sock_, POLLIN, std::min(left, milliseconds(100)))) return true;
    }
    return false;
  }
  void begin_request() {
    head_ = true;
    counted_ = 0;
    written_ = 0;
    body_limit_ = 0;
    deadline_ = Clock::now() + limits_.request_timeout;
  }
  void end_head(size_t body_limit) {
    head_ = false;
    counted_ = 0;
    body_limit_ = body_limit;
  }
  size_t body_read() const { return head_ ? 0 : counted_; }
  size_t written() const { return written_; }

  bool is_readable() const override { return pos_ < len_ || poll_for(sock_, POLLIN, time_left()); }
  bool is_writable() const override {
    pollfd p{sock_, POLLOUT, 0};
    const int r = ::poll(&p, 1, static_cast<int>(limits_.write_timeout.count()));
    return r > 0 && (p.revents & POLLOUT) && !(p.revents & (POLLERR | POLLHUP));
  }

  ssize_t read(char* ptr, size_t size) override {
    if (state_.limit != ReadLimit::kNone) return -1;
    const size_t limit = head_ ? limits_.max_header_bytes : body_limit_;
    if (counted_ >= limit) {
      state_.limit = head_ ? ReadLimit::kHeaderBytes : ReadLimit::kBodyBytes;
      return -1;
    }
    if (pos_ == len_) {
      if (!poll_for(sock_, POLLIN, time_left())) {
        state_.limit = ReadLimit::kTimeout;
        return -1;
      }
      const ssize_t n = ::recv(sock_, buf_.data(), buf_.size(), 0);
      if (n <= 0) return n;
      pos_ = 0;
      len_ = static_cast<size_t>(n);
    }
    const size_t n = std::min({size, len_ - pos_, limit - counted_});
    std::memcpy(ptr, buf_.data() + pos_, n);
    pos_ += n;
    counted_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!poll_for(sock_, POLLOUT, limits_.write_timeout)) return -1;
    const ssize_t n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    if (n > 0) written_ += static_cast<size_t>(n);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address(::getpeername, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address(::getsockname, ip, port); }
  socket_t socket() const override { return sock_; }

 private:
  milliseconds time_left() const {
    return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(deadline_ - Clock::now()));
  }
  template <typename Fn>
  void address(Fn get, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ip.clear();
    port = -1;
    if (get(sock_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
      port = ntohs(a->sin6_port);
    }
    ip = text;
  }

  socket_t sock_;
  const ConnectionLimits& limits_;
  ConnectionState& state_;
  std::array<char, 16384> buf_{};
  size_t pos_ = 0, len_ = 0;
  bool head_ = true;
  size_t counted_ = 0;     // bytes of the current head or body handed to the parser
  size_t body_limit_ = 0;  // raw body bytes the current request may send
  size_t written_ = 0;     // response bytes of the current request
  Clock::time_point deadline_ = Clock::now();
};

}  // namespace

// One thread per admitted connection, started when no idle one is free, so that no connection ever waits
// behind another. Past max_connections the connection is handed to a single refusal thread, which answers
// 503 (LimitedServer knows it by the thread it runs on) without giving it a thread of its own.
//
// Threads idle for kThreadIdle beyond kSpareThreads end, and the listening thread joins them when it next
// accepts or idles (on_idle), then calls `reaped`: a burst of connections leaves no threads behind.
class ConnectionQueue final : public httplib::TaskQueue {
 public:
  ConnectionQueue(size_t max_connections, std::function<void()> reaped)
      : max_(max_connections), reaped_(std::move(reaped)) {
    refuser_ = std::thread([this] { refuse_loop(); });
  }
  ~ConnectionQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    reap();
    std::unique_lock lock(mu_);
    if (busy_ + jobs_.size() >= max_) {
      refusals_.push_back(std::move(fn));
      refuse_cv_.notify_one();
      return;
    }
    jobs_.push_back(std::move(fn));
    if (idle_ >= jobs_.size())
      cv_.notify_one();
    else
      start_worker();
  }

  void on_idle() override {
    if (reap() > 0 && reaped_) reaped_();
  }

  void shutdown() override {
    {
      std::unique_lock lock(mu_);
      if (shut_) return;
      shut_ = true;
    }
    cv_.notify_all();
    refuse_cv_.notify_all();
    for (auto& [id, t] : workers_) t.join();
    workers_.clear();
    refuser_.join();
  }

  bool on_refusal_thread() const { return std::this_thread::get_id() == refuser_.get_id(); }
  // Refusals waiting: with many, each is answered without waiting for its request to arrive.
  size_t refusal_backlog() {
    std::unique_lock lock(mu_);
    return refusals_.size();
  }

 private:
  void start_worker() {
    std::thread t([this] { work(); });
    const std::thread::id id = t.get_id();
    workers_.emplace(id, std::move(t));
  }
  // Joins the threads that ended; returns how many.
  size_t reap() {
    std::vector<std::thread::id> done;
    {
      std::unique_lock lock(mu_);
      done.swap(exited_);
    }
    for (const std::thread::id& id : done) {
      auto it = workers_.find(id);
      if (it == workers_.end()) continue;
      it->second.join();
      workers_.erase(it);
    }
    return done.size();
  }
  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      ++idle_;
      const bool woken = cv_.wait_for(lock, kThreadIdle, [&] { return !jobs_.empty() || shut_; });
      --idle_;
      if (!woken && idle_ + busy_ >= kSpareThreads) {
        exited_.push_back(std::this_thread::get_id());
        return;
      }
      if (jobs_.empty()) {
        if (shut_) return;
        continue;
      }
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      ++busy_;
      lock.unlock();
      fn();
      lock.lock();
      --busy_;
    }
  }
  void refuse_loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      const auto ready = [&] { return !refusals_.empty() || shut_; };
      if (lingering_.empty())
        refuse_cv_.wait(lock, ready);
      else
        refuse_cv_.wait_for(lock, kLingerPoll, ready);
      if (refusals_.empty() && shut_) break;
      if (!refusals_.empty()) {
        std::function<void()> fn = std::move(refusals_.front());
        refusals_.pop_front();
        lock.unlock();
        fn();
        lock.lock();
      }
      lock.unlock();
      drain_lingering(false);
      lock.lock();
    }
    lock.unlock();
    drain_lingering(true);
  }

 public:
  // A refused socket whose answer is sent and whose writing side is shut: the refusal thread reads and drops
  // what the client still sends until it closes or `kLinger` passes, between refusals, so that closing does
  // not reset the connection before the client has read the answer, and no refusal waits for another's
  // client. Refusal thread only.
  void linger(int sock) {
    if (lingering_.size() >= kMaxLingering) {
      ::close(lingering_.front().sock);
      lingering_.pop_front();
    }
    lingering_.push_back({sock, Clock::now() + kLinger});
  }

 private:
  struct Lingering {
    int sock;
    Clock::time_point until;
  };
  void drain_lingering(bool all) {
    char sink[4096];
    const auto now = Clock::now();
    std::erase_if(lingering_, [&](const Lingering& l) {
      ssize_t n = 0;
      for (int i = 0; i < 16 && (n = ::recv(l.sock, sink, sizeof sink, MSG_DONTWAIT)) > 0; ++i) {
      }
      const bool open = n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
      if (!all && open && now < l.until) return false;
      ::close(l.sock);
      return true;
    });
  }

  static constexpr size_t kMaxLingering = 1024;
  static constexpr std::chrono::milliseconds kLinger{200}, kLingerPoll{20};
  std::deque<Lingering> lingering_;  // refusal thread only

  static constexpr size_t kSpareThreads = 8;
  static constexpr std::chrono::seconds kThreadIdle{2};

  const size_t max_;
  const std::function<void()> reaped_;
  std::mutex mu_;
  std::condition_variable cv_, refuse_cv_;
  std::deque<std::function<void()>> jobs_, refusals_;         // guarded by mu_
  size_t busy_ = 0, idle_ = 0;                                // guarded by mu_
  bool shut_ = false;                                         // guarded by mu_
  std::vector<std::thread::id> exited_;                       // guarded by mu_
  std::unordered_map<std::thread::id, std::thread> workers_;  // only the listening thread touches it
  std::thread refuser_;
};

LimitedServer::LimitedServer(const ConnectionLimits& limits) : limits_(limits), last_trim_(Clock::now()) {
  new_task_queue = [this] {
    auto* q = new ConnectionQueue(limits_.max_connections, [this] { trim(); });
    queue_.store(q);
    return q;
  };
  const auto write_s = std::chrono::duration_cast<std::chrono::microseconds>(limits_.write_timeout);
  set_write_timeout(write_s.count() / 1000000, write_s.count() % 1000000);
  set_payload_max_length(limits_.max_body_bytes);
  set_keep_alive_max_count(kKeepAliveRequests);
  // The Keep-Alive header tells clients how long an idle connection stays open; advertising more than
  // idle_timeout lets a client reuse a connection the server is closing, and lose that request.
  set_keep_alive_timeout(std::chrono::duration_cast<std::chrono::seconds>(limits_.idle_timeout).count());
  set_idle_interval(1);  // on_idle: ended threads are joined while no connection arrives
}

LimitedServer::~LimitedServer() = default;

void LimitedServer::widen_backlog() {
  const socket_t sock = svr_sock_;
  if (sock != INVALID_SOCKET)
    ::listen(sock, static_cast<int>(std::min<size_t>(limits_.max_connections, 4096)));
}

size_t LimitedServer::raw_body_limit() const {
  return 2 * limits_.max_body_bytes + (64u << 10);
}

socket_t LimitedServer::current_socket() {
  ConnectionState* c = current();
  return c ? c->sock : INVALID_SOCKET;
}

ConnectionState* LimitedServer::current() {
  std::unique_lock lock(registry_mu_);
  auto it = registry_.find(std::this_thread::get_id());
  return it == registry_.end() ? nullptr : it->second;
}

std::optional<ApiError> LimitedServer::limit_error() {
  ConnectionState* c = current();
  if (!c) return std::nullopt;
  const auto seconds = [](milliseconds ms) { return std::to_string((ms.count() + 999) / 1000); };
  switch (c->limit) {
    case ReadLimit::kNone:
      return std::nullopt;
    case ReadLimit::kHeaderBytes:
      return ApiError(431, "invalid_request_error",
                      "The request line and headers are larger than the limit of " +
                          std::to_string(limits_.max_header_bytes) + " bytes (--max-header-bytes)",
                      {}, "request_header_too_large");
    case ReadLimit::kHeaderCount:
      return ApiError(431, "invalid_request_error",
                      "The request has more than " + std::to_string(limits_.max_headers) +
                          " header fields (--max-headers)",
                      {}, "request_header_too_large");
    case ReadLimit::kBodyBytes:
      return ApiError(413, "invalid_request_error",
                      "The request body is larger than the limit of " +
                          std::to_string(limits_.max_body_bytes) + " bytes (--max-body)",
                      {}, "request_too_large");
    case ReadLimit::kTimeout:
      return ApiError(408, "invalid_request_error",
                      "The request did not arrive in full within " + seconds(limits_.request_timeout) +
                          " s (--request-timeout)",
                      {}, "request_timeout");
  }
  return std::nullopt;
}

void LimitedServer::close_after_response() {
  if (ConnectionState* c = current()) c->close = true;
}

bool LimitedServer::process_and_close_socket(socket_t sock) {
  ConnectionQueue* q = queue_.load();
  if (q && q->on_refusal_thread()) {
    // Wait briefly for the request so that closing does not reset the connection before the client reads
    // the answer; with a backlog, answer at once.
    const bool quick = q->refusal_backlog() > 8;
    char sink[4096];
    if (!quick) poll_for(sock, POLLIN, milliseconds(100));
    for (int i = 0; i < 16 && ::recv(sock, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
    }
    const std::string answer =
        canned_response(ApiError(503, "server_error",
                                 "The server has " + std::to_string(limits_.max_connections) +
                                     " connections open, its limit (--max-connections); retry later",
                                 {}, "too_many_connections"),
                        "Service Unavailable", limits_.retry_after_seconds);
    (void)::send(sock, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(sock, SHUT_WR);
    if (quick) {
      q->linger(sock);  // closed by the refusal thread once the client closes, or after a short while
      return false;
    }
    while (poll_for(sock, POLLIN, milliseconds(100)) && ::recv(sock, sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    ::close(sock);
    return false;
  }
  if (serve_connection(sock)) {
    // Closing with input unread resets the connection, and a client still sending the body it declared
    // would lose the error it was answered. So the input is read and dropped first, a bounded while.
    const auto until = Clock::now() + std::min(limits_.request_timeout, milliseconds(kLingerMs));
    char sink[16384];
    size_t drained = 0;
    while (drained < raw_body_limit()) {
      const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
      if (left.count() <= 0 || !poll_for(sock, POLLIN, left)) break;
      const ssize_t n = ::recv(sock, sink, sizeof sink, MSG_DONTWAIT);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return true;
}

bool LimitedServer::serve_connection(socket_t sock) {
  // Responses go out as a head and a body in two writes; with Nagle's algorithm the body waits for the
  // client's delayed ACK of the head (40 ms on Linux) on every keep-alive request.
  int one = 1;
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ConnectionState state;
  ConnectionStream strm(sock, limits_, state);
  {
    std::unique_lock lock(registry_mu_);
    registry_[std::this_thread::get_id()] = &state;
  }
  const auto stopping = [this] { return svr_sock_ == INVALID_SOCKET; };
  bool refused = false;
  for (size_t count = keep_alive_max_count_; count > 0 && !stopping(); --count) {
    if (!strm.wait_for_request(stopping)) break;
    state = ConnectionState{};
    state.sock = sock;
    strm.begin_request();
    bool closed = false;
    ++in_flight_;
    const bool ok = process_request(strm, count == 1, closed, [&](httplib::Request& req) {
      size_t n = req.headers.size();
      for (const char* added : kAddedHeaders) n -= std::min(n, req.headers.count(added));
      size_t body_limit = raw_body_limit();
      if (n > limits_.max_headers) {
        state.limit = ReadLimit::kHeaderCount;
        body_limit = 0;
      } else if (req.has_header("Content-Length") &&
                 std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) > body_limit) {
        // Refused without reading it. A body over --max-body but within this is read and dropped before
        // the 413 (httplib does so): clients that are still sending when the answer comes may lose it.
        body_limit = 0;
      }
      strm.end_head(body_limit);
    });
    // A limit hit before the parser could answer (the request line itself) still gets its error.
    if (!ok && strm.written() == 0)
      if (std::optional<ApiError> e = limit_error()) {
        const std::string answer = canned_response(*e, reason_of(e->status), 0);
        strm.write(answer.data(), answer.size());
      }
    --in_flight_;
    request_ended(strm.body_read() >= kLargeBody || state.limit != ReadLimit::kNone);
    refused = state.close || state.limit != ReadLimit::kNone;
    if (!ok || closed || refused) break;
  }
  std::unique_lock lock(registry_mu_);
  registry_.erase(std::this_thread::get_id());
  return refused;
}

// Large bodies leave freed memory that glibc keeps (its mmap threshold rises after the first large free, so
// later bodies come from the heap); returning it once the burst is over keeps the resident size near its
// steady state.
void LimitedServer::request_ended(bool large) {
  std::unique_lock lock(trim_mu_);
  trim_pending_ = trim_pending_ || large;
  if (!trim_pending_) return;
  const auto now = Clock::now();
  if (in_flight_.load() > 0 && now - last_trim_ < kTrimInterval) return;
  trim_pending_ = false;
  last_trim_ = now;
  lock.unlock();
  trim();
}

void LimitedServer::trim() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

}  // namespace tandem::server
