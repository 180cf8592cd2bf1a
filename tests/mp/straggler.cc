// The straggler report under a launcher (CONCORD_STRAGGLER_REPORT_S): each step every rank
// "computes" (sleeps --compute-ms), rank --slow sleeps --late-ms more, then all allreduce
// --tensors float32 tensors of 1024 elements, check the sums and end the step. Rank 0's log must
// name the slow rank within the run's steps; with --slow -1 it must name none (the test greps).
// Rank 0's metrics must attribute most operations to the slow rank. With --scrape (and
// CONCORD_METRICS_PORT set) a thread of each rank scrapes its own metrics endpoint while the
// steps run: the endpoint renders while the engine records (ThreadSanitizer runs this).
//   mp_straggler --slow 3 --steps 10 --compute-ms 20 --late-ms 60 [--scrape]
//   (then grep "mp_straggler: rank .* PASS" and rank 0's "straggler: rank 3 arrived last")
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/mp/mp_common.h"

namespace {

int IntArg(int argc, char** argv, const char* flag, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

bool HasFlag(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) return true;
  }
  return false;
}

// The communicator's metrics JSON.
std::string MetricsJson(concord_comm_t comm) {
  size_t length = 0;
  CHECK_STATUS(concord_comm_metrics(comm, nullptr, 0, &length), CONCORD_SUCCESS);
  std::string json(length + 65536, '\0');
  CHECK_STATUS(concord_comm_metrics(comm, &json[0], json.size(), &length), CONCORD_SUCCESS);
  json.resize(length);
  return json;
}

// The number after `key` in `json` at or after `from` (-1 when absent).
double NumberAfter(const std::string& json, const std::string& key, size_t from = 0) {
  const size_t at = json.find(key, from);
  return at == std::string::npos ? -1.0 : std::atof(json.c_str() + at + key.size());
}

// One GET /metrics from 127.0.0.1:port: whether the answer was a 200 with the operations' series.
bool ScrapeOnce(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const char request[] = "GET /metrics HTTP/1.0\r\n\r\n";
    if (::write(fd, request, sizeof(request) - 1) == static_cast<ssize_t>(sizeof(request) - 1)) {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) reply.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return reply.rfind("HTTP/1.0 200", 0) == 0 || reply.rfind("HTTP/1.1 200", 0) == 0
             ? reply.find("concord_operations_total{") != std::string::npos
             : false;
}

}  // namespace

int main(int argc, char** argv) {
  const int slow = IntArg(argc, argv, "--slow", -1);
  const int steps = IntArg(argc, argv, "--steps", 10);
  const int compute_ms = IntArg(argc, argv, "--compute-ms", 20);
  const int late_ms = IntArg(argc, argv, "--late-ms", 60);
  const int tensors = IntArg(argc, argv, "--tensors", 8);
  int rank = 0, size = 1;
  concord_comm_t comm = mp::InitOrExit(&rank, &size);
  std::atomic<bool> stop{false};
  std::atomic<int> scrapes{0};
  std::thread scraper;
  if (HasFlag(argc, argv, "--scrape")) {
    const std::string json = MetricsJson(comm);
    const size_t colon = json.find(':', json.find("\"endpoint\":\""));
    const size_t port_at = json.find(':', colon + 1);
    const int port = port_at == std::string::npos ? -1 : std::atoi(json.c_str() + port_at + 1);
    CHECKF(port > 0, "no metrics endpoint in %s (CONCORD_METRICS_PORT unset?)", json.c_str());
    scraper = std::thread([&stop, &scrapes, port] {
      while (!stop.load() && port > 0) {
        if (ScrapeOnce(port)) scrapes.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  constexpr int64_t kElements = 1024;
  std::vector<std::vector<float>> data(tensors, std::vector<float>(kElements));
  for (int step = 0; step < steps; ++step) {
    const int sleep_ms = compute_ms + (rank == slow ? late_ms : 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    std::vector<concord_request_t> requests(tensors, nullptr);
    std::vector<int64_t> shape{kElements};
    for (int t = 0; t < tensors; ++t) {
      for (int64_t i = 0; i < kElements; ++i) data[t][i] = static_cast<float>(rank + step + t);
      concord_tensor_t tensor = {data[t].data(), CONCORD_FLOAT32, 1, shape.data(),
                                 CONCORD_DEVICE_CPU};
      const std::string name = "grad." + std::to_string(t);
      CHECK_STATUS(concord_allreduce_async(comm, name.c_str(), &tensor, nullptr, nullptr, nullptr,
                                           nullptr, &requests[t]),
                   CONCORD_SUCCESS);
    }
    for (int t = 0; t < tensors; ++t) {
      CHECK_STATUS(concord_wait(requests[t], 60), CONCORD_SUCCESS);
      concord_request_free(requests[t]);
      // Sum over ranks of rank + step + t: exact in float32 at these sizes.
      const float want = static_cast<float>(size * (step + t) + size * (size - 1) / 2);
      CHECKF(data[t][0] == want && data[t][kElements - 1] == want, "step %d tensor %d: %g, not %g",
             step, t, static_cast<double>(data[t][0]), static_cast<double>(want));
    }
    CHECK_STATUS(concord_end_step(comm), CONCORD_SUCCESS);
  }
  if (scraper.joinable()) {
    stop.store(true);
    scraper.join();
    CHECKF(scrapes.load() > 0, "no scrape of the metrics endpoint succeeded");
  }
  if (rank == 0 && slow > 0 && slow < size) {
    // The metrics attribute most operations to the slow rank (rank 0's straggler totals).
    const std::string json = MetricsJson(comm);
    const size_t entry = json.find("{\"rank\":" + std::to_string(slow) + ",\"last\":");
    const double share = NumberAfter(json, "\"share\":", entry);
    CHECKF(entry != std::string::npos && share > 0.5, "rank %d's straggler share %g in %s", slow,
           share, json.c_str());
  }
  CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
  if (CheckFailures() != 0) return 1;
  std::printf("mp_straggler: rank %d PASS\n", rank);
  return 0;
}
