#include "tandem/server/peer_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace tandem::server {
namespace {

// The numeric host and port of a socket address, as the HTTP library formats them.
bool address_is(const sockaddr_storage& a, socklen_t len, const std::string& host, int port) {
  int p = -1;
  if (a.ss_family == AF_INET)
    p = ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  else if (a.ss_family == AF_INET6)
    p = ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  if (p != port) return false;
  char text[NI_MAXHOST] = {};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, text, sizeof text, nullptr, 0,
                  NI_NUMERICHOST) != 0)
    return false;
  return host == text;
}

bool connects(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr,
              int remote_port) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      !address_is(a, len, remote_addr, remote_port))
    return false;
  len = sizeof a;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 &&
         address_is(a, len, local_addr, local_port);
}

}  // namespace

std::optional<PeerWatch> PeerWatch::find(const std::string& local_addr, int local_port,
                                         const std::string& remote_addr, int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return std::nullopt;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (connects(static_cast<int>(fd), local_addr, local_port, remote_addr, remote_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  if (found < 0) return std::nullopt;
  return PeerWatch(found);
}

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

bool PeerWatch::send_all(std::string_view bytes, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!bytes.empty()) {
    const ssize_t n = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      state_ = State::kGone;
      return false;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
            .count();
    if (left <= 0) return false;
    pollfd p{fd_, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR) return false;
  }
  return true;
}

}  // namespace tandem::server
