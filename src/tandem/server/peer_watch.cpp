#include "tandem/server/peer_watch.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <string_view>

namespace tandem::server {

PeerWatch::State PeerWatch::check() {
  if (state_ == State::kGone) return state_;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return state_;  // interrupted: the next check decides
  // A reset (or our own shutdown) hangs the socket up; a half-closed peer only makes it readable.
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return state_ = State::kGone;
  if (state_ == State::kHalfClosed || !(p.revents & (POLLIN | POLLRDHUP))) return state_;
  char c = 0;
  const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return state_;  // bytes of a next request: the peer is still there
  if (n < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? state_ : state_ = State::kGone;
  static constexpr std::string_view kProbe = "HTTP/1.1 100 Continue\r\n\r\n";
  if (send(fd_, kProbe.data(), kProbe.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(kProbe.size()))
    return state_ = State::kGone;
  return state_ = State::kHalfClosed;
}

}  // namespace tandem::server
