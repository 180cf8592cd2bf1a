#include "backends/gloo/gloo_context.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/context.h>
#include <gloo/transport/ibverbs/device.h>
#include <gloo/transport/tcp/device.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <mutex>
#include <thread>
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

// While a mesh's pairs connect: calls `give_up` every GlooContext::kGiveUpCheck on a thread of
// its own until Stop(). Its first failure is kept (failure()) and closes the pair being connected
// (Connecting()), which ends that connect (Gloo's pair sees itself closed, or its peer refuses
// it); Connecting() refuses to start another. Stop() (also at destruction) joins the thread.
// Thread-safe.
class GiveUpWatch {
 public:
  GiveUpWatch(const std::function<Status()>& give_up, gloo::transport::Context* pairs)
      : give_up_(give_up), pairs_(pairs) {
    if (give_up_) thread_ = std::thread([this] { Run(); });
  }
  ~GiveUpWatch() { Stop(); }
  // The pair to `peer` connects next: false once the watch has failed.
  bool Connecting(int peer) {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = peer;
    return failure_.ok();
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  Status failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, GlooContext::kGiveUpCheck, [this] { return stopped_; })) {
      lock.unlock();
      Status failed = give_up_();
      lock.lock();
      if (failed.ok() || stopped_) continue;
      failure_ = failed;
      if (current_ >= 0) pairs_->getPair(current_)->close();
      return;
    }
  }

  const std::function<Status()>& give_up_;
  gloo::transport::Context* const pairs_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;  // guarded by mu_, as the next two
  int current_ = -1;
  Status failure_;
  std::thread thread_;
};

// The store key of `from`'s end of its pair with `to` (GlooContext::ConnectFullMesh).
std::string PairKey(int from, int to) {
  return std::to_string(from) + "/" + std::to_string(to);
}

}  // namespace

void GlooContext::ConnectFullMesh(gloo::rendezvous::Store& store,
                                  const std::shared_ptr<gloo::transport::Device>& device,
                                  const std::function<Status()>& give_up, Status* gave_up) {
  std::shared_ptr<gloo::transport::Context> pairs = device->createContext(rank, size);
  pairs->setTimeout(getTimeout());
  // Each pair's address under a key of its own ("3/5": rank 3's end of its pair with rank 5), so a
  // rank fetches only the size - 1 addresses meant for it. Gloo's connectFullMesh publishes one
  // key per rank holding all its addresses, which every peer fetches whole: size^3 addresses
  // through the store (at 512 ranks about 18 GB, through the one server).
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    store.set(PairKey(rank, peer), pairs->createPair(peer)->address().bytes());
  }
  GiveUpWatch watch(give_up, pairs.get());
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::vector<char> address = store.get(PairKey(peer, rank));  // waits for it
    if (!watch.Connecting(peer)) break;
    pairs->getPair(peer)->connect(address);
  }
  watch.Stop();
  // Also when the pair the watch closed returned as if connected.
  if (Status failed = watch.failure(); !failed.ok()) {
    *gave_up = failed;
    throw gloo::IoException(failed.ToString());
  }
  device_ = device;
  transportContext_ = std::move(pairs);
}

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
  Status gave_up;
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
    context->ConnectFullMesh(
        adapter, device, [store] { return store->GiveUp(); }, &gave_up);
    return context;
  } catch (...) {
    Status status = CurrentExceptionToStatus("connect (rank " + std::to_string(options.rank) +
                                             " of " + std::to_string(options.size) + ")");
    if (!gave_up.ok()) return gave_up;
    if (!adapter.error().ok()) return adapter.error().WithContext("gloo connect");
    return status;
  }
}

}  // namespace gloo_internal
}  // namespace concord
