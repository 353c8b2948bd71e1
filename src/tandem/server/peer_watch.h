// Watches the client of one HTTP request while its answer is generated, below the HTTP library.
//
// Two needs meet here. A client that closes its connection must free its sequence (the scheduler cancels
// within an iteration), even when the request is not streamed and nothing is written until the end. And a
// client that only half-closed, sending its request and then shutdown(SHUT_WR) as `nc -N` and many scripted
// clients do, must still get its answer.
//
// Reading EOF alone cannot tell the two apart: both send FIN. Once EOF is seen the watch therefore probes
// with a write, an interim "HTTP/1.1 100 Continue" response, which every HTTP/1.1 client must parse before
// the final one (RFC 9110, 15.2). A half-closed peer reads it; a closed one answers the segment with a
// reset, after which poll() reports the socket hung up. Each check costs one poll() and never blocks; a
// reset is seen by the first check one round trip after the probe.
//
// cpp-httplib 0.11 hands handlers no socket, and its writes refuse a peer that has sent EOF (they peek and
// treat EOF as a closed connection), so the half-closed client's final response is written here too.
// Linux only: the socket is found among /proc/self/fd by its addresses.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tandem::server {

class PeerWatch {
 public:
  enum class State {
    kOpen,        // nothing read from the peer since its request (or more bytes that are not EOF)
    kHalfClosed,  // EOF, and the probe was accepted: the peer still reads
    kGone,        // reset, hung up, or the probe failed
  };

  // The watch of the accepted TCP connection with these addresses (as httplib::Request reports them), or
  // nothing when no open socket of this process has them. TCP allows one live connection per address pair,
  // so the match is the request's own connection; it stays open while the request's handler runs.
  static std::optional<PeerWatch> find(const std::string& local_addr, int local_port,
                                       const std::string& remote_addr, int remote_port);

  // Looks at the connection without blocking and without consuming anything; probes once on EOF.
  State check();
  State state() const { return state_; }

  // Writes `bytes` (a whole response) to a half-closed peer, waiting up to timeout_ms for room in the
  // socket's buffer; false when the peer went away meanwhile or the time ran out.
  bool send_all(std::string_view bytes, int timeout_ms);

 private:
  explicit PeerWatch(int fd) : fd_(fd) {}
  int fd_;  // borrowed: the HTTP library owns and closes it
  State state_ = State::kOpen;
};

}  // namespace tandem::server
