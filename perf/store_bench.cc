// store_bench: what one request to the TCP store's server (rendezvous/tcp_store.h) costs while the
// server holds many connections, as during a large job's start, when every rank has one or two
// open and most of them wait for keys. For each N of --connections, N other authenticated
// connections are opened, half of them idle and half parked on keys that never appear (GETs with
// a long timeout); then one client's GET of an existing key and SET round trips are timed: the
// median of --rounds rounds of --iters calls, in microseconds, and the ratio to the first row's
// (the same process, one run). A server whose work per request follows the connections it holds
// shows ratios that grow with N.
//
//   store_bench [--connections 0,1000,4000] [--iters N] [--rounds N]
//
// The process needs a descriptor per connection, twice (both ends are here): it raises its soft
// RLIMIT_NOFILE to the hard limit, and says so when that is too low.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "perf/bench_common.h"
#include "rendezvous/net.h"
#include "rendezvous/tcp_store.h"

namespace concord {
namespace {

constexpr char kTool[] = "store_bench";
constexpr char kToken[] = "store-bench";

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr,
               "%s: %s\nusage: store_bench [--connections N,N,...] [--iters N] [--rounds N]\n",
               kTool, error.c_str());
  std::exit(2);
}

void CheckOrExit(const Status& s, const std::string& what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s: %s\n", kTool, what.c_str(), s.ToString().c_str());
  std::exit(1);
}

Deadline Soon() {
  return Deadline::After(std::chrono::seconds(10));
}

// An authenticated connection that sends nothing more (idle), or a GET of `missing` that waits
// in the server for an hour (parked). Raw sockets: a TcpStore client would block a thread each.
net::Fd OpenConnection(int port, const std::string& missing) {
  StatusOr<net::Fd> fd = net::Connect("127.0.0.1", port, Soon());
  CheckOrExit(fd.status(), "connecting");
  std::string frames = store_wire::Frame(store_wire::kHello, kToken);
  if (!missing.empty()) {
    store_wire::Request get;
    get.type = store_wire::kGet;
    get.key = missing;
    get.timeout_ms = 3600 * 1000;
    frames += store_wire::Frame(store_wire::kGet, store_wire::EncodeRequest(get));
  }
  CheckOrExit(net::WriteAll(fd->get(), frames.data(), frames.size(), Soon(), "the server"),
              "writing a HELLO");
  unsigned char reply[store_wire::kHeaderSize + 1];  // HELLO's OK
  CheckOrExit(net::ReadFull(fd->get(), reply, sizeof(reply), Soon(), "the server"),
              "reading a HELLO's reply");
  return std::move(*fd);
}

// Microseconds per call of `call`: the median of `rounds` rounds of `iters` calls.
double MicrosPerCall(int iters, int rounds, const std::function<Status()>& call) {
  std::vector<double> per_call;
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) CheckOrExit(call(), "a timed request");
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    per_call.push_back(took.count() / iters);
  }
  return bench::Median(per_call);
}

void RaiseDescriptorLimit(long long connections) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  limit.rlim_cur = limit.rlim_max;
  (void)::setrlimit(RLIMIT_NOFILE, &limit);
  const long long needed = 2 * connections + 64;
  if (static_cast<long long>(limit.rlim_cur) < needed) {
    Usage("--connections " + std::to_string(connections) + " needs about " +
          std::to_string(needed) + " descriptors; RLIMIT_NOFILE allows " +
          std::to_string(limit.rlim_cur));
  }
}

int Main(int argc, char** argv) {
  std::vector<long long> counts = {0, 1000, 4000};
  long long iters = 5000;
  long long rounds = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--connections") {
      counts.clear();
      for (size_t at = 0; at <= value.size();) {
        const size_t comma = std::min(value.find(',', at), value.size());
        counts.push_back(bench::ParseInteger(flag, value.substr(at, comma - at), 0, 100000, Usage));
        at = comma + 1;
      }
    } else if (flag == "--iters") {
      iters = bench::ParseInteger(flag, value, 1, 10000000, Usage);
    } else if (flag == "--rounds") {
      rounds = bench::ParseInteger(flag, value, 1, 1000, Usage);
    } else {
      Usage("unknown option " + flag);
    }
  }
  RaiseDescriptorLimit(*std::max_element(counts.begin(), counts.end()));

  StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::Start("127.0.0.1", 0, kToken);
  CheckOrExit(server.status(), "starting the server");
  const int port = (*server)->port();
  StatusOr<std::unique_ptr<TcpStore>> client = TcpStore::Connect("127.0.0.1", port, kToken, Soon());
  CheckOrExit(client.status(), "connecting the timed client");
  CheckOrExit((*client)->Set("present", "value"), "a SET");

  std::printf("%12s %8s %10s %10s %10s %10s\n", "connections", "parked", "get(us)", "set(us)",
              "get x", "set x");
  // Warm-up: the first calls (connection set-up, cold caches) would skew the first row.
  (void)MicrosPerCall(static_cast<int>(iters), 1,
                      [&] { return (*client)->Get("present", Soon()).status(); });
  std::vector<net::Fd> held;
  double first_get = 0;
  double first_set = 0;
  for (const long long n : counts) {
    while (static_cast<long long>(held.size()) < n) {
      const bool park = held.size() % 2 == 1;
      held.push_back(OpenConnection(port, park ? "never/" + std::to_string(held.size()) : ""));
    }
    held.resize(static_cast<size_t>(n));  // a smaller count after a larger: close the rest
    const double get = MicrosPerCall(static_cast<int>(iters), static_cast<int>(rounds),
                                     [&] { return (*client)->Get("present", Soon()).status(); });
    const double set = MicrosPerCall(static_cast<int>(iters), static_cast<int>(rounds),
                                     [&] { return (*client)->Set("written", "value"); });
    if (first_get == 0) {
      first_get = get;
      first_set = set;
    }
    std::printf("%12lld %8lld %10.1f %10.1f %10.2f %10.2f\n", n, n / 2, get, set, get / first_get,
                set / first_set);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace concord

int main(int argc, char** argv) {
  return concord::Main(argc, argv);
}
