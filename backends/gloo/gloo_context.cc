#include "backends/gloo/gloo_context.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/ibverbs/device.h>
#include <gloo/transport/tcp/device.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

namespace concord {
namespace gloo_internal {
namespace {

// gloo::rendezvous::Store over a Concord Store, for the duration of one connectFullMesh. Keys are
// prefixed; get() and wait() block until the key exists or the timeout passes. Gloo only sees
// exceptions, so the adapter throws gloo::IoException and keeps the Status that caused it for
// ConnectGloo to return instead. Not owned by Gloo; used by one thread.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(concord::Store* store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(prefix_ + key, std::string(data.begin(), data.end())));
  }

  std::vector<char> get(const std::string& key) override {
    StatusOr<std::string> value = store_->Get(prefix_ + key, Deadline::After(timeout_));
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& key : keys) full.push_back(prefix_ + key);
    const auto limit = timeout == gloo::kNoTimeout ? timeout_ : std::min(timeout, timeout_);
    Check(store_->Wait(full, Deadline::After(limit)));
  }

  const Status& error() const { return error_; }

 private:
  void Check(const Status& status) {
    if (status.ok()) return;
    error_ = status;
    throw gloo::IoException("rendezvous store: " + status.ToString());
  }

  concord::Store* const store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
  Status error_;
};

bool MentionsTimeout(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text.find("timeout") != std::string::npos || text.find("timed out") != std::string::npos;
}

// The RDMA devices libibverbs lists (empty when it lists none or fails).
std::vector<std::string> IbverbsDeviceNames() {
  try {
    return gloo::transport::ibverbs::getDeviceNames();
  } catch (...) {
    return {};
  }
}

}  // namespace

Status CheckTransportAvailable(GlooTransport transport) {
  if (transport == GlooTransport::kTcp || !IbverbsDeviceNames().empty()) return Status::Ok();
  struct stat st;
  const bool sysfs = stat("/sys/class/infiniband", &st) == 0;
  return Status(Code::kUnavailable,
                std::string("gloo-ibverbs: no RDMA device: libibverbs lists none (") +
                    (sysfs ? "/sys/class/infiniband has no usable device"
                           : "/sys/class/infiniband does not exist") +
                    "); this transport needs an InfiniBand HCA or a RoCE NIC with its kernel "
                    "driver and rdma-core; use CONCORD_BACKEND=gloo for TCP");
}

Status CurrentExceptionToStatus(const std::string& operation) {
  std::string what;
  try {
    throw;
  } catch (const gloo::EnforceNotMet& e) {
    what = e.msg();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  const Code code = MentionsTimeout(what) ? Code::kTimeout : Code::kBackendError;
  return Status(code, "gloo " + operation + " failed: " + what);
}

StatusOr<std::shared_ptr<GlooContext>> ConnectGloo(const GlooConnectOptions& options,
                                                   Store* store) {
  if (store == nullptr) return InvalidArgument("gloo: store is null");
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return InvalidArgument("gloo: rank " + std::to_string(options.rank) +
                           " out of range for size " + std::to_string(options.size));
  }
  if (options.timeout.count() <= 0) return InvalidArgument("gloo: timeout must be positive");
  CONCORD_RETURN_IF_ERROR(CheckTransportAvailable(options.transport));
  StoreAdapter adapter(store, options.prefix + "/gloo/", options.timeout);
  try {
    std::shared_ptr<gloo::transport::Device> device;
    if (options.transport == GlooTransport::kIbverbs) {
      gloo::transport::ibverbs::attr attr;
      attr.name = IbverbsDeviceNames().front();
      attr.port = 1;
      attr.index = 0;
      device = gloo::transport::ibverbs::CreateDevice(attr);
    } else {
      gloo::transport::tcp::attr attr;
      if (!options.iface.empty()) {
        attr.iface = options.iface;
      } else {
        attr.hostname = options.host.empty() ? "127.0.0.1" : options.host;
      }
      device = gloo::transport::tcp::CreateDevice(attr);
    }
    auto context = std::make_shared<GlooContext>(options.rank, options.size);
    context->setTimeout(options.timeout);
    context->connectFullMesh(adapter, device);
    return context;
  } catch (...) {
    Status status = CurrentExceptionToStatus("connect (rank " + std::to_string(options.rank) +
                                             " of " + std::to_string(options.size) + ")");
    if (!adapter.error().ok()) return adapter.error().WithContext("gloo connect");
    return status;
  }
}

}  // namespace gloo_internal
}  // namespace concord
