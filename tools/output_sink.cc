#include "tools/output_sink.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace concord {

OutputSink::OutputSink(int fd) : fd_(fd) {
  struct stat st;
  const int flags = ::fcntl(fd, F_GETFL);
  if (::fstat(fd, &st) != 0 || flags < 0) {
    mode_ = Mode::kFile;  // closed: the first write fails and breaks the sink
  } else if (S_ISSOCK(st.st_mode)) {
    mode_ = Mode::kSocket;
  } else if ((flags & O_NONBLOCK) != 0) {
    mode_ = Mode::kNonBlocking;  // so inherited: nothing to change
  } else if (S_ISFIFO(st.st_mode) || ::isatty(fd)) {
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    reopened_ = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (reopened_ >= 0) {
      fd_ = reopened_;
      mode_ = Mode::kNonBlocking;
    } else {
      mode_ = Mode::kPolled;
    }
  } else {
    mode_ = Mode::kFile;
  }
}

OutputSink::~OutputSink() {
  if (reopened_ >= 0) ::close(reopened_);
}

void OutputSink::Write(std::string_view data) {
  if (broken_) return;
  queue_.append(data);
  Flush();
}

void OutputSink::Flush() {
  while (pending()) {
    const size_t left = queue_.size() - sent_;
    const size_t took = WriteSome(mode_ == Mode::kPolled ? std::min<size_t>(left, PIPE_BUF) : left);
    if (took == 0) break;
    sent_ += took;
  }
  // Written bytes leave the queue once they are half of it: each byte is moved O(1) times.
  if (sent_ == queue_.size()) {
    queue_.clear();
    sent_ = 0;
  } else if (sent_ > queue_.size() / 2) {
    queue_.erase(0, sent_);
    sent_ = 0;
  }
}

size_t OutputSink::Abandon() {
  const size_t dropped = pending() ? queue_.size() - sent_ : 0;
  broken_ = true;
  queue_.clear();
  queue_.shrink_to_fit();
  sent_ = 0;
  return dropped;
}

size_t OutputSink::WriteSome(size_t n) {
  if (mode_ == Mode::kPolled) {
    pollfd p{fd_, POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0) return 0;  // no room now (or an error that the write would tell)
  }
  const char* data = queue_.data() + sent_;
  for (;;) {
    const ssize_t n_written = mode_ == Mode::kSocket
                                  ? ::send(fd_, data, n, MSG_DONTWAIT | MSG_NOSIGNAL)
                                  : ::write(fd_, data, n);
    if (n_written > 0) return static_cast<size_t>(n_written);
    if (n_written < 0 && errno == EINTR) continue;
    if (n_written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    Abandon();
    return 0;
  }
}

}  // namespace concord
