#include "backends/gloo/ring_reduce_scatter.h"

#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>

namespace concord {
namespace gloo_internal {
namespace {

void Await(bool completed, const char* what) {
  ThrowIfAborted(completed, "ring reduce-scatter", what);
}

}  // namespace

void RingReduceScatter(const std::shared_ptr<gloo::Context>& context, const void* in, void* out,
                       const std::vector<size_t>& counts, DType dtype, ReduceOp op, uint64_t slot,
                       size_t segment_bytes, std::vector<uint8_t>* scratch, InFlight* in_flight) {
  const int size = context->size;
  const int rank = context->rank;
  const size_t element = DTypeSize(dtype);
  std::vector<size_t> begin(size + 1, 0);  // first element of each block; last: the total
  for (int b = 0; b < size; ++b) begin[b + 1] = begin[b] + counts[b];
  if (size == 1) {
    if (counts[0] > 0) std::memcpy(out, in, counts[0] * element);
    return;
  }
  if (begin[size] == 0) return;
  const ReduceOp reduce = WireReduceOp(op);
  const auto timeout = context->getTimeout();
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  auto mod = [size](int b) { return ((b % size) + size) % size; };
  const size_t largest = *std::max_element(counts.begin(), counts.end());
  const size_t segment = std::max<size_t>(1, segment_bytes / element);  // elements

  // Scratch: two partial sums (one sent while the next is made), then two receive segments.
  const size_t partial_bytes = largest * element;
  const size_t need = 2 * partial_bytes + 2 * segment * element;
  if (scratch->size() < need) scratch->resize(need);
  uint8_t* const base = scratch->data();
  uint8_t* const partial[2] = {base, base + partial_bytes};
  uint8_t* const tmp = base + 2 * partial_bytes;
  auto input = context->createUnboundBuffer(const_cast<void*>(in), begin[size] * element);
  auto partials = context->createUnboundBuffer(base, 2 * partial_bytes);
  auto received = context->createUnboundBuffer(tmp, 2 * segment * element);
  InFlight::Scope scope(in_flight, {input.get(), partials.get(), received.get()});
  const auto* src = static_cast<const uint8_t*>(in);

  for (int step = 0; step < size - 1; ++step) {
    const int send_block = mod(rank - 1 - step), recv_block = mod(rank - 2 - step);
    const size_t send_count = counts[send_block], recv_count = counts[recv_block];
    const size_t segments = (recv_count + segment - 1) / segment;
    auto post_recv = [&](size_t k) {
      const size_t n = std::min(segment, recv_count - k * segment);
      received->recv(left, slot, (k % 2) * segment * element, n * element);
    };
    // The block to send is not written during this step: post all of it, cut into the segments
    // the receiver expects (Gloo sends a piece once the receiver has posted its receive).
    gloo::transport::UnboundBuffer& from = step == 0 ? *input : *partials;
    const size_t from_offset =
        step == 0 ? begin[send_block] * element : ((step - 1) % 2) * partial_bytes;
    for (size_t at = 0; at < send_count; at += segment) {
      const size_t n = std::min(segment, send_count - at);
      from.send(right, slot, from_offset + at * element, n * element);
    }
    for (size_t k = 0; k < std::min<size_t>(2, segments); ++k) post_recv(k);
    uint8_t* const into = step == size - 2 ? static_cast<uint8_t*>(out) : partial[step % 2];
    const uint8_t* const own = src + begin[recv_block] * element;
    for (size_t k = 0; k < segments; ++k) {
      const size_t at = k * segment, n = std::min(segment, recv_count - at);
      Await(received->waitRecv(timeout), "receive");
      ReduceElements(into + at * element, own + at * element, tmp + (k % 2) * segment * element, n,
                     dtype, reduce);
      if (k + 2 < segments) post_recv(k + 2);
    }
    for (size_t at = 0; at < send_count; at += segment) Await(from.waitSend(timeout), "send");
  }
}

}  // namespace gloo_internal
}  // namespace concord
