// The engine's device path: CUDA tensors on the device backend (DevicePlane), asynchronously.
// The stepping thread launches each device batch in plan order (the same on every rank) and goes
// on negotiating while the GPU works; the device backend's completion thread then completes the
// batch's requests (their callbacks run there). A device failure fails the engine on its next
// step, like any other error. Tensors of different devices are never fused (the fusion planner
// compares TensorRequest::device), and a barrier first drains every device collective
// (engine_execute.cc).
//
// On the timeline: each launch on the "device launches" track ("launch": the host's time in
// Launch(); args op, bytes, members), and each collective on the "device" track, named after its
// op (args backend, bytes, members), from its launch, or the previous collective's completion when
// that came later (the device runs them one after another, in launch order), to its completion as
// the completion thread saw it: the device's time on it as the host sees it, never overlapping.
#include <algorithm>
#include <cstdint>

#include "base/json.h"
#include "core/engine.h"

namespace concord {

static_assert(Timeline::kLaneTrack + Config::kMaxLanes <= Timeline::kDeviceLaunchTrack,
              "the device tracks come after every lane's");

Status Engine::CheckDevice(QueueEntry& e) const {
  TensorRequest& r = e.request;
  if (r.device == -1) {
    if (e.ready_stream != nullptr || e.ready_event != nullptr) {
      return InvalidArgument("tensor '" + r.name +
                             "': a ready stream or event was given for a CPU tensor");
    }
    return Status::Ok();
  }
  const std::string who = "tensor '" + r.name + "' on CUDA device " + std::to_string(r.device);
  // NCCL's reductions do not fold in rank order (core/ordered_reduction.h).
  const bool reduces =
      r.op == OpType::kAllreduce || r.op == OpType::kReducescatter || r.op == OpType::kReduce;
  if (reduces && config_.deterministic) {
    return Status(Code::kUnavailable, who +
                                          ": deterministic mode (CONCORD_DETERMINISTIC=1) covers "
                                          "CPU tensors only: reduce a copy in host memory");
  }
  if (!device_.backend) {
    return Status(device_.unavailable.code(), who + ": " + device_.unavailable.message());
  }
  Status usable = device_.backend->CheckDevice(r.device);
  if (!usable.ok()) return Status(usable.code(), who + ": " + usable.message());
  // The result of these cannot be owned by the request (that memory is the host's). A reduce's
  // root without an output is refused for every tensor (entry_validation.cc).
  const bool root = r.root == config_.rank;
  if (e.output == nullptr && (r.op == OpType::kAllgather || r.op == OpType::kAlltoall ||
                              (r.op == OpType::kGather && root))) {
    return InvalidArgument(who + ": " + OpTypeName(r.op) +
                           " of a device tensor needs an output buffer on the device");
  }
  // The device backend sends and receives an alltoall's blocks at once: an output that is (or
  // crosses) the input would take blocks in place of rows not yet sent. (On the host the engine
  // reads such an input from a copy.)
  const auto in_at = reinterpret_cast<uintptr_t>(e.input);
  const auto out_at = reinterpret_cast<uintptr_t>(e.output);
  if (r.op == OpType::kAlltoall && e.output != nullptr && r.NumBytes() > 0 &&
      e.output_capacity > 0 && in_at < out_at + e.output_capacity &&
      out_at < in_at + r.NumBytes()) {
    return InvalidArgument(who +
                           ": an alltoall of device tensors needs an output that does not "
                           "overlap its input");
  }
  // What the operation waits for is what the caller's stream and event hold now, on this thread.
  StatusOr<std::shared_ptr<void>> ready =
      device_.backend->CaptureReady(e.ready_stream, e.ready_event);
  if (!ready.ok()) {
    return Status(ready.status().code(),
                  who + ": capturing its ready stream or event: " + ready.status().message());
  }
  e.ready = std::move(*ready);
  e.ready_stream = nullptr;
  e.ready_event = e.ready.get();
  // Every rank's tensors are on its own GPU: ranks negotiate the kind, not the id.
  r.device = kDeviceTensor;
  return Status::Ok();
}

Status Engine::LaunchDevice(const FusionBatch& batch, const Responses& responses,
                            Entries& entries) {
  const Response& r = *responses[batch.members.front()];
  const TensorRequest& q = r.request;
  DeviceCollective c;
  c.device = device_.backend->device();
  c.dtype = q.dtype;
  c.deadline = TimeoutFromNow();
  // The negotiated reduction and root (every rank has the same); the kinds without them ignore
  // them.
  c.op = q.reduce_op;
  c.prescale = q.prescale;
  c.postscale = q.postscale;
  c.root = q.root;
  std::vector<std::shared_ptr<RequestState>> states;
  for (size_t i : batch.members) {
    const QueueEntry& e = *entries[i];
    c.tensors.push_back(DeviceTensor{e.input, e.output,
                                     static_cast<size_t>(e.request.NumElements()), e.ready_stream,
                                     e.ready_event});
    states.push_back(e.state);
  }
  Status local = Status::Ok();  // this rank's own error, reported after taking part
  switch (q.op) {
    case OpType::kAllreduce:
      c.kind = DeviceOpKind::kAllreduce;
      break;
    case OpType::kBroadcast:
      c.kind = DeviceOpKind::kBroadcast;
      break;
    case OpType::kAllgather:
    case OpType::kGather: {
      const bool gather = q.op == OpType::kGather;
      c.kind = gather ? DeviceOpKind::kGatherv : DeviceOpKind::kAllgatherv;
      QueueEntry& e = *entries[batch.members.front()];
      size_t total = 0;
      int64_t first = 0;
      CONCORD_ASSIGN_OR_RETURN(c.bytes_per_rank, AllgatherBytes(r, &total, &first));
      if (gather && config_.rank != q.root) {
        c.tensors[0].output = nullptr;  // never written
      } else if (total > e.output_capacity) {
        local = OutputTooSmall(q.name, total, e.output_capacity, OpTypeName(q.op));
        c.tensors[0].output = nullptr;  // the backend gathers into scratch memory
      } else {
        RequestState::Output& out = e.state->output();
        out.data = e.output;
        out.bytes = total;
        out.first_dim = first;
      }
      break;
    }
    case OpType::kReducescatter: {
      c.kind = DeviceOpKind::kReducescatter;
      const size_t row = RowBytes(q) / DTypeSize(q.dtype);  // elements per row
      for (int64_t rows : q.splits) c.counts_per_rank.push_back(static_cast<size_t>(rows) * row);
      break;
    }
    case OpType::kReduce:
      c.kind = DeviceOpKind::kReduce;
      if (config_.rank != q.root) c.tensors[0].output = nullptr;  // never written
      break;
    case OpType::kAlltoall: {
      c.kind = DeviceOpKind::kAlltoallv;
      QueueEntry& e = *entries[batch.members.front()];
      std::vector<int64_t> received;
      size_t total = 0;
      CONCORD_ASSIGN_OR_RETURN(c.recv_bytes_per_rank, AlltoallReceives(r, &received, &total));
      const size_t row = RowBytes(q);
      for (int64_t rows : e.request.splits)
        c.bytes_per_rank.push_back(static_cast<size_t>(rows) * row);
      if (total > e.output_capacity) {
        local = OutputTooSmall(q.name, total, e.output_capacity, "alltoall");
        c.tensors[0].output = nullptr;  // the backend receives into scratch memory
      } else {
        SetAlltoallOutput(e, e.output, total, std::move(received));
      }
      break;
    }
    case OpType::kBarrier:
      return Internal(std::string("a ") + OpTypeName(q.op) + " was planned as a device collective");
  }
  // Launched while the timeline was on: the launch slice is written, its completion follows.
  const bool traced = timeline_->on();
  std::string members = traced ? MembersJson(batch, responses) : std::string();
  const Clock::time_point launched = traced ? Clock::now() : Clock::time_point();
  const char* op = OpTypeName(q.op);
  auto done = [this, states, local, traced, launched, op, members, bytes = batch.bytes,
               timeline = timeline_, backend = device_.backend->name()](const Status& s) {
    if (traced && s.ok() && timeline->on()) {
      const Clock::time_point now = Clock::now();
      const Clock::time_point previous(
          Clock::duration(device_done_.exchange(now.time_since_epoch().count())));
      timeline->Slice(Timeline::kDeviceTrack, op, std::max(launched, previous), now, bytes, backend,
                      members);
    }
    for (const auto& state : states) state->Complete(s.ok() ? local : s);
    if (!s.ok()) return DeviceFailed(s);
    // A waiter driving the engine may sit in its receive for its slice: it returns and sees this.
    driver_.NotifyCompletion();
  };
  // Counted first: the collective may complete before Launch() returns.
  stats_.device_launches.fetch_add(1, std::memory_order_relaxed);
  stats_.batches.fetch_add(1, std::memory_order_relaxed);
  if (batch.fused) stats_.fused_tensors.fetch_add(batch.members.size(), std::memory_order_relaxed);
  CONCORD_ASSIGN_OR_RETURN(std::shared_ptr<DeviceEvent> event,
                           device_.backend->Launch(c, std::move(done)));
  if (traced) {
    timeline_->Slice(Timeline::kDeviceLaunchTrack, "launch", launched, Clock::now(), batch.bytes,
                     nullptr, "\"op\":" + JsonQuote(op) + "," + members);
  }
  // The completion thread owns the requests now: the list releases their entries.
  for (size_t i : batch.members) {
    entries[i]->state->SetLaunched(event);
    entries[i].reset();
  }
  return Status::Ok();
}

void Engine::DeviceFailed(const Status& status) {
  {
    MutexLock lock(failure_mu_);
    if (device_failure_.ok()) device_failure_ = status;
  }
  driver_.Wake();
}

}  // namespace concord
