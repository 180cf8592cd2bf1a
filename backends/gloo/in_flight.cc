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

void InterruptibleAllgatherv(const std::shared_ptr<gloo::Context>& context, const void* in,
                             void* out, const std::vector<size_t>& bytes, uint64_t slot,
                             InFlight* in_flight) {
  const int size = context->size;
  const int rank = context->rank;
  std::vector<size_t> at(size + 1, 0);
  for (int r = 0; r < size; ++r) at[r + 1] = at[r] + bytes[r];
  auto* dst = static_cast<uint8_t*>(out);
  if (bytes[rank] > 0) std::memmove(dst + at[rank], in, bytes[rank]);
  if (size == 1 || at[size] == 0) return;
  auto output = context->createUnboundBuffer(out, at[size]);
  InFlight::Scope scope(in_flight, {output.get()});
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  const auto timeout = context->getTimeout();
  bool sending = false, receiving = false;  // the previous step's messages, when not empty
  auto await = [&] {
    if (sending) ThrowIfAborted(output->waitSend(timeout), "allgatherv", "send");
    if (receiving) ThrowIfAborted(output->waitRecv(timeout), "allgatherv", "receive");
  };
  for (int step = 0; step < size - 1; ++step) {
    // The block received in one step is sent on in the next.
    await();
    const int send_block = (rank - step + size) % size;
    const int recv_block = (rank - step - 1 + size) % size;
    sending = bytes[send_block] > 0;
    receiving = bytes[recv_block] > 0;
    if (sending) output->send(right, slot, at[send_block], bytes[send_block]);
    if (receiving) output->recv(left, slot, at[recv_block], bytes[recv_block]);
  }
  await();
}

void InterruptibleBroadcast(const std::shared_ptr<gloo::Context>& context, void* data, size_t bytes,
                            int root, uint64_t slot, InFlight* in_flight) {
  const int size = context->size;
  if (size == 1 || bytes == 0) return;
  auto buffer = context->createUnboundBuffer(data, bytes);
  InFlight::Scope scope(in_flight, {buffer.get()});
  const auto timeout = context->getTimeout();
  // Ranks relative to the root (virtual rank 0). In round i the virtual ranks below 2^i have the
  // data; each sends it to the one 2^i above it (if there is one). A rank receives once, in the
  // round of its highest set bit, and sends in every later round.
  const int vrank = (context->rank - root + size) % size;
  int sends = 0;
  for (int step = 1; step < size; step <<= 1) {
    if (vrank < step) {
      if (vrank + step < size) {
        buffer->send((vrank + step + root) % size, slot);
        ++sends;
      }
    } else if (vrank < 2 * step) {
      buffer->recv((vrank - step + root) % size, slot);
      ThrowIfAborted(buffer->waitRecv(timeout), "broadcast", "receive");
    }
  }
  for (int i = 0; i < sends; ++i) ThrowIfAborted(buffer->waitSend(timeout), "broadcast", "send");
}

void InterruptibleBarrier(const std::shared_ptr<gloo::Context>& context, uint64_t slot,
                          InFlight* in_flight) {
  const int size = context->size;
  if (size == 1) return;
  const int rank = context->rank;
  // A byte each way per round (the contents are never read): one buffer for the sends, one for
  // the receives, so that a round waits for its own receive.
  char token[2] = {0, 0};
  auto out = context->createUnboundBuffer(&token[0], 1);
  auto in = context->createUnboundBuffer(&token[1], 1);
  InFlight::Scope scope(in_flight, {out.get(), in.get()});
  const auto timeout = context->getTimeout();
  // Dissemination: in round k every rank tells rank + 2^k it arrived and hears from rank - 2^k;
  // after ceil(log2(size)) rounds each has heard, through others, from every rank.
  int sends = 0;
  for (int step = 1; step < size; step <<= 1) {
    out->send((rank + step) % size, slot);
    ++sends;
    in->recv((rank - step + size) % size, slot);
    ThrowIfAborted(in->waitRecv(timeout), "barrier", "receive");
  }
  for (int i = 0; i < sends; ++i) ThrowIfAborted(out->waitSend(timeout), "barrier", "send");
}

}  // namespace gloo_internal
}  // namespace concord
