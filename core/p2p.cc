#include "core/p2p.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <utility>

#include "core/request.h"

namespace concord {
namespace {

static_assert(kP2pMaxDims == kMaxDims, "the transports carry CONCORD_MAX_DIMS dimensions");

std::string Describe(DType dtype, const std::vector<int64_t>& shape) {
  std::string s = std::string(DTypeName(dtype)) + " [";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string What(const P2pEntry& e) {
  return std::string(e.send ? "send to" : "recv from") + " rank " + std::to_string(e.peer) +
         " with tag " + std::to_string(e.tag);
}

// What a recv learns when its message's header arrives, shared with its completion.
struct RecvResult {
  Status refusal;  // why the message was dropped (another dtype or shape, no memory for it)
  ResultBuffers::Block staging;  // a CUDA tensor's message, in host memory
};

}  // namespace

PointToPoint::PointToPoint(int rank, int size, std::chrono::milliseconds timeout,
                           std::chrono::microseconds drive_busy_poll,
                           std::unique_ptr<P2pTransport> transport,
                           std::shared_ptr<ResultBuffers> result_buffers, Status unavailable,
                           DeviceBackend* device, Status device_unavailable)
    : rank_(rank),
      size_(size),
      timeout_(timeout),
      unavailable_(std::move(unavailable)),
      transport_(std::move(transport)),
      result_buffers_(std::move(result_buffers)),
      device_(device),
      device_unavailable_(std::move(device_unavailable)),
      gate_(std::make_shared<WaitGate>(
          [this, drive_busy_poll](RequestState& state, Deadline deadline) {
            // The gate is closed (Close()) before this object goes. Oversubscribed (no busy
            // poll), a waiter that yields between polls was slower than one asleep while the
            // progress thread polls (MPI, 2 ranks, 1 KiB: 22-29 us against 10-17 us).
            if (transport_ && drive_busy_poll.count() > 0) {
              transport_->Drive([&state] { return state.done(); }, deadline, drive_busy_poll);
            }
          })) {}

PointToPoint::~PointToPoint() {
  Close(Status(Code::kNotInitialized, "the communicator was finalized"));
}

namespace {

// The PointToPoint whose completion this thread is running: a callback run inline by Submit on
// the caller's thread is as much the communicator's as one on the progress thread.
thread_local const PointToPoint* t_completing = nullptr;

void CompleteFor(const PointToPoint* self, RequestState& state, const Status& status) {
  const PointToPoint* outer = t_completing;
  t_completing = self;
  state.Complete(status);
  t_completing = outer;
}

}  // namespace

bool PointToPoint::OnOwnThread() const {
  return t_completing == this || (transport_ && transport_->OnProgressThread());
}

Status PointToPoint::Check(const P2pEntry& e) const {
  auto what = [&e] { return What(e) + ": "; };  // built only for an error: this runs per message
  if (e.peer < 0 || e.peer >= size_) {
    return InvalidArgument(what() + "the peer is not a rank of this communicator (size " +
                           std::to_string(size_) + ")");
  }
  if (e.peer == rank_) return InvalidArgument(what() + "the peer is this rank");
  if (e.tag < 0) return InvalidArgument(what() + "the tag is negative");
  if (!e.state) return InvalidArgument(what() + "no request state");
  if (!e.send && !e.expect) {
    if (e.ready_stream != nullptr || e.ready_event != nullptr) {
      return InvalidArgument(what() + "a ready stream or event was given without a tensor");
    }
    return Status::Ok();
  }
  if (e.shape.size() > kMaxDims) {
    return InvalidArgument(what() + "more than " + std::to_string(kMaxDims) + " dimensions");
  }
  int64_t n = 1;
  for (int64_t d : e.shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxTensorSize) {
      return InvalidArgument(what() + "a dimension is negative or the shape is too large");
    }
  }
  if (n > 0 && e.data == nullptr) {
    return InvalidArgument(what() + "data is NULL but the tensor has " + std::to_string(n) +
                           " elements");
  }
  if (e.device < 0) {
    if (e.ready_stream != nullptr || e.ready_event != nullptr) {
      return InvalidArgument(what() + "a ready stream or event was given for a CPU tensor");
    }
    return Status::Ok();
  }
  Status usable = device_ != nullptr ? device_->CheckDevice(e.device) : device_unavailable_;
  if (usable.ok()) return usable;
  return Status(usable.code(),
                what() + "CUDA device " + std::to_string(e.device) + ": " + usable.message());
}

Status PointToPoint::Submit(P2pEntry e) {
  CONCORD_RETURN_IF_ERROR(Check(e));
  {
    MutexLock lock(mu_);
    if (!closed_.ok()) return closed_;
  }
  if (!transport_) return unavailable_.WithContext(What(e));
  if (e.tag > transport_->max_tag()) {
    return InvalidArgument(What(e) + ": the tag is above this backend's largest, " +
                           std::to_string(transport_->max_tag()));
  }
  const Deadline deadline = Deadline::After(timeout_);
  std::shared_ptr<RequestState> state = std::move(e.state);
  if (e.send) {
    P2pMeta meta;
    meta.dtype = e.dtype;
    meta.shape = e.shape;
    meta.bytes = 1;
    for (int64_t d : e.shape) meta.bytes *= static_cast<uint64_t>(d);
    meta.bytes *= DTypeSize(e.dtype);
    const void* payload = e.data;
    // A CUDA tensor's bytes, in a pooled block (kept for reuse) until the send completes.
    std::shared_ptr<ResultBuffers::Block> staging;
    if (e.device >= 0 && meta.bytes > 0) {
      StatusOr<std::shared_ptr<void>> ready = device_->CaptureReady(e.ready_stream, e.ready_event);
      if (!ready.ok()) return ready.status().WithContext(What(e) + ": capturing its ready stream");
      staging = std::make_shared<ResultBuffers::Block>(result_buffers_->Take(meta.bytes));
      Status copied =
          device_->CopyLocal(staging->data(), e.data, meta.bytes, nullptr, ready->get());
      if (!copied.ok()) return copied.WithContext(What(e) + ": copying the CUDA tensor out");
      payload = staging->data();
    }
    state->AddWireBytes(meta.bytes);
    transport_->Send(e.peer, e.tag, meta, payload, deadline,
                     [this, state, staging, peer = e.peer, tag = e.tag](const Status& s) {
                       Complete(state, s, true, peer, tag);
                     });
    return Status::Ok();
  }
  auto result = std::make_shared<RecvResult>();
  RequestState* out = state.get();
  const int peer = e.peer;
  const int64_t tag = e.tag;
  // A CUDA recv's copy in: to its tensor, after its producers as they are now (the copy runs
  // when the message has come, on another thread).
  std::function<Status()> copy_in;
  if (e.device >= 0) {
    StatusOr<std::shared_ptr<void>> ready = device_->CaptureReady(e.ready_stream, e.ready_event);
    if (!ready.ok()) return ready.status().WithContext(What(e) + ": capturing its ready stream");
    copy_in = [device = device_, result, out, ready = std::move(*ready)] {
      const RequestState::Output& o = out->output();
      if (o.bytes == 0) return Status::Ok();
      return device->CopyLocal(o.data, result->staging.data(), o.bytes, nullptr, ready.get())
          .WithContext("copying the message to the CUDA tensor");
    };
  }
  auto place = [e = std::move(e), result, out,
                buffers = result_buffers_](const P2pMeta& meta) -> void* {
    RequestState::Output& o = out->output();
    if (e.expect && (meta.dtype != e.dtype || meta.shape != e.shape)) {
      result->refusal =
          Status(Code::kMismatch, What(e) + ": rank " + std::to_string(e.peer) + " sent " +
                                      Describe(meta.dtype, meta.shape) + ", this recv expects " +
                                      Describe(e.dtype, e.shape) + " (the message was dropped)");
      return nullptr;
    }
    // Host memory for the message (a CUDA tensor's staging, or the request's own), taken before
    // anything is set: a message too large for this rank's memory is refused, not a crash.
    ResultBuffers::Block block;
    if ((e.device >= 0 || !e.expect) && meta.bytes > 0) {
      try {
        block = buffers->Take(meta.bytes);
      } catch (const std::bad_alloc&) {
        result->refusal = Status(Code::kSystemError, What(e) + ": no memory for the " +
                                                         std::to_string(meta.bytes) +
                                                         "-byte message (the message was dropped)");
        return nullptr;
      }
    }
    o.shape = meta.shape;
    o.dtype = meta.dtype;
    o.bytes = meta.bytes;
    o.first_dim = meta.shape.empty() ? 1 : meta.shape[0];
    if (e.device >= 0) {  // lands in host memory; the completion copies it to the device
      o.data = e.data;
      if (meta.bytes == 0) return o.data;
      result->staging = std::move(block);
      return result->staging.data();
    }
    if (e.expect) {
      o.data = e.data;
    } else {
      o.owned = std::move(block);
      o.data = o.owned.data();
    }
    return o.data;
  };
  transport_->Recv(peer, tag, deadline, std::move(place),
                   [this, state, result, peer, tag, copy_in = std::move(copy_in)](const Status& s) {
                     Status r = s.ok() ? result->refusal : s;
                     if (r.ok() && copy_in) r = copy_in();
                     result->staging = ResultBuffers::Block();  // back to the pool
                     Complete(state, r, false, peer, tag);
                   });
  return Status::Ok();
}

void PointToPoint::Complete(const std::shared_ptr<RequestState>& state, const Status& s, bool send,
                            int peer, int64_t tag) {
  // A peer that said it finalized is the cause itself.
  if (s.code() == Code::kPeerFailure && size_ > 2 && !transport_->PeerFinalized(peer)) {
    const std::string what = std::string(send ? "send to" : "recv from") + " rank " +
                             std::to_string(peer) + " with tag " + std::to_string(tag);
    std::optional<Status> cause;
    {
      MutexLock lock(mu_);
      if (closed_.ok() && !hold_timer_.joinable()) {
        try {
          hold_timer_ = std::thread([this] { ReleaseHeldInTime(); });
        } catch (const std::system_error&) {
          // No thread to keep the hold's time: the failure completes as it is, now.
        }
      }
      if (closed_.ok() && hold_timer_.joinable()) {
        held_.push_back(HeldFailure{state, s, what, peer, Deadline::After(timeout_ + kHoldExtra)});
        held_changed_.NotifyAll();
        return;
      }
      // Fail() is closing the transport, whose progress thread read this failure meanwhile
      // (the peer left because the job failed, before its cause reached this rank's engine).
      // What the transport's Close() fails with the cause itself needs no explaining.
      if (cause_ && s.message().find(cause_->message()) == std::string::npos) cause = cause_;
    }
    if (cause) {
      CompleteFor(this, *state, BecauseOf(*cause, what, s));
      return;
    }
  }
  CompleteFor(this, *state, s);
}

Status PointToPoint::BecauseOf(const Status& cause, const std::string& what,
                               const Status& failure) const {
  return Status(cause.code(), cause.message() + " (rank " + std::to_string(rank_) + "'s " + what +
                                  " failed meanwhile: " + failure.message() + ")");
}

void PointToPoint::ReleaseHeldInTime() {
  const std::string waited =
      FormatSeconds(std::chrono::duration<double>(timeout_ + kHoldExtra).count());
  for (;;) {
    std::vector<HeldFailure> due;
    {
      MutexLock lock(mu_);
      if (!closed_.ok()) return;  // Close() completes what is held
      // Due: past its time, or its peer said meanwhile that it finalized (a failure read from it
      // before its goodbye: that is the cause).
      auto waiting = [this](const HeldFailure& h) {
        return !h.until.passed() && !transport_->PeerFinalized(h.peer);
      };
      if (std::all_of(held_.begin(), held_.end(), waiting)) {
        Deadline next = held_.empty() ? Deadline::Infinite() : Deadline::After(kFinalizedCheck);
        for (const HeldFailure& h : held_) next = next.Earlier(h.until);
        held_changed_.WaitUntil(mu_, next);
        continue;
      }
      auto split = std::stable_partition(held_.begin(), held_.end(), waiting);
      due.assign(std::make_move_iterator(split), std::make_move_iterator(held_.end()));
      held_.erase(split, held_.end());
    }
    for (HeldFailure& h : due) {
      const std::string why =
          transport_->PeerFinalized(h.peer)
              ? " (rank " + std::to_string(h.peer) + " finalized its communicator meanwhile)"
              : " (no rank was reported failed within " + waited + " of it)";
      CompleteFor(this, *h.state, Status(h.failure.code(), h.failure.message() + why));
    }
  }
}

void PointToPoint::Close(const Status& status) {
  CloseWith(status, nullptr);
}

void PointToPoint::Finish(const Status& status) {
  if (transport_ && transport_->Finish(status)) Close(status);
}

void PointToPoint::Fail(const Status& cause) {
  CloseWith(cause, &cause);
}

void PointToPoint::CloseWith(const Status& status, const Status* cause) {
  std::vector<HeldFailure> held;
  std::thread timer;
  {
    MutexLock lock(mu_);
    if (!closed_.ok()) return;
    closed_ = status;
    if (cause != nullptr) cause_ = *cause;
    held.swap(held_);
    timer = std::move(hold_timer_);
    held_changed_.NotifyAll();
  }
  if (timer.joinable()) timer.join();
  if (transport_) transport_->Close(status);
  for (HeldFailure& h : held) {
    CompleteFor(this, *h.state,
                cause == nullptr ? h.failure : BecauseOf(*cause, h.what, h.failure));
  }
  // After the transport: a waiter inside Drive() returns once it is closed.
  gate_->Close();
}

}  // namespace concord
