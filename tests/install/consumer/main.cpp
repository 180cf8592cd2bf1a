// Installed-package consumer in C++17: a single-rank allreduce through the header-only C++ API.
#include <concord/concord.hpp>
#include <cstdio>
#include <vector>

int main() {
  try {
    concord_config_t config;
    concord_config_init(&config);
    config.rank = 0;
    config.size = 1;
    concord::Communicator comm(config);
    std::vector<double> x = {1.0, 2.0, 3.0};
    comm.allreduce("x", concord::TensorView(x), concord::ReduceOp::kAverage);
    if (comm.size() != 1 || x[0] != 1.0 || x[2] != 3.0) {
      std::fprintf(stderr, "consumer_cpp: wrong result\n");
      return 1;
    }
  } catch (const concord::Error& e) {
    std::fprintf(stderr, "consumer_cpp: %s\n", e.what());
    return 1;
  }
  std::printf("consumer_cpp OK\n");
  return 0;
}
