#include "backends/gloo/span_allreduce.h"

#include <gloo/transport/unbound_buffer.h>

#include <algorithm>

namespace concord {
namespace gloo_internal {
namespace {

using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;

// The spans laid end to end: where each starts in the logical array, and their unbound buffers.
class Layout {
 public:
  Layout(gloo::Context& context, const std::vector<AllreduceSpan>& spans, size_t element)
      : spans_(spans), element_(element) {
    starts_.reserve(spans.size() + 1);
    size_t at = 0;
    for (const AllreduceSpan& s : spans) {
      starts_.push_back(at);
      at += s.count;
      buffers_.push_back(s.count == 0 ? nullptr
                                      : context.createUnboundBuffer(s.data, s.count * element));
    }
    starts_.push_back(at);
  }

  size_t total() const { return starts_.back(); }

  std::vector<gloo::transport::UnboundBuffer*> buffers() const {
    std::vector<gloo::transport::UnboundBuffer*> all;
    for (const auto& b : buffers_) {
      if (b) all.push_back(b.get());
    }
    return all;
  }

  // Calls fn(buffer, byte offset in the span, first logical element, count) for every piece of
  // [begin, end), in order.
  template <typename Fn>
  void ForEachPiece(size_t begin, size_t end, Fn fn) const {
    if (begin >= end) return;
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) -
                                   starts_.begin()) -
               1;
    for (size_t at = begin; at < end; ++i) {
      if (spans_[i].count == 0) continue;
      const size_t stop = std::min(end, starts_[i + 1]);
      fn(*buffers_[i], (at - starts_[i]) * element_, at, stop - at);
      at = stop;
    }
  }

  uint8_t* Address(size_t logical) const {
    const size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), logical) -
                                         starts_.begin()) -
                     1;
    return static_cast<uint8_t*>(spans_[i].data) + (logical - starts_[i]) * element_;
  }

 private:
  const std::vector<AllreduceSpan>& spans_;
  const size_t element_;
  std::vector<size_t> starts_;  // starts_[i]: first element of span i; last: the total
  std::vector<Buffer> buffers_;
};

void Await(bool completed, const char* what) {
  ThrowIfAborted(completed, "span allreduce", what);
}

// ForEachPiece over [begin, end) cut into segments of `segment` elements from `begin`.
template <typename Fn>
void ForEachSegmentPiece(const Layout& layout, size_t begin, size_t end, size_t segment, Fn fn) {
  for (size_t at = begin; at < end; at += segment) {
    layout.ForEachPiece(at, std::min(end, at + segment), fn);
  }
}

// Waits for one send per piece of [begin, end) cut into segments (as they were posted).
void AwaitSends(const Layout& layout, size_t begin, size_t end, size_t segment,
                std::chrono::milliseconds timeout) {
  ForEachSegmentPiece(layout, begin, end, segment,
                      [&](gloo::transport::UnboundBuffer& b, size_t, size_t, size_t) {
                        Await(b.waitSend(timeout), "send");
                      });
}

}  // namespace

void SpanRingAllreduce(const std::shared_ptr<gloo::Context>& context,
                       const std::vector<AllreduceSpan>& spans, DType dtype, ReduceOp op,
                       uint64_t slot, size_t segment_bytes, std::vector<uint8_t>* scratch,
                       InFlight* in_flight) {
  const int size = context->size;
  const int rank = context->rank;
  const size_t element = DTypeSize(dtype);
  const Layout layout(*context, spans, element);
  const size_t n = layout.total();
  if (n == 0 || size == 1) return;
  const ReduceOp reduce = WireReduceOp(op);
  const auto timeout = context->getTimeout();
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  auto block_begin = [&](int b) { return n / size * b + std::min<size_t>(n % size, b); };
  auto block_end = [&](int b) { return block_begin(b + 1); };
  auto mod = [&](int b) { return ((b % size) + size) % size; };

  const size_t segment = std::max<size_t>(1, segment_bytes / element);  // elements
  if (scratch->size() < 2 * segment * element) scratch->resize(2 * segment * element);
  Buffer tmp = context->createUnboundBuffer(scratch->data(), 2 * segment * element);
  std::vector<gloo::transport::UnboundBuffer*> registered = layout.buffers();
  registered.push_back(tmp.get());
  InFlight::Scope scope(in_flight, std::move(registered));

  // Reduce-scatter.
  for (int step = 0; step < size - 1; ++step) {
    const int send_block = mod(rank - step), recv_block = mod(rank - step - 1);
    const size_t send_begin = block_begin(send_block), send_end = block_end(send_block);
    const size_t recv_begin = block_begin(recv_block), recv_end = block_end(recv_block);
    const size_t segments = (recv_end - recv_begin + segment - 1) / segment;
    // Segment k of the received block lands in half k % 2 of the scratch area.
    auto post_recv = [&](size_t k) {
      const size_t begin = recv_begin + k * segment;
      const size_t end = std::min(recv_end, begin + segment);
      const size_t half = (k % 2) * segment * element;
      layout.ForEachPiece(begin, end,
                          [&](gloo::transport::UnboundBuffer&, size_t, size_t at, size_t count) {
                            tmp->recv(left, slot, half + (at - begin) * element, count * element);
                          });
    };
    for (size_t k = 0; k < std::min<size_t>(2, segments); ++k) post_recv(k);
    // The send block is not written during this step: post all of it, cut into the pieces the
    // receiver expects (Gloo sends a piece once the receiver has posted its receive).
    ForEachSegmentPiece(layout, send_begin, send_end, segment,
                        [&](gloo::transport::UnboundBuffer& b, size_t offset, size_t,
                            size_t count) { b.send(right, slot, offset, count * element); });
    for (size_t k = 0; k < segments; ++k) {
      const size_t begin = recv_begin + k * segment;
      const size_t end = std::min(recv_end, begin + segment);
      const uint8_t* half = scratch->data() + (k % 2) * segment * element;
      layout.ForEachPiece(
          begin, end, [&](gloo::transport::UnboundBuffer&, size_t, size_t at, size_t count) {
            Await(tmp->waitRecv(timeout), "receive");
            uint8_t* mine = layout.Address(at);
            ReduceElements(mine, mine, half + (at - begin) * element, count, dtype, reduce);
          });
      if (k + 2 < segments) post_recv(k + 2);
    }
    AwaitSends(layout, send_begin, send_end, segment, timeout);
  }

  // Allgather: completed blocks travel around the ring, received in place.
  for (int step = 0; step < size - 1; ++step) {
    const int send_block = mod(rank + 1 - step), recv_block = mod(rank - step);
    const size_t recv_begin = block_begin(recv_block), recv_end = block_end(recv_block);
    layout.ForEachPiece(recv_begin, recv_end,
                        [&](gloo::transport::UnboundBuffer& b, size_t offset, size_t,
                            size_t count) { b.recv(left, slot, offset, count * element); });
    layout.ForEachPiece(block_begin(send_block), block_end(send_block),
                        [&](gloo::transport::UnboundBuffer& b, size_t offset, size_t,
                            size_t count) { b.send(right, slot, offset, count * element); });
    layout.ForEachPiece(recv_begin, recv_end,
                        [&](gloo::transport::UnboundBuffer& b, size_t, size_t, size_t) {
                          Await(b.waitRecv(timeout), "receive");
                        });
    // Allgather pieces are not cut into segments: one "segment" as long as everything.
    AwaitSends(layout, block_begin(send_block), block_end(send_block), n, timeout);
  }
}

}  // namespace gloo_internal
}  // namespace concord
