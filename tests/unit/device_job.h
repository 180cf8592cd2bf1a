// A job of real Engines (ranks as threads) for the engine's device-path tests: a CPU world on the
// in-process CPU backend and a fake device world (tests/unit/inproc_device.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/engine.h"
#include "tests/unit/engine_test_util.h"
#include "tests/unit/inproc_device.h"
#include "tests/unit/inproc_transport.h"

namespace concord {
namespace device_testing {

using std::chrono::milliseconds;

constexpr int kGpu = 1;  // the fake device every rank's tensors live on (devices 0 and 1 exist)

// A job whose engines have a CPU world and, unless `with_device` is false, a fake device world
// (collectives complete `delay` after the last rank launched them).
class DeviceJob {
 public:
  DeviceJob(int size, milliseconds delay, const std::function<void(Config&)>& tweak = nullptr,
            bool with_device = true)
      : devices_(std::make_shared<InProcDeviceWorld>(size, delay)),
        job_(size, tweak, milliseconds(20000), [this, with_device](int r) {
          DevicePlane plane;
          if (with_device) {
            plane.backend = devices_->MakeBackend(r, kGpu);
            plane.unavailable = Status::Ok();
          } else {
            plane.unavailable = Status(Code::kUnavailable, "no GPU here (test)");
          }
          return plane;
        }) {}
  int size() const { return job_.size(); }
  Engine& operator[](int rank) { return job_[rank]; }
  InProcWorld& world() { return job_.world(); }
  InProcDeviceWorld& devices() { return *devices_; }

 private:
  // Declared first: the device world outlives the engines, which the job destroys.
  std::shared_ptr<InProcDeviceWorld> devices_;
  engine_testing::Job job_;
};

// engine_testing::Request on a device (the GPU unless told).
inline TensorRequest Request(const std::string& name, OpType op, DType dtype,
                             std::vector<int64_t> shape, int device = kGpu) {
  TensorRequest r = engine_testing::Request(name, op, dtype, std::move(shape));
  r.device = device;
  return r;
}

}  // namespace device_testing
}  // namespace concord
