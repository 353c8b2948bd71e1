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
// The socket comes from the connection layer (LimitedServer::current_socket), whose writes, unlike
// cpp-httplib's own, do not take a peer's EOF for a closed connection: the half-closed client's answer goes
// out the usual way.
#pragma once

namespace tandem::server {

class PeerWatch {
 public:
  enum class State {
    kOpen,        // nothing read from the peer since its request (or more bytes that are not EOF)
    kHalfClosed,  // EOF, and the probe was accepted: the peer still reads
    kGone,        // reset, hung up, or the probe failed
  };

  // Watches the connected socket `fd`, borrowed: it must stay open while the watch is used.
  explicit PeerWatch(int fd) : fd_(fd) {}

  // Looks at the connection without blocking and without consuming anything; probes once on EOF.
  State check();
  State state() const { return state_; }

 private:
  int fd_;  // borrowed: the connection layer owns and closes it
  State state_ = State::kOpen;
};

}  // namespace tandem::server
