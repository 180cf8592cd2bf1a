#include "perf/gloo_raw.h"

#include <gloo/algorithm.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/reduce_scatter.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>

#include "backends/gloo/gloo_allreduce.h"
#include "backends/gloo/gloo_context.h"
#include "base/clock.h"
#include "perf/bench_common.h"

namespace concord {
namespace {

using gloo_internal::AllreduceAlgorithm;

// Runs `run` warmup + iterations times, timing each of the last `iterations` (ranks line up once
// before the timed runs, which then follow each other back to back, as in nccl-tests and as
// concord-perf times Concord's own rows), then a barrier so that no rank closes its pairs while a
// peer still receives. Throws Gloo's exceptions.
template <typename Run>
std::vector<double> TimeLoop(const std::shared_ptr<gloo::Context>& context, int warmup,
                             int iterations, Run run) {
  std::vector<double> seconds;
  seconds.reserve(iterations);
  for (int i = 0; i < warmup + iterations; ++i) {
    if (i == 0 || i == warmup) {
      gloo::BarrierOptions barrier(context);
      gloo::barrier(barrier);
    }
    const auto start = Clock::now();
    run();
    const std::chrono::duration<double> took = Clock::now() - start;
    if (i >= warmup) seconds.push_back(took.count());
  }
  gloo::BarrierOptions barrier(context);
  gloo::barrier(barrier);
  return seconds;
}

// A barrier after a checked run, so that no rank closes its pairs while a peer still receives.
void Barrier(const std::shared_ptr<gloo::Context>& context) {
  gloo::BarrierOptions barrier(context);
  gloo::barrier(barrier);
}

// A mismatch naming the first wrong element of this rank's checked run (bench_common.h), or OK.
Status CheckResult(const std::string& what, int rank, const std::string& wrong) {
  if (wrong.empty()) return Status::Ok();
  return Status(Code::kMismatch,
                what + ": wrong result on rank " + std::to_string(rank) + ": " + wrong);
}

// Runs the benchmark loop, then one run on known data whose result is checked into *check;
// throws Gloo's exceptions.
std::vector<double> TimeAllreduce(const std::shared_ptr<gloo::Context>& context,
                                  AllreduceAlgorithm algorithm, std::vector<float>& buffer,
                                  int warmup, int iterations, Status* check) {
  const std::vector<float*> ptrs{buffer.data()};
  const int n = static_cast<int>(buffer.size());
  std::unique_ptr<gloo::Algorithm> object;
  std::unique_ptr<gloo::AllreduceOptions> function;
  switch (algorithm) {
    case AllreduceAlgorithm::kRing:
      object = std::make_unique<gloo::AllreduceRing<float>>(context, ptrs, n);
      break;
    case AllreduceAlgorithm::kRingChunked:
      object = std::make_unique<gloo::AllreduceRingChunked<float>>(context, ptrs, n);
      break;
    case AllreduceAlgorithm::kHalvingDoubling:
      object = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context, ptrs, n);
      break;
    case AllreduceAlgorithm::kBcube:
      object = std::make_unique<gloo::AllreduceBcube<float>>(context, ptrs, n);
      break;
    case AllreduceAlgorithm::kFunction:
      function = std::make_unique<gloo::AllreduceOptions>(context);
      function->setOutput(buffer.data(), buffer.size());
      function->setReduceFunction([](void* out, const void* a, const void* b, size_t count) {
        gloo::sum<float>(out, a, b, count);
      });
      break;
  }
  const auto run = [&] {
    if (object) {
      object->run();
    } else {
      gloo::allreduce(*function);
    }
  };
  std::vector<double> seconds = TimeLoop(context, warmup, iterations, run);
  for (size_t i = 0; i < buffer.size(); ++i) {
    buffer[i] =
        static_cast<float>(bench::ReductionInput(CONCORD_SUM, context->rank, context->size, i));
  }
  run();
  Barrier(context);
  *check = CheckResult(
      std::string("raw gloo ") + gloo_internal::AllreduceAlgorithmName(algorithm), context->rank,
      bench::FirstWrongElement(
          buffer.size(), [&](size_t i) { return buffer[i]; }, bench::ReductionExpected));
  return seconds;
}

// Gloo's own reduce-scatter, all-to-all, allgather or broadcast (`algorithm`) over in and out:
// the benchmark loop, then one run on known data whose result is checked into *check; throws
// Gloo's exceptions.
std::vector<double> TimeExchange(const std::shared_ptr<gloo::Context>& context,
                                 const std::string& algorithm, std::vector<float>& in,
                                 std::vector<float>& out, int warmup, int iterations,
                                 Status* check) {
  const int rank = context->rank, size = context->size;
  const size_t block = in.size() / size;
  std::function<void()> run;
  std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> reduce_scatter;
  gloo::AllgatherOptions allgather(context);
  gloo::BroadcastOptions broadcast(context);
  gloo::AlltoallOptions alltoall(context);
  gloo::AlltoallvOptions alltoallv(context);
  const std::vector<int64_t> counts(size, static_cast<int64_t>(block));
  if (algorithm == "reduce_scatter_hd") {
    const std::vector<int> recv(size, static_cast<int>(block));
    reduce_scatter = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
        context, std::vector<float*>{in.data()}, static_cast<int>(in.size()), recv);
    run = [&] { reduce_scatter->run(); };
  } else if (algorithm == "allgather") {
    allgather.setInput(in.data(), block);
    allgather.setOutput(out.data(), out.size());
    run = [&] { gloo::allgather(allgather); };
  } else if (algorithm == "broadcast") {
    broadcast.setOutput(in.data(), in.size());
    broadcast.setRoot(0);
    run = [&] { gloo::broadcast(broadcast); };
  } else if (algorithm == "alltoall") {
    alltoall.setInput(in.data(), in.size());
    alltoall.setOutput(out.data(), out.size());
    run = [&] { gloo::alltoall(alltoall); };
  } else {
    alltoallv.setInput(in.data(), counts);
    alltoallv.setOutput(out.data(), counts);
    run = [&] { gloo::alltoallv(alltoallv); };
  }
  std::vector<double> seconds = TimeLoop(context, warmup, iterations, run);
  // The known data: a reduce-scatter's (this rank's block lands at the start of `in`), the
  // broadcast root's, every rank's to move; the rest zeroed, so that what was not written shows.
  const bool reduces = algorithm == "reduce_scatter_hd";
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<float>(reduces ? bench::ReductionInput(CONCORD_SUM, rank, size, i)
                               : algorithm == "broadcast" && rank != 0 ? 0
                                                                       : bench::MoveInput(rank, i));
  }
  std::fill(out.begin(), out.end(), 0.0f);
  run();
  Barrier(context);
  std::function<double(size_t)> want;
  const float* got = out.data();
  size_t count = out.size();
  if (reduces) {
    got = in.data();
    count = block;
    want = [&](size_t j) { return bench::ReductionExpected(rank * block + j); };
  } else if (algorithm == "broadcast") {
    got = in.data();
    want = [](size_t i) { return bench::MoveInput(0, i); };
  } else if (algorithm == "allgather") {
    want = [&](size_t i) { return bench::MoveInput(static_cast<int>(i / block), i % block); };
  } else {  // all-to-all: block r of the output is rank r's block `rank`
    want = [&](size_t i) {
      return bench::MoveInput(static_cast<int>(i / block), rank * block + i % block);
    };
  }
  *check = CheckResult("raw gloo " + algorithm, rank,
                       bench::FirstWrongElement(
                           count, [&](size_t i) { return got[i]; }, want));
  return seconds;
}

}  // namespace

StatusOr<std::vector<double>> RunRawGlooExchange(const RawGlooOptions& options, Store* store) {
  const std::string& algo = options.algorithm;
  if (algo != "reduce_scatter_hd" && algo != "alltoall" && algo != "alltoallv" &&
      algo != "allgather" && algo != "broadcast") {
    return InvalidArgument("raw gloo: no exchange algorithm '" + algo + "'");
  }
  if (options.size < 2 || options.count == 0 || options.count % options.size != 0 ||
      options.iterations < 1 || options.warmup < 0) {
    return InvalidArgument("raw gloo " + algo + ": needs 2 ranks or more and a count they divide");
  }
  gloo_internal::GlooConnectOptions connect;
  connect.rank = options.rank;
  connect.size = options.size;
  connect.iface = options.iface;
  connect.host = options.host;
  connect.prefix = options.prefix;
  connect.timeout = options.timeout;
  std::shared_ptr<gloo_internal::GlooContext> context;
  CONCORD_ASSIGN_OR_RETURN(context, gloo_internal::ConnectGloo(connect, store));
  std::vector<float> in(options.count, 1.0f), out(options.count, 0.0f);
  try {
    Status check;
    std::vector<double> seconds =
        TimeExchange(context, algo, in, out, options.warmup, options.iterations, &check);
    if (!check.ok()) return check;
    return seconds;
  } catch (...) {
    return gloo_internal::CurrentExceptionToStatus("raw " + algo);
  }
}

StatusOr<std::vector<double>> RunRawGlooAllreduce(const RawGlooOptions& options, Store* store) {
  AllreduceAlgorithm algorithm;
  CONCORD_ASSIGN_OR_RETURN(algorithm, gloo_internal::ParseAllreduceAlgorithm(options.algorithm));
  if (options.count == 0 || options.iterations < 1 || options.warmup < 0) {
    return InvalidArgument("raw gloo: count and iterations must be positive, warmup >= 0");
  }
  if (!gloo_internal::AlgorithmSupports(algorithm, options.size, options.count, sizeof(float))) {
    return InvalidArgument(std::string("raw gloo: ") +
                           gloo_internal::AllreduceAlgorithmName(algorithm) + " cannot run " +
                           std::to_string(options.count) + " elements on " +
                           std::to_string(options.size) + " ranks");
  }
  gloo_internal::GlooConnectOptions connect;
  connect.rank = options.rank;
  connect.size = options.size;
  connect.iface = options.iface;
  connect.host = options.host;
  connect.prefix = options.prefix;
  connect.timeout = options.timeout;
  std::shared_ptr<gloo_internal::GlooContext> context;
  CONCORD_ASSIGN_OR_RETURN(context, gloo_internal::ConnectGloo(connect, store));
  std::vector<float> buffer(options.count, 1.0f);
  try {
    Status check;
    std::vector<double> seconds =
        TimeAllreduce(context, algorithm, buffer, options.warmup, options.iterations, &check);
    if (!check.ok()) return check;
    return seconds;
  } catch (...) {
    return gloo_internal::CurrentExceptionToStatus(
        std::string("raw allreduce (") + gloo_internal::AllreduceAlgorithmName(algorithm) + ")");
  }
}

StatusOr<std::vector<double>> RunRawGlooSendRecv(const RawGlooOptions& options, Store* store) {
  if (options.size % 2 != 0 || options.iterations < 1 || options.warmup < 0) {
    return InvalidArgument("raw gloo send/recv: an even number of ranks, iterations >= 1");
  }
  gloo_internal::GlooConnectOptions connect;
  connect.rank = options.rank;
  connect.size = options.size;
  connect.iface = options.iface;
  connect.host = options.host;
  connect.prefix = options.prefix;
  connect.timeout = options.timeout;
  std::shared_ptr<gloo_internal::GlooContext> context;
  CONCORD_ASSIGN_OR_RETURN(context, gloo_internal::ConnectGloo(connect, store));
  std::vector<float> out(std::max<size_t>(options.count, 1), 1.0f), in(out.size());
  const size_t bytes = options.count * sizeof(float);
  const int peer = options.rank ^ 1;
  try {
    auto send = context->createUnboundBuffer(out.data(), bytes);
    auto recv = context->createUnboundBuffer(in.data(), bytes);
    std::vector<double> seconds;
    for (int i = 0; i < options.warmup + options.iterations; ++i) {
      if (i == 0 || i == options.warmup) {
        gloo::BarrierOptions barrier(context);
        gloo::barrier(barrier);
      }
      const auto start = Clock::now();
      recv->recv(peer, 1);
      send->send(peer, 1);
      send->waitSend(options.timeout);
      recv->waitRecv(options.timeout);
      const std::chrono::duration<double> took = Clock::now() - start;
      if (i >= options.warmup) seconds.push_back(took.count());
    }
    // One exchange of known data, checked.
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = static_cast<float>(bench::MoveInput(options.rank, i));
    std::fill(in.begin(), in.end(), 0.0f);
    recv->recv(peer, 1);
    send->send(peer, 1);
    send->waitSend(options.timeout);
    recv->waitRecv(options.timeout);
    gloo::BarrierOptions barrier(context);
    gloo::barrier(barrier);
    const Status check = CheckResult("raw gloo send/recv", options.rank,
                                     bench::FirstWrongElement(
                                         options.count, [&](size_t i) { return in[i]; },
                                         [&](size_t i) { return bench::MoveInput(peer, i); }));
    if (!check.ok()) return check;
    return seconds;
  } catch (...) {
    return gloo_internal::CurrentExceptionToStatus("raw send/recv");
  }
}

}  // namespace concord
