// Data-parallel SGD with compressed gradients, 4 ranks simulated in one process: each rank computes
// the least-squares gradient of its own minibatch, encodes it with its own CompressionState (the
// prescale 1/4 makes the sum an average), and the ranks' encoded tensors are combined as the
// collective would: summed element-wise in the reduce dtype then decoded (allreduce kind), or
// decoded and added (allgather kind). Every compressor trains the same model from the same data for
// the same number of epochs; the final training loss is compared with the uncompressed run's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "compression/registry.h"
#include "tests/compression/compression_test_util.h"

namespace concord {
namespace compression {
namespace {

constexpr int kRanks = 4;
constexpr size_t kFeatures = 2000;
constexpr size_t kSamplesPerRank = 2048;
constexpr size_t kBatch = 32;  // per rank per step
constexpr int kEpochs = 12;

// y = X w* + noise, X and w* standard normal.
struct Problem {
  std::vector<float>
      x;  // (kRanks * kSamplesPerRank) x kFeatures, rank r owns rows r*kSamplesPerRank..
  std::vector<float> y;
  size_t rows() const { return y.size(); }
};

Problem MakeProblem() {
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem p;
  const size_t rows = kRanks * kSamplesPerRank;
  std::vector<float> w(kFeatures);
  for (float& v : w) v = normal(rng);
  p.x.resize(rows * kFeatures);
  for (float& v : p.x) v = normal(rng);
  p.y.resize(rows);
  for (size_t i = 0; i < rows; ++i) {
    double dot = 0.0;
    for (size_t j = 0; j < kFeatures; ++j) dot += p.x[i * kFeatures + j] * w[j];
    p.y[i] = static_cast<float>(dot) + normal(rng);
  }
  return p;
}

// Mean over all rows of (x.w - y)^2 / 2.
double Loss(const Problem& p, const std::vector<float>& w) {
  double total = 0.0;
  for (size_t i = 0; i < p.rows(); ++i) {
    double dot = 0.0;
    for (size_t j = 0; j < kFeatures; ++j) dot += p.x[i * kFeatures + j] * w[j];
    const double r = dot - p.y[i];
    total += r * r / 2.0;
  }
  return total / static_cast<double>(p.rows());
}

// grad = mean over the batch rows of (x.w - y) x.
void BatchGradient(const Problem& p, const std::vector<float>& w, size_t first_row,
                   std::vector<float>* grad) {
  std::fill(grad->begin(), grad->end(), 0.0f);
  for (size_t i = first_row; i < first_row + kBatch; ++i) {
    const float* row = &p.x[i * kFeatures];
    float dot = 0.0f;
    for (size_t j = 0; j < kFeatures; ++j) dot += row[j] * w[j];
    const float r = (dot - p.y[i]) / static_cast<float>(kBatch);
    for (size_t j = 0; j < kFeatures; ++j) (*grad)[j] += r * row[j];
  }
}

// Trains with `spec` and returns the final training loss. forget_residuals drops the error-feedback
// state after every step (top-k without error feedback, to show the comparison can fail).
double Train(const Problem& p, const std::string& spec, bool forget_residuals = false) {
  const std::unique_ptr<Compressor> made = testing_util::Make(spec);
  const Compressor& c = *made;
  const size_t bytes = c.EncodedBytes(DType::kFloat32, kFeatures);
  const size_t stride = (bytes + kEncodedAlignment - 1) / kEncodedAlignment * kEncodedAlignment;
  testing_util::Buffer gathered_storage(kRanks * stride);
  uint8_t* gathered = gathered_storage.data();
  std::vector<CompressionState> states(kRanks);
  std::vector<float> w(kFeatures, 0.0f), grad(kFeatures), sum(kFeatures);
  const size_t steps_per_epoch = kSamplesPerRank / kBatch;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    // Step decay: the last epochs at a lower rate, so SGD noise does not dominate the final loss.
    const float lr = epoch < kEpochs / 2 ? 0.02f : (epoch < 3 * kEpochs / 4 ? 0.005f : 0.00125f);
    for (size_t step = 0; step < steps_per_epoch; ++step) {
      for (int r = 0; r < kRanks; ++r) {
        BatchGradient(p, w, r * kSamplesPerRank + step * kBatch, &grad);
        EncodeInput in{"w", DType::kFloat32, kFeatures, grad.data(), 1.0 / kRanks};
        const Status s = c.Encode(in, gathered + r * stride, &states[r]);
        EXPECT_TRUE(s.ok()) << s.ToString();
      }
      if (c.exchange() == Exchange::kAllreduce) {
        // The allreduce: sum the encoded buffers element-wise in the reduce dtype, then decode.
        const DType rd = c.reduce_dtype(DType::kFloat32);
        for (int r = 1; r < kRanks; ++r) {
          ReduceElements(gathered, gathered, gathered + r * stride, kFeatures, rd, ReduceOp::kSum);
        }
        EXPECT_TRUE(c.Decode(gathered, DType::kFloat32, kFeatures, sum.data()).ok());
      } else {
        EXPECT_TRUE(
            DecodeSum(c, gathered, stride, kRanks, DType::kFloat32, kFeatures, sum.data()).ok());
      }
      for (size_t j = 0; j < kFeatures; ++j) w[j] -= lr * sum[j];
      if (forget_residuals) {
        for (CompressionState& state : states) state.Clear();
      }
    }
  }
  return Loss(p, w);
}

class ConvergenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    problem_ = new Problem(MakeProblem());
    initial_loss_ = Loss(*problem_, std::vector<float>(kFeatures, 0.0f));
    dense_loss_ = Train(*problem_, "none");
  }
  static void TearDownTestSuite() { delete problem_; }
  static Problem* problem_;
  static double initial_loss_;
  static double dense_loss_;
};
Problem* ConvergenceTest::problem_ = nullptr;
double ConvergenceTest::initial_loss_ = 0.0;
double ConvergenceTest::dense_loss_ = 0.0;

TEST_F(ConvergenceTest, DenseRunLearns) {
  RecordProperty("dense_loss", std::to_string(dense_loss_));
  EXPECT_LT(dense_loss_, initial_loss_ / 100.0) << "initial " << initial_loss_;
}

TEST_F(ConvergenceTest, Fp16WithinOnePercentOfDense) {
  const double loss = Train(*problem_, "fp16");
  std::printf("dense %.5f fp16 %.5f\n", dense_loss_, loss);
  EXPECT_LE(loss, dense_loss_ * 1.01);
}

TEST_F(ConvergenceTest, Bf16WithinFivePercentOfDense) {
  const double loss = Train(*problem_, "bf16");
  std::printf("dense %.5f bf16 %.5f\n", dense_loss_, loss);
  EXPECT_LE(loss, dense_loss_ * 1.05);
}

TEST_F(ConvergenceTest, TopkExactWithinFivePercentOfDense) {
  const double loss = Train(*problem_, "topk:density=0.01,method=exact");
  std::printf("dense %.5f topk exact %.5f\n", dense_loss_, loss);
  EXPECT_LE(loss, dense_loss_ * 1.05);
}

TEST_F(ConvergenceTest, TopkSampledFp16ValuesWithinFivePercentOfDense) {
  const double loss = Train(*problem_, "topk:density=0.01,method=sampled,values=fp16");
  std::printf("dense %.5f topk sampled fp16 %.5f\n", dense_loss_, loss);
  EXPECT_LE(loss, dense_loss_ * 1.05);
}

// The comparison has teeth: the same top-k without error feedback ends far from the dense loss.
TEST_F(ConvergenceTest, TopkWithoutErrorFeedbackFallsBehind) {
  const double loss = Train(*problem_, "topk:density=0.01,method=exact", true);
  std::printf("dense %.5f topk without error feedback %.5f\n", dense_loss_, loss);
  EXPECT_GT(loss, dense_loss_ * 1.5);
}

}  // namespace
}  // namespace compression
}  // namespace concord
