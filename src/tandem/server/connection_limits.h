// The HTTP server's connection layer, with bounds a client cannot get around: how many connections are open
// at once, how long a connection may sit idle, how long a request may take to arrive, how large its head
// (request line and headers) and body may be, chunked or not.
//
// cpp-httplib's own pool queues every accepted connection behind the busy ones without bound, so a few
// connections that send nothing delay everyone queued behind them; and its chunked reader appends to the body
// with no limit. LimitedServer replaces both: each admitted connection gets a thread of its own at once (up
// to max_connections; past that a connection is answered 503 and closed without being read), and every byte
// of a request is read through a stream that enforces the limits and the request's deadline.
//
// When a limit stops the reading, the handlers ask limit_error() for the error to answer; every error
// response closes its connection, so an unread body is never taken for the next request.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "tandem/server/openai_api.h"

namespace tandem::server {

struct ConnectionLimits {
  size_t max_connections = 512;                      // open at once; more are answered 503 and closed
  size_t max_headers = 100;                          // header fields per request; more get 431
  size_t max_header_bytes = 64u << 10;               // request line and headers together; more get 431
  size_t max_body_bytes = 4u << 20;                  // the body as sent (chunk framing aside); more get 413
  std::chrono::milliseconds idle_timeout{5000};      // a connection waiting for its next request is closed
  std::chrono::milliseconds request_timeout{30000};  // a request's head and body must arrive within this; 408
  std::chrono::milliseconds write_timeout{10000};    // a client that takes no bytes for this long is dropped
  int retry_after_seconds = 1;                       // sent with the 503 of a full server
};

// Why the reading of the current request stopped early.
enum class ReadLimit { kNone, kHeaderBytes, kHeaderCount, kBodyBytes, kTimeout };

// What the server knows of the request being read on one connection.
struct ConnectionState {
  ReadLimit limit = ReadLimit::kNone;
  bool close = false;              // close the connection after the current response
  socket_t sock = INVALID_SOCKET;  // the connection's socket (owned by the server)
};

class ConnectionQueue;

class LimitedServer : public httplib::Server {
 public:
  explicit LimitedServer(const ConnectionLimits& limits);
  ~LimitedServer() override;

  const ConnectionLimits& limits() const { return limits_; }
  // The error for a request whose reading a limit stopped, on the connection the calling thread serves.
  std::optional<ApiError> limit_error();
  // The socket of the connection the calling thread serves (INVALID_SOCKET outside a request handler).
  // Borrowed: the server closes it after the connection's last response.
  socket_t current_socket();
  // Closes the calling thread's connection once the current response is sent.
  void close_after_response();
  // Call after binding: cpp-httplib listens with a backlog of 5, and a burst of connections past it waits
  // out SYN retransmissions (a second or more) or is reset. The backlog becomes max_connections.
  void widen_backlog();
  // The body a chunked request may carry on the wire: the decoded limit plus room for chunk framing.
  size_t raw_body_limit() const;

 private:
  bool process_and_close_socket(socket_t sock) override;
  // Serves requests until the connection closes, idles out or answers an error; true for an error, whose
  // request may not have been read in full.
  bool serve_connection(socket_t sock);
  ConnectionState* current();
  void request_ended(bool large);
  // Returns freed heap memory to the system.
  static void trim();

  ConnectionLimits limits_;
  std::atomic<ConnectionQueue*> queue_{nullptr};  // the queue of the listen() in progress
  std::mutex registry_mu_;
  std::unordered_map<std::thread::id, ConnectionState*> registry_;  // guarded by registry_mu_
  std::atomic<int> in_flight_{0};
  std::mutex trim_mu_;
  bool trim_pending_ = false;                        // guarded by trim_mu_
  std::chrono::steady_clock::time_point last_trim_;  // guarded by trim_mu_
};

}  // namespace tandem::server
