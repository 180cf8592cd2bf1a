// Data-parallel SGD through Concord's C++ API: every rank trains the same small MLP on its own
// shard of a synthetic regression problem, averaging gradients with one grouped allreduce per
// step. Prints the global loss per epoch and checks that all replicas end bit-identical.
//
//   concordrun -np 4 build/examples/train_demo [--epochs N] [--samples-per-rank N]
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "concord/concord.hpp"

namespace {

constexpr int kIn = 16, kHidden = 32, kBatch = 32;

// A 16-32-1 tanh network; parameters and gradients as flat vectors named for the allreduce.
struct Mlp {
  std::vector<float> w1 = std::vector<float>(kHidden * kIn), b1 = std::vector<float>(kHidden);
  std::vector<float> w2 = std::vector<float>(kHidden), b2 = std::vector<float>(1);
  std::vector<std::vector<float>*> params() { return {&w1, &b1, &w2, &b2}; }
};

// Mean squared error of one batch; accumulates d(loss)/d(param) into grad.
float ForwardBackward(Mlp& m, const float* x, const float* y, int n, Mlp& grad) {
  float loss = 0;
  std::vector<float> h(kHidden);
  for (int s = 0; s < n; ++s) {
    const float* xs = x + s * kIn;
    float out = m.b2[0];
    for (int j = 0; j < kHidden; ++j) {
      float a = m.b1[j];
      for (int i = 0; i < kIn; ++i) a += m.w1[j * kIn + i] * xs[i];
      h[j] = std::tanh(a);
      out += m.w2[j] * h[j];
    }
    const float err = out - y[s];
    loss += err * err;
    const float d_out = 2 * err / n;
    grad.b2[0] += d_out;
    for (int j = 0; j < kHidden; ++j) {
      grad.w2[j] += d_out * h[j];
      const float d_a = d_out * m.w2[j] * (1 - h[j] * h[j]);
      grad.b1[j] += d_a;
      for (int i = 0; i < kIn; ++i) grad.w1[j * kIn + i] += d_a * xs[i];
    }
  }
  return loss / n;
}

uint64_t Fnv1a(const Mlp& m) {
  uint64_t h = 1469598103934665603ull;
  for (const auto* p : {&m.w1, &m.b1, &m.w2, &m.b2}) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(p->data());
    for (size_t i = 0; i < p->size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

constexpr char kUsage[] =
    "usage: train_demo [--epochs N] [--samples-per-rank N]\n"
    "  --epochs N            passes over the data, 1 to 100000 (default 8)\n"
    "  --samples-per-rank N  this rank's samples, 32 to 1048576 (default 2048)\n";

// The command line into *epochs and *samples. Returns -1 to go on, else the exit status: 0 after
// --help, 2 after saying what is wrong (an unknown argument, a flag without its value, a value that
// is not a whole number in its range).
int ParseArgs(int argc, char** argv, int* epochs, int* samples) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const bool is_epochs = flag == "--epochs";
    if (!is_epochs && flag != "--samples-per-rank") {
      std::fprintf(stderr, "train_demo: unknown argument '%s'\n%s", flag.c_str(), kUsage);
      return 2;
    }
    const long lo = is_epochs ? 1 : kBatch, hi = is_epochs ? 100000 : 1 << 20;
    if (i + 1 >= argc) {
      std::fprintf(stderr, "train_demo: %s needs a value\n%s", flag.c_str(), kUsage);
      return 2;
    }
    const char* text = argv[++i];
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(text, &end, 10);
    if (!std::isdigit(static_cast<unsigned char>(text[0])) || *end != '\0' || errno != 0 ||
        value < lo || value > hi) {
      std::fprintf(stderr, "train_demo: %s must be a whole number from %ld to %ld, not '%s'\n%s",
                   flag.c_str(), lo, hi, text, kUsage);
      return 2;
    }
    *(is_epochs ? epochs : samples) = static_cast<int>(value);
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  int epochs = 8, samples = 2048;
  if (const int status = ParseArgs(argc, argv, &epochs, &samples); status != -1) return status;
  try {
    concord::Communicator comm;
    const int rank = comm.rank(), size = comm.size();

    // The ground truth and this rank's shard of data (different on every rank).
    std::mt19937 truth_rng(1234);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> truth(kIn);
    for (auto& t : truth) t = normal(truth_rng);
    std::mt19937 rng(42 + rank);
    std::vector<float> x(samples * kIn), y(samples);
    for (int s = 0; s < samples; ++s) {
      float dot = 0;
      for (int i = 0; i < kIn; ++i) dot += truth[i] * (x[s * kIn + i] = normal(rng));
      y[s] = std::sin(dot) + 0.05f * normal(rng);
    }

    // Rank 0's initial weights everywhere.
    Mlp model;
    std::mt19937 init_rng(7 + rank);
    std::normal_distribution<float> init(0.f, 0.3f);
    for (auto* p : model.params()) {
      for (auto& v : *p) v = init(init_rng);
    }
    const char* names[] = {"w1", "b1", "w2", "b2"};
    for (int k = 0; k < 4; ++k) {
      comm.broadcast(std::string("init.") + names[k], concord::TensorView(*model.params()[k]), 0);
    }

    const float lr = 0.05f;
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      float epoch_loss = 0;
      const int steps = samples / kBatch;
      for (int step = 0; step < steps; ++step) {
        Mlp grad;
        epoch_loss +=
            ForwardBackward(model, &x[step * kBatch * kIn], &y[step * kBatch], kBatch, grad);
        std::vector<concord::Future> pending;
        {
          concord::Communicator::Group group(comm);
          for (int k = 0; k < 4; ++k) {
            pending.push_back(comm.allreduce_async(std::string("grad.") + names[k],
                                                   concord::TensorView(*grad.params()[k]),
                                                   concord::ReduceOp::kAverage));
          }
        }
        for (auto& f : pending) f.wait();
        for (int k = 0; k < 4; ++k) {
          auto& p = *model.params()[k];
          const auto& g = *grad.params()[k];
          for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * g[i];
        }
      }
      std::vector<float> loss{epoch_loss / steps};
      comm.allreduce("loss", concord::TensorView(loss), concord::ReduceOp::kAverage);
      if (rank == 0) std::printf("epoch %d  loss %.5f\n", epoch, loss[0]);
    }

    // Every replica must hold the very same bits.
    std::vector<int64_t> hash{static_cast<int64_t>(Fnv1a(model))};
    concord::Future gathered = comm.allgather_async("final.hash", concord::TensorView(hash));
    const std::vector<uint8_t> all = gathered.output();
    bool identical = true;
    for (int r = 0; r < size; ++r) {
      int64_t h;
      std::memcpy(&h, all.data() + r * sizeof(int64_t), sizeof(h));
      identical = identical && h == hash[0];
    }
    if (rank == 0) {
      std::printf("%d replicas %s (parameter hash %016llx)\n", size,
                  identical ? "are bit-identical" : "DIFFER",
                  static_cast<unsigned long long>(hash[0]));
    }
    return identical ? 0 : 1;
  } catch (const concord::Error& e) {
    std::fprintf(stderr, "train_demo: %s (status %d)\n", e.what(), e.status());
    return 1;
  }
}
