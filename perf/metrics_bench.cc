// metrics_bench: what the metrics (core/metrics.h) cost per operation, for a bound on their share
// of a step: a request completed with and without metering (RequestState::Meter, MarkNegotiated
// and the record in Complete), and a backend call through a MeteredBackend and without. Each
// figure is nanoseconds per call, the median of --rounds rounds of --iters calls, side by side.
//
//   metrics_bench [--iters N] [--rounds N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/metered_backend.h"
#include "core/request_state.h"
#include "perf/bench_common.h"

namespace concord {
namespace {

// A backend whose collectives return at once: the wrapper's own cost is what remains.
class NullBackend : public Backend {
 public:
  const char* name() const override { return "null"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status Allreduce(void*, size_t, DType, ReduceOp) override { return Status::Ok(); }
  Status Allgatherv(const void*, void*, const std::vector<size_t>&) override {
    return Status::Ok();
  }
  Status Broadcast(void*, size_t, int) override { return Status::Ok(); }
  Status Barrier() override { return Status::Ok(); }
  Status ReduceScatter(const void*, void*, const std::vector<size_t>&, DType, ReduceOp) override {
    return Status::Ok();
  }
  Status Alltoallv(const void*, const std::vector<size_t>&, void*,
                   const std::vector<size_t>&) override {
    return Status::Ok();
  }
};

// Median nanoseconds per call of `call` over `rounds` rounds of `iters` calls.
double NanosPerCall(const std::function<void()>& call, int iters, int rounds) {
  std::vector<double> per_call;
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) call();
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    per_call.push_back(took.count() / iters);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr, "metrics_bench: %s\nusage: metrics_bench [--iters N] [--rounds N]\n",
               why.c_str());
  std::exit(2);
}

int Main(int argc, char** argv) {
  int iters = 200000, rounds = 9;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--iters" || a == "--rounds") && i + 1 >= argc) Usage(a + " needs a value");
    if (a == "--iters") {
      iters = static_cast<int>(bench::ParseInteger(a, argv[++i], 1, 1000000000, Usage));
    } else if (a == "--rounds") {
      rounds = static_cast<int>(bench::ParseInteger(a, argv[++i], 1, 1000000, Usage));
    } else {
      Usage("unknown argument '" + a + "'");
    }
  }
  auto metrics = std::make_shared<Metrics>();
  const char* ops[] = {"allreduce", "allgather", "broadcast"};
  int k = 0;
  auto plain = [] {
    RequestState state;
    state.Complete(Status::Ok());
  };
  auto metered = [&] {
    RequestState state;
    state.Meter(metrics, ops[k++ % 3], DType::kFloat32, 4096, Clock::now());
    state.MarkNegotiated();
    state.Complete(Status::Ok());
  };
  MeteredBackend wrapped(std::make_unique<NullBackend>(), 0, metrics,
                         std::make_shared<Timeline>(0, 1, nullptr));
  NullBackend bare;
  float x = 0;
  // Alternated, so both see the same machine.
  double request[2] = {0, 0}, backend[2] = {0, 0};
  for (int pass = 0; pass < 2; ++pass) {
    request[0] += NanosPerCall(plain, iters, rounds) / 2;
    request[1] += NanosPerCall(metered, iters, rounds) / 2;
    backend[0] +=
        NanosPerCall([&] { (void)bare.Allreduce(&x, 1, DType::kFloat32, ReduceOp::kSum); }, iters,
                     rounds) /
        2;
    backend[1] +=
        NanosPerCall([&] { (void)wrapped.Allreduce(&x, 1, DType::kFloat32, ReduceOp::kSum); },
                     iters, rounds) /
        2;
  }
  std::printf("%-36s %10s %10s %10s\n", "what", "plain ns", "metered ns", "cost ns");
  std::printf("%-36s %10.1f %10.1f %10.1f\n", "request: meter, negotiate, complete", request[0],
              request[1], request[1] - request[0]);
  std::printf("%-36s %10.1f %10.1f %10.1f\n", "backend allreduce call", backend[0], backend[1],
              backend[1] - backend[0]);
  return 0;
}

}  // namespace
}  // namespace concord

int main(int argc, char** argv) {
  return concord::Main(argc, argv);
}
