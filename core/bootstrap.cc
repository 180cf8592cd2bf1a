#include "core/bootstrap.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "backends/tcp_control_plane.h"
#include "base/digest.h"
#include "base/mutex.h"
#include "core/device_setup.h"
#include "core/job_settings.h"
#include "core/lane_backends.h"
#include "rendezvous/file_store.h"
#include "rendezvous/hash_store.h"
#include "rendezvous/store_factory.h"
#include "rendezvous/tcp_store.h"

namespace concord {

// Everything the transports need to outlive them.
struct Rendezvous {
  std::unique_ptr<TcpStoreServer> server;  // torchrun mode, rank 0 only
  std::unique_ptr<Store> store;
};

namespace {

// A failure elsewhere as a communicator's start sees it: `failure`'s error, explained by `what`,
// until Stop() (the start is over: what `failure` looks at may go before the communicator, which
// keeps copies of this watch in its store and options). With a `failure_key`, `failure` fails
// only once that key exists in the store that the watched waits use (where a rank publishes that
// its start failed): those waits then wait for it in the store beside their own keys, and never
// look in between (WatchedStore). Thread-safe.
class StartWatch {
 public:
  StartWatch(std::function<Status()> failure, std::string what, std::string failure_key = "")
      : failure_(std::move(failure)),
        what_(std::move(what)),
        failure_key_(std::move(failure_key)) {}
  Status Failed() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (!failure_) return Status::Ok();
    const Status failed = failure_();
    if (failed.ok()) return failed;
    return Status(failed.code(), what_ + failed.message());
  }
  void Stop() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    failure_ = nullptr;
  }
  bool Watching() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return static_cast<bool>(failure_);
  }
  const std::string& failure_key() const { return failure_key_; }

 private:
  Mutex mu_;
  std::function<Status()> failure_ GUARDED_BY(mu_);
  const std::string what_;
  const std::string failure_key_;
};

// How long a rank whose start ended on a peer's closed connection waits for a published failure
// that explains it (StartFailures::AwaitExplanation). A rank that dies publishes nothing: its
// peers' errors come this much later, naming it.
constexpr std::chrono::milliseconds kPublishGrace{250};

// What a sub-communicator's start error says before the parent's failure, when that ended it.
constexpr char kParentFailed[] = "the parent communicator failed while this one started: ";

// Whether a failed start may be the work of another rank, one that died (a sub-communicator's
// parent then learns of the death within moments, through its own connections) or failed its own
// start (StartFailures): a connection lost or cut short, a wait that timed out. A setting the
// start refused (kInvalidArgument: CONCORD_SHM = on over ranks of several hosts, say), a feature
// that cannot start here (kUnavailable), a wrong secret or a bug: no other rank explains them,
// and no wait changes them.
bool MayBeAMembersDeath(Code code) {
  switch (code) {
    case Code::kTimeout:
    case Code::kPeerFailure:
    case Code::kBackendError:
    case Code::kSystemError:
    case Code::kProtocolError:
      return true;
    default:
      return false;
  }
}

bool EndsWith(const std::string& text, size_t end, const std::string& suffix) {
  return end >= suffix.size() && text.compare(end - suffix.size(), suffix.size(), suffix) == 0;
}

// A sub-communicator's start error with " (world rank W)" after each "rank R" that names one of
// its ranks (R in [0, world_ranks.size())), so that it says which process: its own ranks are not
// the job's. Not after "local rank R", "parent rank R" or "world rank R", nor in the parent's
// failure (after kParentFailed), which names the parent's own ranks.
Status NameWorldRanks(const Status& error, const std::vector<int>& world_ranks) {
  const std::string& text = error.message();
  const size_t own_end = std::min(text.find(kParentFailed), text.size());
  const std::string kRank = "rank ";
  std::string named;
  size_t copied = 0;
  for (size_t at = text.find(kRank); at < own_end; at = text.find(kRank, at + kRank.size())) {
    const size_t digits = at + kRank.size();
    size_t end = digits;
    while (end < own_end && end - digits < 9 &&
           std::isdigit(static_cast<unsigned char>(text[end]))) {
      ++end;
    }
    if (end == digits || (at > 0 && std::isalnum(static_cast<unsigned char>(text[at - 1]))) ||
        EndsWith(text, at, "local ") || EndsWith(text, at, "parent ") ||
        EndsWith(text, at, "world ")) {
      continue;
    }
    const size_t rank = std::stoul(text.substr(digits, end - digits));
    if (rank >= world_ranks.size()) continue;
    named += text.substr(copied, end - copied) + " (world rank " +
             std::to_string(world_ranks[rank]) + ")";
    copied = end;
  }
  if (copied == 0) return error;
  return Status(error.code(), named + text.substr(copied));
}

// Stops a StartWatch when the start it serves ends, however it ends.
class StopAtExit {
 public:
  explicit StopAtExit(std::shared_ptr<StartWatch> watch) : watch_(std::move(watch)) {}
  ~StopAtExit() { watch_->Stop(); }
  StopAtExit(const StopAtExit&) = delete;
  StopAtExit& operator=(const StopAtExit&) = delete;

 private:
  const std::shared_ptr<StartWatch> watch_;
};

// A starting communicator's view of a store (its parent's, or its own rendezvous): its waits
// (GetFirst, and Get and Wait through it) fail with the watch's failure while it runs (a member
// that died, or whose start failed, will never write its keys). A watch with a failure key waits
// for that key in the store beside the caller's, in one request for the whole wait; any other
// watch is looked at after each kParentCheck of waiting (and when the caller's own deadline
// passes). Set and Add pass through, and so do the waits once the watch has stopped (the start is
// over); GiveUp() is the wrapped store's, then the watch's failure. Thread-safe as the store it
// wraps.
class WatchedStore : public Store {
 public:
  WatchedStore(std::shared_ptr<Rendezvous> parent, std::shared_ptr<StartWatch> watch)
      : parent_(std::move(parent)), watch_(std::move(watch)) {}

  Status Set(const std::string& key, const std::string& value) override {
    return parent_->store->Set(key, value);
  }
  StatusOr<std::string> Get(const std::string& key, Deadline deadline) override {
    CONCORD_ASSIGN_OR_RETURN(FoundKey found, GetFirst({key}, deadline));
    return std::move(found.value);
  }
  Status Wait(const std::vector<std::string>& keys, Deadline deadline) override {
    if (!watch_->Watching()) return parent_->store->Wait(keys, deadline);
    for (const std::string& key : keys) CONCORD_RETURN_IF_ERROR(GetFirst({key}, deadline).status());
    return Status::Ok();
  }
  StatusOr<FoundKey> GetFirst(const std::vector<std::string>& keys, Deadline deadline) override {
    if (!watch_->Watching()) return parent_->store->GetFirst(keys, deadline);
    std::vector<std::string> awaited = keys;
    const bool on_key = !watch_->failure_key().empty();
    if (on_key) awaited.push_back(watch_->failure_key());
    for (;;) {
      StatusOr<FoundKey> found = parent_->store->GetFirst(
          awaited, on_key ? deadline : deadline.Earlier(Deadline::After(kParentCheck)));
      if (found.ok() && found->index < keys.size()) return found;
      if (!found.ok() && found.status().code() != Code::kTimeout) return found;
      // The failure key appeared, or a slice passed. Also when the caller's own deadline has
      // passed: a caller that waits in short slices itself (the shared-memory set-up) would
      // otherwise never see the failure.
      CONCORD_RETURN_IF_ERROR(watch_->Failed());
      if (found.ok()) return parent_->store->GetFirst(keys, deadline);  // stopped meanwhile
      if (deadline.passed()) return TimeoutError(NoKeyAppearedMessage(keys));
    }
  }
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return parent_->store->Add(key, delta);
  }
  // For the waits outside the store (Gloo's pair connections).
  Status GiveUp() override {
    CONCORD_RETURN_IF_ERROR(parent_->store->GiveUp());
    return watch_->Failed();
  }

 private:
  const std::shared_ptr<Rendezvous> parent_;  // kept: the engine outlives the start
  const std::shared_ptr<StartWatch> watch_;
};

// The failures of a communicator's start, kept in the store under `<prefix>/failed`. Before the
// failing rank's control-plane connection is made (rank 0's metrics port in use, its control plane
// unable to bind, another rank's settings differing from rank 0's), the others cannot learn of it
// through the control plane: waiting for keys that will never come (rank 0's settings and address)
// or, rank 0, for connections, they look here and fail within kParentCheck naming the rank and
// why, instead of waiting out the timeout. After it (a listener that cannot bind), the others learn
// of it through the control plane, and the failing rank publishes before its connections close
// (StartOnStore), so that their errors lead with the cause, not with the close they saw; a rank
// whose start ended on a peer's closed connection (kPeerFailure) publishes nothing and waits up to
// kPublishGrace for the cause instead (AwaitExplanation). The first failure published stays (a rank
// that fails after it does not overwrite it; only two that fail at the same moment may both write
// it, and the last one stays), and every other rank's failed start, however it ended, is told as
// its consequence (Explain). The key is this start's alone: the next start, a retried init or
// another split too, has a prefix of its own. `rank` is this rank's in the communicator that
// starts (a sub-communicator's errors name the world ranks later: NameWorldRanks). Thread-safe; a
// start's waits call Published() from other threads (Gloo's, the store's).
class StartFailures {
 public:
  StartFailures(std::shared_ptr<Rendezvous> rv, const std::string& prefix, int rank)
      : rv_(std::move(rv)), key_(prefix + "/failed"), rank_(rank) {}

  // Where a failure is published.
  const std::string& key() const { return key_; }

  // OK while no rank has published a failure; else kPeerFailure, "rank R failed to start: CODE:
  // its error". Looks once, without waiting. A store that fails is that error.
  Status Published() {
    CONCORD_ASSIGN_OR_RETURN(const std::optional<std::string> failure, Read());
    if (!failure) return Status::Ok();
    return Status(Code::kPeerFailure, *failure);
  }

  // Where another rank has published its failure: `failed` (this rank's start error) told with
  // it. This start ended on it (seen in a wait: the published failure alone, kPeerFailure), or on
  // what it may have caused (a lost or refused connection, a timeout: rank 0 failed with it and
  // closed its connections, its listener too, before this rank connected): kPeerFailure, the
  // published failure, then this rank's own error. A failure of this rank's own (its metrics port
  // in use, its timeline file, a setting that differs: no peer's failure causes those) keeps its
  // code and comes first, the published one after it. None while nothing is published, or where
  // the store cannot say.
  std::optional<Status> Explain(const Status& failed) {
    StatusOr<std::optional<std::string>> published = Read();
    if (!published.ok() || !*published) return std::nullopt;
    return AsConsequence(failed, **published);
  }

  // Explain(failed) once a failure is published, looking every kPublishCheck until `grace` has
  // passed; else `failed`. For an error that a peer's closed connection caused (kPeerFailure): a
  // rank whose start fails after its control plane is up publishes before its connections close
  // (StartOnStore), so its failure is there at once; one whose control plane failed publishes
  // just after they closed.
  Status AwaitExplanation(const Status& failed, std::chrono::milliseconds grace) {
    const Deadline deadline = Deadline::After(grace);
    for (;;) {
      if (std::optional<Status> explained = Explain(failed)) return *explained;
      if (deadline.passed()) return failed;
      std::this_thread::sleep_for(kPublishCheck);
    }
  }

  // Explain(failed) where a failure is published already; else publishes this rank's own
  // `failed` for the others and returns it (where the store refuses, the error says that the
  // others wait out the timeout). For a start that failed before this rank's control plane was
  // up; after that, the others learn of it through the control plane.
  Status Tell(const Status& failed) {
    StatusOr<std::optional<std::string>> published = Read();
    if (published.ok() && *published) return AsConsequence(failed, **published);
    const Status told = published.ok()
                            ? rv_->store->Set(key_, "rank " + std::to_string(rank_) +
                                                        " failed to start: " + failed.ToString())
                            : published.status();
    if (told.ok()) return failed;
    return Status(failed.code(), failed.message() +
                                     " (and telling the other ranks failed, so they wait out "
                                     "the timeout: " +
                                     told.ToString() + ")");
  }

 private:
  // The failure published so far, if any.
  StatusOr<std::optional<std::string>> Read() {
    StatusOr<std::string> failure = rv_->store->Get(key_, Deadline::After(kNoWait));
    if (failure.ok()) return std::optional<std::string>(std::move(*failure));
    if (failure.status().code() == Code::kTimeout) return std::optional<std::string>();
    return failure.status();
  }

  static Status AsConsequence(const Status& failed, const std::string& published) {
    if (failed.message().find(published) != std::string::npos) {
      return Status(Code::kPeerFailure, published);
    }
    if (!MayBeAMembersDeath(failed.code())) {
      return Status(failed.code(), failed.message() + " (" + published + " too)");
    }
    return Status(Code::kPeerFailure,
                  published + " (this rank's start failed after it: " + failed.ToString() + ")");
  }

  static constexpr std::chrono::milliseconds kNoWait{0};
  static constexpr std::chrono::milliseconds kPublishCheck{10};
  const std::shared_ptr<Rendezvous> rv_;
  const std::string key_;
  const int rank_;
};

// CONCORD_TIMELINE's file for this rank, opened before any peer is involved, so that a path that
// cannot be written fails this rank's init at once (StartLocally); none when it is not set.
StatusOr<std::optional<TimelineFile>> OpenConfiguredTimeline(const Config& config) {
  if (config.timeline.empty()) return std::optional<TimelineFile>();
  CONCORD_ASSIGN_OR_RETURN(TimelineFile file, OpenTimelineFile(config.timeline, config.rank,
                                                               config.SourceOf("timeline")));
  return std::optional<TimelineFile>(std::move(file));
}

// The first IPv4 address of a network interface.
StatusOr<std::string> InterfaceAddress(const std::string& iface) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return ErrnoError("getifaddrs", errno);
  std::string found;
  for (struct ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || iface != a->ifa_name) {
      continue;
    }
    char text[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const struct sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) {
      found = text;
      break;
    }
  }
  freeifaddrs(list);
  if (found.empty()) {
    return InvalidArgument("network interface '" + iface +
                           "' does not exist or has no IPv4 address");
  }
  return found;
}

bool IsLoopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The one-host file store's directory is /tmp/concord-UID-JOBID, the job id encoded: well under
// NAME_MAX (255).
constexpr size_t kMaxJobIdComponent = 200;

StatusOr<std::unique_ptr<Rendezvous>> OpenRendezvous(const Config& c, Deadline deadline,
                                                     std::string* store_host) {
  auto rv = std::make_unique<Rendezvous>();
  // The store's Set and Add (which take no deadline) wait as long as the job's other waits.
  const std::chrono::milliseconds op_timeout = MillisFromSeconds(c.timeout_s);
  if (!c.store.empty()) {
    CONCORD_ASSIGN_OR_RETURN(rv->store, OpenStore(c.store, c.token, deadline, op_timeout));
    if (c.store.rfind("tcp://", 0) == 0) {
      std::string host;
      int port = 0;
      if (net::SplitHostPort(c.store.substr(6), &host, &port).ok()) *store_host = host;
    }
    return rv;
  }
  if (c.size == 1) {
    rv->store = std::make_unique<HashStore>();
    return rv;
  }
  if (!c.master_addr.empty() && c.master_port > 0) {
    // torchrun: its own store already holds MASTER_PORT, so rank 0 serves ours one port above.
    const int port = c.master_port + 1;
    const std::string token = c.token.empty() ? c.job_id : c.token;
    if (c.rank == 0) {
      const std::string bind = IsLoopback(c.master_addr) ? "127.0.0.1" : "0.0.0.0";
      auto server = TcpStoreServer::Start(bind, port, token);
      if (!server.ok()) {
        return server.status().WithContext("serving the rendezvous store on MASTER_PORT+1 (" +
                                           std::to_string(port) + ")");
      }
      rv->server = std::move(*server);
    }
    // Rank 0 may not be listening yet: retry a refused connection until the deadline. A wrong
    // token, or an answer that is not the store's (another service holds the port), will not
    // change: they fail at once.
    for (;;) {
      auto store = TcpStore::Connect(c.master_addr, port, token, deadline, op_timeout);
      if (store.ok()) {
        rv->store = std::move(*store);
        break;
      }
      const Code code = store.status().code();
      if (code == Code::kProtocolError) {
        return store.status().WithContext(
            "MASTER_PORT+1 (" + c.master_addr + ":" + std::to_string(port) +
            ") answers, but not as Concord's rendezvous store: is another service using it?");
      }
      if (code == Code::kAuthFailed || deadline.passed()) {
        return store.status().WithContext("the rendezvous store of rank 0 on MASTER_PORT+1");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    *store_host = c.master_addr;
    return rv;
  }
  if (c.local_size == c.size && c.job_id != "default") {
    // mpirun or srun on one host: a file store private to this job, at a path anyone could
    // guess, so one another user made first is refused. The job id is one path component ('/'
    // and other bytes encoded), and a short one.
    const std::string name = FileStore::EncodeName(c.job_id);
    if (name.size() > kMaxJobIdComponent) {
      return InvalidArgument("the job id (" + std::to_string(c.job_id.size()) +
                             " bytes) is too long to name the one-host file store's directory "
                             "(at most " +
                             std::to_string(kMaxJobIdComponent) +
                             " bytes, '/' and bytes other than [A-Za-z0-9._-] counting 3): set a "
                             "shorter CONCORD_JOB_ID, or CONCORD_STORE");
    }
    const std::string dir = "/tmp/concord-" + std::to_string(getuid()) + "-" + name;
    CONCORD_ASSIGN_OR_RETURN(rv->store,
                             FileStore::Create(dir, op_timeout, FileStore::Access::kPrivate));
    return rv;
  }
  return InvalidArgument(
      "no rendezvous for " + std::to_string(c.size) +
      " ranks: start the job with concordrun, set CONCORD_STORE (tcp://host:port or file:///dir), "
      "or set MASTER_ADDR and MASTER_PORT as torchrun does");
}

// CONCORD_BACKEND=mpi (or auto under mpirun): rank and size are MPI_COMM_WORLD's, negotiation and
// data both run over MPI, and there is no store. `config` is as read, before Finalize().
StatusOr<Communicator> CreateMpiCommunicator(Config config, std::chrono::milliseconds timeout) {
  const auto built = BuiltBackends();
  if (std::find(built.begin(), built.end(), "mpi") == built.end()) {
    return CreateMpiTransports(timeout).status().WithContext("CONCORD_BACKEND=mpi");
  }
  if (!config.mpi_launched) {
    return Status(Code::kUnavailable,
                  "CONCORD_BACKEND=mpi needs a job started by mpirun (neither "
                  "OMPI_COMM_WORLD_SIZE nor PMIX_RANK is set): run it with mpirun -np N or "
                  "concordrun --backend mpi");
  }
  auto transports = CreateMpiTransports(timeout);
  if (!transports.ok()) return transports.status().WithContext("starting the mpi backend");
  MpiTransports& t = *transports;
  if ((config.rank != -1 && config.rank != t.rank) ||
      (config.size != -1 && config.size != t.size)) {
    return InvalidArgument("the environment says rank " + std::to_string(config.rank) + " of " +
                           std::to_string(config.size) + ", MPI_COMM_WORLD says rank " +
                           std::to_string(t.rank) + " of " + std::to_string(t.size));
  }
  config.rank = t.rank;
  config.size = t.size;
  // One lane: Open MPI progresses its own collectives, and a second lane would need a second
  // communicator driven from another thread (MPI_THREAD_MULTIPLE).
  config.lanes = 1;
  CONCORD_RETURN_IF_ERROR(config.Finalize());
  CONCORD_RETURN_IF_ERROR(CheckJobSettings(config, t.backend.get()));
  // The communicator's name, rank 0's draw: its sub-communicators' names extend it, and MPI tells
  // those started at once apart by their names' digests (CreateMpiTransports), also those of
  // another communicator started over MPI_COMM_WORLD in this job.
  uint64_t name = 0;
  if (config.rank == 0) {
    std::random_device random;
    name = (static_cast<uint64_t>(random()) << 32) ^ random();
  }
  CONCORD_RETURN_IF_ERROR(t.backend->Broadcast(&name, sizeof(name), 0));
  CONCORD_ASSIGN_OR_RETURN(MetricsEndpoint metrics, OpenMetricsEndpoint(config));
  CONCORD_ASSIGN_OR_RETURN(std::optional<TimelineFile> timeline, OpenConfiguredTimeline(config));
  std::vector<std::unique_ptr<Backend>> lanes;
  lanes.push_back(std::move(t.backend));
  Communicator comm;
  comm.origin = std::make_shared<CommOrigin>();
  comm.origin->prefix = "mpi/" + std::to_string(name);
  for (int r = 0; r < t.size; ++r) comm.origin->world_ranks.push_back(r);
  comm.engine =
      std::make_unique<Engine>(config, std::move(t.control), std::move(lanes),
                               std::move(t.keep_alive), MpiDevicePlane(config), std::move(t.p2p));
  comm.engine->ServeMetrics(std::move(metrics));
  if (timeline) {
    const std::optional<ClockOffset> clock = comm.engine->MeasureClockOffset();
    CONCORD_RETURN_IF_ERROR(comm.engine->StartTimeline(std::move(*timeline), clock));
  }
  return comm;
}

// A peer that dies mid-collective must be an error on this rank (EPIPE), not a kill: Gloo writes
// to its sockets without MSG_NOSIGNAL, from whichever thread runs the collective (the
// application's too). So SIGPIPE is ignored, unless the application installed a handler of its
// own (README.md, "Launching": signals).
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

// The transports of a communicator on the rendezvous store `rv` under `prefix`, and its engine,
// once the job settings are checked (CheckJobSettings). `host` is the address its control plane
// advertises. `others_failed` (a world's: the failures other ranks published, StartFailures; a
// sub-communicator's: its parent's failure, then those) ends the waits for the others'
// control-plane and point-to-point connections with the failure it returns. `control_plane_up` (if
// set) is called once this rank's control plane is up: rank 0's has every rank's connection,
// another rank's its connection to rank 0. From then on, a peer it loses ends every later wait of
// the start too: a rank whose start failed has closed its connections, so rank 0 learns of it at
// once, fails its own start and closes its connections, and so every other rank learns of it,
// instead of waiting out the timeout for keys and connections that will never come.
// `publish_own` (if set) is called with a failure after that which is not a peer's (not
// kPeerFailure: a listener that cannot bind, a refused connection, a timeout) while every
// connection of this rank is still open, and its result is returned: so a failure it publishes
// (StartFailures::Tell) is in the store before any peer can see this rank's connections close,
// and the others' errors, consequences of that close, can lead with it.
StatusOr<std::unique_ptr<Engine>> StartOnStore(
    const Config& config, const std::shared_ptr<Rendezvous>& rv, const std::string& prefix,
    const std::string& host, const std::function<Status()>& others_failed = {},
    const std::function<void()>& control_plane_up = {},
    const std::function<Status(const Status&)>& publish_own = {}) {
  const std::string backend_name = config.ResolvedBackend();
  const auto timeout = MillisFromSeconds(config.timeout_s);
  const Deadline deadline = Deadline::After(timeout);
  TcpControlPlaneOptions cp;
  cp.rank = config.rank;
  cp.size = config.size;
  cp.host = host;
  cp.prefix = prefix;
  cp.connect_timeout = timeout;
  cp.liveness_timeout = timeout;
  cp.give_up = others_failed;
  auto control = StartTcpControlPlane(cp, rv->store.get());
  if (!control.ok()) return control.status().WithContext("connecting the control plane");
  if (control_plane_up) control_plane_up();
  TcpControlPlane* plane = control->get();
  auto watch = std::make_shared<StartWatch>(
      [plane] { return plane->PeerFailure(); },
      "a rank stopped while this communicator started (its own error says why): ");
  const StopAtExit stop_watch(watch);  // before `control` goes, on every path
  auto watched = std::make_shared<Rendezvous>();
  watched->store = std::make_unique<WatchedStore>(rv, watch);
  Store* store = watched->store.get();

  BackendOptions bo;
  bo.rank = config.rank;
  bo.size = config.size;
  bo.iface = config.iface;
  bo.host = host;
  bo.prefix = prefix + "/" + backend_name;
  bo.timeout = timeout;
  bo.algorithm = config.gloo_algorithm;
  bo.give_up = [others_failed, watch]() -> Status {
    if (others_failed) CONCORD_RETURN_IF_ERROR(others_failed());
    return watch->Failed();
  };
  // Every error below returns through `failed`, which runs before `control` and the transports
  // made so far are destroyed.
  const auto failed = [&publish_own](const Status& error) {
    return publish_own && error.code() != Code::kPeerFailure ? publish_own(error) : error;
  };
  StatusOr<std::vector<std::unique_ptr<Backend>>> lanes =
      CreateLaneBackends(config, bo, store, prefix, deadline);
  if (!lanes.ok()) return failed(lanes.status());
  // CUDA tensors: the device backend CONCORD_BACKEND asks for (core/device_setup.h).
  StatusOr<DevicePlane> device = StartDevicePlane(config, bo, store, deadline);
  if (!device.ok()) return failed(device.status());
  // Sends and recvs: connections of their own between every pair of ranks (core/p2p.h). One
  // rank has no peer to send to: no transport.
  std::unique_ptr<P2pTransport> p2p;
  if (config.size > 1) {
    BackendOptions p2p_options = bo;
    p2p_options.prefix = prefix + "/p2p";
    // Large messages between ranks of one host are read from the sender's memory, as the
    // shared-memory allreduces' (CONCORD_SHM, CONCORD_SHM_DIRECT_THRESHOLD).
    P2pDirectReads direct;
    if (config.shm != "off" && config.shm_direct_threshold_bytes >= 0) {
      direct.host_identity = ShmHostIdentity(config.host_id);
      direct.min_bytes = static_cast<uint64_t>(config.shm_direct_threshold_bytes);
    }
    auto made = CreateTcpP2pTransport(p2p_options, store, direct);
    if (!made.ok()) {
      return failed(made.status().WithContext("connecting the point-to-point transport"));
    }
    p2p = std::move(*made);
  }
  // The transports keep `store` (the NCCL backend waits in it at its first collective): the
  // engine keeps it alive; the watch has stopped by then, so it passes through.
  return std::make_unique<Engine>(config, std::move(*control), std::move(*lanes), watched,
                                  std::move(*device), std::move(p2p));
}

// What a rank's start needs that involves no peer, made first, so that what fails on this rank
// alone (a metrics port in use, a timeline file that cannot be written, an interface without an
// address) fails at once.
struct LocalStart {
  MetricsEndpoint metrics;
  std::optional<TimelineFile> timeline;
  std::string iface_address;  // CONCORD_IFACE's, when it gives the address to advertise
};

StatusOr<LocalStart> StartLocally(const Config& config) {
  LocalStart local;
  CONCORD_ASSIGN_OR_RETURN(local.metrics, OpenMetricsEndpoint(config));
  CONCORD_ASSIGN_OR_RETURN(local.timeline, OpenConfiguredTimeline(config));
  if (config.host.empty() && !config.iface.empty()) {
    CONCORD_ASSIGN_OR_RETURN(local.iface_address, InterfaceAddress(config.iface));
  }
  return local;
}

// Whether OpenRendezvous opens rank 0's own store (torchrun's MASTER_ADDR and MASTER_PORT), which
// the others reach only once rank 0 serves it.
bool StoreIsRankZeros(const Config& c) {
  return c.store.empty() && c.size > 1 && !c.master_addr.empty() && c.master_port > 0;
}

}  // namespace

StatusOr<Communicator> CreateCommunicator(Config config) {
  IgnoreSigpipeUnlessHandled();
  {
    Config checked = config;  // validates every field before anything starts
    CONCORD_RETURN_IF_ERROR(checked.Finalize());
    const auto timeout = MillisFromSeconds(checked.timeout_s);
    if (checked.ResolvedBackend() == "mpi")
      return CreateMpiCommunicator(std::move(config), timeout);
    config = std::move(checked);
  }
  StatusOr<LocalStart> local = StartLocally(config);
  // Under torchrun the store is rank 0's: a rank that failed here would wait for it only to tell
  // the others (rank 0's own would serve it only to close it at once), and torchrun stops them
  // once a worker has failed.
  if (!local.ok() && StoreIsRankZeros(config)) return local.status();
  const Deadline deadline = Deadline::After(MillisFromSeconds(config.timeout_s));
  std::string store_host;
  StatusOr<std::unique_ptr<Rendezvous>> opened = OpenRendezvous(config, deadline, &store_host);
  if (!opened.ok()) return local.ok() ? opened.status() : local.status();
  const std::shared_ptr<Rendezvous> rv = std::move(*opened);

  // Every rank counts its communicators in the store; the Nth on every rank shares a prefix. A
  // start that fails before this rank's control plane is up publishes its failure under the prefix
  // (StartFailures), and every rank's Nth start then fails with it (a failure after that reaches
  // every rank through the control plane). So no rank gives its number back: a retried init, every
  // rank's next, meets the others' retries under the next prefix, where nothing of this start is
  // to be read (rank 0's own failure included), while this prefix keeps the failure for a rank
  // that reaches its Nth start late. Only a start that fails before it takes a number (the store
  // cannot be opened, or a failure here under torchrun) leaves the count as it was.
  const std::string counter = config.job_id + "/generation/" + std::to_string(config.rank);
  const StatusOr<int64_t> generation = rv->store->Add(counter, 1);
  if (!generation.ok()) return local.ok() ? generation.status() : local.status();
  auto origin = std::make_shared<CommOrigin>();
  origin->prefix = config.job_id + "/comm" + std::to_string(*generation);
  const auto failures = std::make_shared<StartFailures>(rv, origin->prefix, config.rank);
  if (!local.ok()) return failures->Tell(local.status());

  origin->host = config.host.empty() ? local->iface_address : config.host;
  if (origin->host.empty()) {
    origin->host = "127.0.0.1";
    if (!store_host.empty() && !IsLoopback(store_host)) {
      char name[256] = {0};
      if (gethostname(name, sizeof(name) - 1) == 0) origin->host = name;
    }
  }

  // Until this rank's control plane is up, its waits (for rank 0's settings and address; rank 0's
  // for the others' connections) end once a rank has published its failure; then the control
  // plane's own watch (StartOnStore) takes over.
  const auto others_failed = std::make_shared<StartWatch>(
      [failures] { return failures->Published(); }, "", failures->key());
  const StopAtExit stop_watch(others_failed);
  auto watched = std::make_shared<Rendezvous>();
  watched->store = std::make_unique<WatchedStore>(rv, others_failed);
  if (Status checked = CheckJobSettings(config, watched->store.get(), origin->prefix,
                                        Deadline::After(MillisFromSeconds(config.timeout_s)));
      !checked.ok()) {
    return failures->Tell(checked);
  }
  bool control_plane_up = false;
  StatusOr<std::unique_ptr<Engine>> engine = StartOnStore(
      config, watched, origin->prefix, origin->host,
      [others_failed] { return others_failed->Failed(); },
      [&control_plane_up, others_failed] {
        control_plane_up = true;
        others_failed->Stop();
      },
      [failures](const Status& own) { return failures->Tell(own); });
  if (!engine.ok()) {
    if (!control_plane_up) return failures->Tell(engine.status());
    // Published by StartOnStore already, unless a peer's connection closed (kPeerFailure).
    if (engine.status().code() != Code::kPeerFailure) return engine.status();
    return failures->AwaitExplanation(engine.status(), kPublishGrace);
  }
  origin->rendezvous = rv;
  for (int r = 0; r < config.size; ++r) origin->world_ranks.push_back(r);
  Communicator comm;
  comm.engine = std::move(*engine);
  comm.engine->ServeMetrics(std::move(local->metrics));
  if (local->timeline) {
    const std::optional<ClockOffset> clock = comm.engine->MeasureClockOffset();
    CONCORD_RETURN_IF_ERROR(comm.engine->StartTimeline(std::move(*local->timeline), clock));
  }
  comm.origin = std::move(origin);
  return comm;
}

StatusOr<std::unique_ptr<Engine>> CreateEngine(Config config) {
  CONCORD_ASSIGN_OR_RETURN(Communicator comm, CreateCommunicator(std::move(config)));
  return std::move(comm.engine);
}

StatusOr<Communicator> StartSubCommunicator(const Config& config, const CommOrigin& parent,
                                            const std::string& prefix, std::vector<int> world_ranks,
                                            const std::function<Status()>& parent_failure) {
  auto origin = std::make_shared<CommOrigin>();
  origin->prefix = prefix;
  origin->host = parent.host;
  origin->rendezvous = parent.rendezvous;
  Communicator comm;
  if (parent.rendezvous) {
    // The sub-communicator's engine keeps this rendezvous (the parent's store, watched while it
    // starts) for its life; the watches end with this call, as the parent may go before it. Its
    // waits end once the parent has failed (a member died) or, until this member's control plane
    // is up, once another member has published that its start failed (StartFailures, as a
    // world's start: a member whose control plane cannot bind, or whose settings differ).
    const auto failures = std::make_shared<StartFailures>(parent.rendezvous, prefix, config.rank);
    const auto parent_failed = std::make_shared<StartWatch>(parent_failure, kParentFailed);
    const auto others_failed = std::make_shared<StartWatch>(
        [failures] { return failures->Published(); }, "", failures->key());
    const StopAtExit stop_parent_watch(parent_failed);
    const StopAtExit stop_others_watch(others_failed);
    auto on_parent = std::make_shared<Rendezvous>();
    on_parent->store = std::make_unique<WatchedStore>(parent.rendezvous, parent_failed);
    auto watched = std::make_shared<Rendezvous>();
    watched->store = std::make_unique<WatchedStore>(on_parent, others_failed);
    Status checked = CheckJobSettings(config, watched->store.get(), prefix,
                                      Deadline::After(MillisFromSeconds(config.timeout_s)));
    // A start that failed as a member's death makes it fail (a connection reset, a timeout)
    // waits up to kParentGrace for the parent to learn of a death (within moments, through its
    // own connections) and then fails with that, naming the rank: every member's parent learns
    // of it. Any other failure, or when no death comes, is this member's own.
    const auto parent_explains = [&parent_failed](const Status& failed) -> std::optional<Status> {
      const Deadline grace = Deadline::After(kParentGrace);
      while (MayBeAMembersDeath(failed.code())) {
        if (Status parent_error = parent_failed->Failed(); !parent_error.ok()) return parent_error;
        if (grace.passed()) break;
        std::this_thread::sleep_for(kParentCheck);
      }
      return std::nullopt;
    };
    bool control_plane_up = false;
    auto started = checked.ok() ? StartOnStore(
                                      config, watched, prefix, parent.host,
                                      [parent_failed, others_failed]() -> Status {
                                        CONCORD_RETURN_IF_ERROR(parent_failed->Failed());
                                        return others_failed->Failed();
                                      },
                                      [&control_plane_up, others_failed] {
                                        control_plane_up = true;
                                        others_failed->Stop();
                                      },
                                      // After the control plane is up, while this member's
                                      // connections are open: its own failure is published
                                      // before the others see them close.
                                      [&](const Status& own) -> Status {
                                        if (auto parents = parent_explains(own)) return *parents;
                                        return failures->Tell(own);
                                      })
                                : StatusOr<std::unique_ptr<Engine>>(checked);
    if (!started.ok()) {
      // Published (or explained by the parent) already, through StartOnStore's publish_own.
      if (control_plane_up && started.status().code() != Code::kPeerFailure) {
        return NameWorldRanks(started.status(), world_ranks);
      }
      // Another member's published failure ended this start, or caused its error: it comes first.
      if (std::optional<Status> explained = failures->Explain(started.status())) {
        return NameWorldRanks(*explained, world_ranks);
      }
      if (auto parents = parent_explains(started.status())) {
        return NameWorldRanks(*parents, world_ranks);
      }
      // Before this member's control plane is up, its failure is published for the others.
      return NameWorldRanks(control_plane_up ? started.status() : failures->Tell(started.status()),
                            world_ranks);
    }
    comm.engine = std::move(*started);
  } else {
    auto transports =
        CreateMpiTransports(MillisFromSeconds(config.timeout_s), world_ranks, Fnv1a(prefix));
    if (!transports.ok()) {
      return NameWorldRanks(transports.status().WithContext("starting the mpi backend"),
                            world_ranks);
    }
    std::vector<std::unique_ptr<Backend>> lanes;
    lanes.push_back(std::move(transports->backend));
    comm.engine = std::make_unique<Engine>(config, std::move(transports->control), std::move(lanes),
                                           std::move(transports->keep_alive),
                                           MpiDevicePlane(config), std::move(transports->p2p));
  }
  origin->world_ranks = std::move(world_ranks);
  comm.origin = std::move(origin);
  return comm;
}

}  // namespace concord
