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
#include <memory>
#include <string>

#include "backends/gloo/gloo_allreduce.h"
#include "backends/gloo/gloo_context.h"
#include "base/clock.h"

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

// Runs the benchmark loop; throws Gloo's exceptions.
std::vector<double> TimeAllreduce(const std::shared_ptr<gloo::Context>& context,
                                  AllreduceAlgorithm algorithm, std::vector<float>& buffer,
                                  int warmup, int iterations) {
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
  return TimeLoop(context, warmup, iterations, [&] {
    if (object) {
      object->run();
    } else {
      gloo::allreduce(*function);
    }
  });
}

std::vector<double> TimeExchange(const std::shared_ptr<gloo::Context>& context,
                                 const std::string& algorithm, std::vector<float>& in,
                                 std::vector<float>& out, int warmup, int iterations) {
  const int size = context->size;
  const size_t block = in.size() / size;
  if (algorithm == "reduce_scatter_hd") {
    const std::vector<int> recv(size, static_cast<int>(block));
    gloo::ReduceScatterHalvingDoubling<float> object(context, {in.data()},
                                                     static_cast<int>(in.size()), recv);
    return TimeLoop(context, warmup, iterations, [&] { object.run(); });
  }
  if (algorithm == "allgather") {
    gloo::AllgatherOptions options(context);
    options.setInput(in.data(), block);
    options.setOutput(out.data(), out.size());
    return TimeLoop(context, warmup, iterations, [&] { gloo::allgather(options); });
  }
  if (algorithm == "broadcast") {
    gloo::BroadcastOptions options(context);
    options.setOutput(in.data(), in.size());
    options.setRoot(0);
    return TimeLoop(context, warmup, iterations, [&] { gloo::broadcast(options); });
  }
  if (algorithm == "alltoall") {
    gloo::AlltoallOptions options(context);
    options.setInput(in.data(), in.size());
    options.setOutput(out.data(), out.size());
    return TimeLoop(context, warmup, iterations, [&] { gloo::alltoall(options); });
  }
  gloo::AlltoallvOptions options(context);
  const std::vector<int64_t> counts(size, static_cast<int64_t>(block));
  options.setInput(in.data(), counts);
  options.setOutput(out.data(), counts);
  return TimeLoop(context, warmup, iterations, [&] { gloo::alltoallv(options); });
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
    return TimeExchange(context, algo, in, out, options.warmup, options.iterations);
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
    return TimeAllreduce(context, algorithm, buffer, options.warmup, options.iterations);
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
    gloo::BarrierOptions barrier(context);
    gloo::barrier(barrier);
    return seconds;
  } catch (...) {
    return gloo_internal::CurrentExceptionToStatus("raw send/recv");
  }
}

}  // namespace concord
