// concordrun's own stdout and stderr, written without ever blocking its supervision loop: what a
// destination does not take at once is queued, and written when poll() says it has room.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace concord {

// One of concordrun's output streams (STDOUT_FILENO or STDERR_FILENO). Write() and Flush() never
// wait for the reader: a pipe or a terminal is written through a description of its own opened
// with O_NONBLOCK (/proc/self/fd/N; the O_NONBLOCK flag is never set on the description that fd N
// shares with the parent shell), a socket with MSG_DONTWAIT; a regular file or another device,
// which does not wait on a reader, is written as it is. When /proc cannot reopen a pipe or
// terminal, it is written PIPE_BUF bytes at a time when poll() says it has room, which a pipe
// always takes without blocking (a terminal almost always does). Output errors (a closed reader, a
// hung-up terminal) make the sink drop what it has and all that follows: supervising the ranks
// matters more than their output. Not thread-safe; one per stream, for the process's lifetime.
class OutputSink {
 public:
  // The queue's size above which full() asks the caller to stop feeding it (backpressure).
  static constexpr size_t kQueueCap = 4 << 20;

  explicit OutputSink(int fd);
  ~OutputSink();
  OutputSink(const OutputSink&) = delete;
  OutputSink& operator=(const OutputSink&) = delete;

  // Queues `data` behind what is queued and writes what the destination takes now.
  void Write(std::string_view data);
  // Writes what is queued as far as the destination takes it now.
  void Flush();
  // Drops what is queued (and anything written later); returns how many bytes were dropped.
  size_t Abandon();

  // The descriptor to poll for POLLOUT while pending().
  int fd() const { return fd_; }
  // Something is queued for a destination that still takes output.
  bool pending() const { return !broken_ && sent_ < queue_.size(); }
  // More than kQueueCap bytes are queued: the caller should stop reading what feeds this sink
  // until it is not full() any more (nothing is dropped; the caller may still Write()).
  bool full() const { return pending() && queue_.size() - sent_ > kQueueCap; }

 private:
  enum class Mode {
    kNonBlocking,  // an O_NONBLOCK description: write() until EAGAIN
    kSocket,       // send() with MSG_DONTWAIT
    kFile,         // a regular file or a device that takes writes as they come
    kPolled,       // a pipe or terminal that could not be reopened: PIPE_BUF bytes per POLLOUT
  };

  // Writes up to `n` bytes from the queue's head; returns what the destination took (0 when it has
  // no room now, or on an error, which makes the sink broken).
  size_t WriteSome(size_t n);

  int fd_ = -1;
  int reopened_ = -1;  // the O_NONBLOCK description fd_ is, closed with the sink; -1 if none
  Mode mode_ = Mode::kFile;
  std::string queue_;  // bytes [sent_, size) are still to be written
  size_t sent_ = 0;
  bool broken_ = false;
};

}  // namespace concord
