// A job of real Engines (ranks as threads) for the engine's device-path tests: a CPU world on the
// in-process CPU backend, a fake device world (tests/unit/inproc_device.h) and, when asked, TCP
// point-to-point transports (tests/unit/tcp_p2p_mesh.h).
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
#include "tests/unit/tcp_p2p_mesh.h"

namespace concord {
namespace device_testing {

using std::chrono::milliseconds;

constexpr int kGpu = 1;  // the fake device every rank's tensors live on (devices 0 and 1 exist)

// A job whose engines have a CPU world and, unless `with_device` is false, a fake device world
// (collectives complete `delay` after the last rank launched them); with `with_p2p`, point to
// point over TCP.
class DeviceJob {
 public:
  DeviceJob(int size, milliseconds delay, const std::function<void(Config&)>& tweak = nullptr,
            bool with_device = true, bool with_p2p = false)
      : devices_(std::make_shared<InProcDeviceWorld>(size, delay)),
        p2p_(with_p2p ? TcpP2pMesh(size) : std::vector<std::unique_ptr<P2pTransport>>()),
        job_(
            size, tweak, milliseconds(20000),
            [this, with_device](int r) {
              DevicePlane plane;
              if (with_device) {
                plane.backend = devices_->MakeBackend(r, kGpu);
                plane.unavailable = Status::Ok();
              } else {
                plane.unavailable = Status(Code::kUnavailable, "no GPU here (test)");
              }
              return plane;
            },
            [this](int r) {
              return r < static_cast<int>(p2p_.size()) ? std::move(p2p_[r]) : nullptr;
            }) {}
  int size() const { return job_.size(); }
  Engine& operator[](int rank) { return job_[rank]; }
  InProcWorld& world() { return job_.world(); }
  InProcDeviceWorld& devices() { return *devices_; }

 private:
  // Declared first: the device world outlives the engines, which the job destroys.
  std::shared_ptr<InProcDeviceWorld> devices_;
  std::vector<std::unique_ptr<P2pTransport>> p2p_;  // handed to the engines as they are made
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
