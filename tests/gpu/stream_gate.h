// A closed gate on a CUDA stream, for tests: what is queued on the stream after Close() waits until
// Open() (a host function on the stream blocks until then), as the work queued behind a collective
// stuck on a peer that never comes waits. Plain C++ (the CUDA calls are in stream_gate.cu).
// Thread-safe; Open() may be called more than once; the destructor opens the gate and waits until
// the stream has left it.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>

#include "base/status.h"

namespace concord {
namespace cuda {

class StreamGate {
 public:
  // `stream`: a cudaStream_t of `device` (nullptr: its legacy default stream). Makes `device` the
  // calling thread's current device.
  static StatusOr<std::unique_ptr<StreamGate>> Close(int device, void* stream);
  ~StreamGate();
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  void Open();

 private:
  StreamGate(int device, void* stream) : device_(device), stream_(stream) {}
  static void Hold(void* gate);  // the host function on the stream

  const int device_;
  void* const stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace cuda
}  // namespace concord
