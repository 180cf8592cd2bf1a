#include "backends/gloo/in_flight.h"

#include <gloo/common/error.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace concord {
namespace gloo_internal {

InFlight::Scope::Scope(InFlight* in_flight, std::vector<gloo::transport::UnboundBuffer*> buffers)
    : in_flight_(in_flight), buffers_(std::move(buffers)) {
  if (in_flight_ == nullptr) return;
  std::lock_guard<std::mutex> lock(in_flight_->mu_);
  if (in_flight_->interrupted_) {
    GLOO_THROW_IO_EXCEPTION("interrupted: a peer failed (reported by the control plane)");
  }
  in_flight_->buffers_.insert(in_flight_->buffers_.end(), buffers_.begin(), buffers_.end());
}

InFlight::Scope::~Scope() {
  if (in_flight_ == nullptr) return;
  std::lock_guard<std::mutex> lock(in_flight_->mu_);
  auto& all = in_flight_->buffers_;
  for (auto* b : buffers_) all.erase(std::find(all.begin(), all.end(), b));
}

void InFlight::Interrupt() {
  std::lock_guard<std::mutex> lock(mu_);
  interrupted_ = true;
  // Each abort ends one wait, the current or the next: the collective throws at the first.
  for (auto* b : buffers_) {
    b->abortWaitSend();
    b->abortWaitRecv();
  }
}

void ThrowIfAborted(bool completed, const char* collective, const char* what) {
  if (!completed) {
    GLOO_THROW_IO_EXCEPTION(std::string(collective) + ": " + what +
                            " aborted: a peer failed (reported by the control plane)");
  }
}

void InterruptibleAlltoallv(const std::shared_ptr<gloo::Context>& context, const void* in,
                            const std::vector<size_t>& send_bytes, void* out,
                            const std::vector<size_t>& recv_bytes, uint64_t slot,
                            InFlight* in_flight) {
  const int size = context->size;
  const int rank = context->rank;
  std::vector<size_t> in_at(size + 1, 0), out_at(size + 1, 0);
  for (int r = 0; r < size; ++r) {
    in_at[r + 1] = in_at[r] + send_bytes[r];
    out_at[r + 1] = out_at[r] + recv_bytes[r];
  }
  if (recv_bytes[rank] > 0) {
    std::memcpy(static_cast<char*>(out) + out_at[rank], static_cast<const char*>(in) + in_at[rank],
                recv_bytes[rank]);
  }
  // Gloo needs a valid pointer for an empty side.
  char empty = 0;
  auto input = context->createUnboundBuffer(
      in_at[size] > 0 ? const_cast<void*>(in) : static_cast<void*>(&empty), in_at[size]);
  auto output = context->createUnboundBuffer(out_at[size] > 0 ? out : &empty, out_at[size]);
  InFlight::Scope scope(in_flight, {input.get(), output.get()});
  // As gloo::alltoallv: at step i send to rank + i and receive from rank - i.
  int sends = 0, recvs = 0;
  for (int i = 1; i < size; ++i) {
    const int to = (rank + i) % size, from = (rank + size - i) % size;
    if (send_bytes[to] > 0) {
      input->send(to, slot, in_at[to], send_bytes[to]);
      ++sends;
    }
    if (recv_bytes[from] > 0) {
      output->recv(from, slot, out_at[from], recv_bytes[from]);
      ++recvs;
    }
  }
  const auto timeout = context->getTimeout();
  for (int i = 0; i < recvs; ++i) ThrowIfAborted(output->waitRecv(timeout), "alltoallv", "receive");
  for (int i = 0; i < sends; ++i) ThrowIfAborted(input->waitSend(timeout), "alltoallv", "send");
}

}  // namespace gloo_internal
}  // namespace concord
