// The C API (include/concord/concord.h) over core's Engine. No logic of its own beyond turning C
// arguments into core types, checking them, and keeping error text: every entry point catches
// every exception, so none crosses the C boundary.
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/mutex.h"
#include "compression/registry.h"
#include "concord/concord.h"
#include "core/bootstrap.h"
#include "core/comm_split.h"
#include "core/entry_validation.h"

using concord::Code;
using concord::Status;

namespace {

// This process's ID, for the fork checks every call makes (see Forked below): read once, and again
// in each child that fork() makes (a pthread_atfork handler), so that a call costs no system call
// for it (glibc has not cached getpid() since 2.25; it was a tenth of a 4 KiB send/recv's CPU time
// on MPI). A child made without fork() (a raw clone system call) would keep its parent's ID: such
// a child cannot run this library's threads anyway.
std::atomic<pid_t> cached_process_id{0};

void ReadProcessId() {
  cached_process_id.store(::getpid(), std::memory_order_relaxed);
}

pid_t ProcessId() {
  static const bool read_at_fork = [] {
    ReadProcessId();
    return pthread_atfork(nullptr, nullptr, ReadProcessId) == 0;
  }();
  if (!read_at_fork) return ::getpid();  // no memory for the handler: ask every time
  return cached_process_id.load(std::memory_order_relaxed);
}

// The calling thread's key in the per-thread error texts below: unique for the process's life. A
// std::thread::id is not: a thread started after another exited often gets its ID, and would
// have read the exited thread's message as its own.
uint64_t ThreadSerial() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t serial = next.fetch_add(1, std::memory_order_relaxed);
  return serial;
}

}  // namespace

// A communicator: the engine, what it was started from (to split it), the process that made it,
// and each thread's last error message.
struct concord_comm {
  std::unique_ptr<concord::Engine> engine;
  std::shared_ptr<concord::CommOrigin> origin;
  pid_t pid = ProcessId();  // a forked child's copy is refused (see Forked below)
  concord::Mutex mu;
  // By ThreadSerial(); a thread's entry is erased when it exits (ThreadErrorEntries).
  std::unordered_map<uint64_t, std::string> last_error GUARDED_BY(mu);
};

// A request handle. The completion callback and concord_request_free meet under mu: whichever
// comes second deletes a detached request, so freeing a running request is safe.
struct concord_request {
  std::shared_ptr<concord::RequestState> state;
  pid_t pid = ProcessId();                  // as concord_comm's
  std::shared_ptr<concord::WaitGate> gate;  // waits through the engine while it exists
  concord_callback_t callback = nullptr;
  void* user_data = nullptr;
  bool device = false;  // the operation is on CUDA tensors
  bool recv = false;    // a point-to-point recv (concord_request_output_shape)
  concord::Mutex mu;
  bool completed GUARDED_BY(mu) = false;
  bool detached GUARDED_BY(mu) = false;
  // What concord_request_error returned last, per calling thread: a thread's pointer stays valid
  // while other threads ask (a node map never moves its values).
  std::unordered_map<uint64_t, std::string> error_text GUARDED_BY(mu);  // by ThreadSerial()
  // A call on this request that failed by itself (an exception in concord_wait), not the
  // operation: concord_request_error reports it until the operation's own error replaces it.
  std::string call_error GUARDED_BY(mu);
};

namespace {

// The communicators this process has made and not yet finalized, so that a call given one that
// was finalized (or a pointer that is no communicator at all) is refused without touching it: a
// finalized handle's memory is gone. A handle's address may be reused by a later concord_init, so
// this catches a stale handle only until then. Never destroyed: calls may come during exit.
// fork(): the registry's lock is held across it (pthread_atfork), so that a child, whose calls
// on its parent's handles look them up here before refusing them, never finds it held by a thread
// it does not have.
class LiveComms {
 public:
  static LiveComms& Get() {
    static auto* live = [] {
      auto* made = new LiveComms;
      // Without memory for the handlers a child may find the lock held, as before they existed.
      pthread_atfork(LockForFork, UnlockAfterFork, UnlockAfterFork);
      return made;
    }();
    return *live;
  }
  void Add(const concord_comm* comm) {
    concord::MutexLock lock(mu_);
    comms_.insert(comm);
  }
  void Remove(const concord_comm* comm) {
    concord::MutexLock lock(mu_);
    comms_.erase(comm);
  }
  bool Contains(const concord_comm* comm) {
    concord::MutexLock lock(mu_);
    return comms_.count(comm) != 0;
  }
  // Erases the last error of the thread `serial` from comm, if comm is live (under mu_, so that
  // concord_finalize cannot free it meanwhile).
  void EraseThreadError(concord_comm* comm, uint64_t serial) {
    concord::MutexLock lock(mu_);
    if (comms_.count(comm) == 0) return;
    concord::MutexLock comm_lock(comm->mu);
    comm->last_error.erase(serial);
  }
  // Removes from `comms` those that are not live.
  void KeepLive(std::vector<concord_comm*>* comms) {
    concord::MutexLock lock(mu_);
    size_t kept = 0;
    for (concord_comm* comm : *comms) {
      if (comms_.count(comm) != 0) (*comms)[kept++] = comm;
    }
    comms->resize(kept);
  }

 private:
  static void LockForFork() NO_THREAD_SAFETY_ANALYSIS { Get().mu_.Lock(); }
  static void UnlockAfterFork() NO_THREAD_SAFETY_ANALYSIS { Get().mu_.Unlock(); }

  concord::Mutex mu_;
  std::unordered_set<const concord_comm*> comms_ GUARDED_BY(mu_);
};

// The communicators on which this thread keeps a last error. When the thread exits, its entries
// there are erased: threads come and go (pools, Python's), and a communicator would otherwise keep
// a message for each thread that ever failed on it. Lock order: LiveComms, then a comm's mu.
class ThreadErrorEntries {
 public:
  ThreadErrorEntries() = default;
  ThreadErrorEntries(const ThreadErrorEntries&) = delete;
  ThreadErrorEntries& operator=(const ThreadErrorEntries&) = delete;
  // In a child that fork() made, the list is the parent's: its handles are left alone, unlocked
  // (a lock may have been held at the fork by a thread the child does not have), as every call
  // on them leaves them (Forked below).
  ~ThreadErrorEntries() {
    if (pid_ != ProcessId()) return;
    for (concord_comm* comm : comms_) LiveComms::Get().EraseThreadError(comm, ThreadSerial());
  }
  // Notes that this thread has an entry on comm (call without comm->mu held). Finalized
  // communicators are forgotten first, so a long-lived thread's list stays as short as the live
  // ones. Throws std::bad_alloc without memory (the entry then stays until comm is finalized).
  void Note(concord_comm* comm) {
    if (pid_ != ProcessId()) {
      comms_.clear();  // a forked child's first failure on a handle of its own
      pid_ = ProcessId();
    }
    if (std::find(comms_.begin(), comms_.end(), comm) != comms_.end()) return;
    LiveComms::Get().KeepLive(&comms_);
    comms_.push_back(comm);
  }

 private:
  pid_t pid_ = 0;  // the process whose handles comms_ holds
  std::vector<concord_comm*> comms_;
};

thread_local ThreadErrorEntries t_error_entries;

// What a call given a communicator that is not alive (finalized) is refused with.
Status NotAlive() {
  return Status(Code::kNotInitialized,
                "the communicator was finalized (or is not a handle concord_init made): it cannot "
                "be used again");
}

// The longest string (other than a tensor name: kMaxNameBytes) the API reads: a compression
// spec, a path, a config string. One with no NUL within it is refused, not read on.
constexpr size_t kMaxTextBytes = 64 << 10;

// Checks that `text` (not NULL) ends with a NUL within `limit` bytes; `what` names it.
Status CheckBoundedString(const char* text, size_t limit, const std::string& what) {
  if (strnlen(text, limit + 1) <= limit) return Status::Ok();
  return concord::InvalidArgument(what + " has no NUL within its first " + std::to_string(limit) +
                                  " bytes (at most " + std::to_string(limit) +
                                  " are read): it is not a C string, or is too long");
}

// The failure of the last concord_init on this thread (there is no handle to hold it), and of
// the last call on a handle copied by fork (whose own record may be locked by a thread that the
// child does not have).
thread_local std::string init_error;

// A handle made by another process, which this one is a fork of: the engine's threads and
// connections are the parent's (the child has none of its threads, and their locks may be held),
// so a call must touch nothing of it, not even to free it. NOT_INITIALIZED saying so, else OK.
Status Forked(pid_t owner, const char* what) {
  const pid_t self = ProcessId();
  if (owner == self) return Status::Ok();
  return Status(Code::kNotInitialized,
                std::string(what) + " belongs to process " + std::to_string(owner) +
                    "; this process (" + std::to_string(self) +
                    ") is a fork of it and cannot use it: concord_init a communicator of its own");
}

concord_status_t ToC(const Status& s) {
  return static_cast<concord_status_t>(s.code());
}

// Sets *slot to the text of `s`; without memory for it, to a short text that a string's own inline
// buffer holds (no allocation), so that keeping an error never throws out of the C API.
void KeepText(const Status& s, std::string* slot) noexcept {
  try {
    *slot = s.ToString();
  } catch (...) {
    *slot = "out of memory";
  }
}

// Keeps the text of a failure on comm for this thread (NULL comm: in init_error); never throws.
concord_status_t Record(concord_comm_t comm, const Status& s) noexcept {
  if (s.ok()) return CONCORD_SUCCESS;
  if (comm == nullptr) {
    KeepText(s, &init_error);
    return ToC(s);
  }
  {
    concord::MutexLock lock(comm->mu);
    std::string* slot = nullptr;
    try {
      slot = &comm->last_error[ThreadSerial()];
    } catch (...) {
      slot = &init_error;  // no memory for this thread's entry
    }
    KeepText(s, slot);
  }
  try {
    t_error_entries.Note(comm);
  } catch (...) {
    // No memory to note it: the entry stays until the communicator is finalized.
  }
  return ToC(s);
}

// The exception being handled, as a status (call only inside a catch block).
Status CurrentException(const char* where) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return Status(Code::kSystemError, std::string(where) + ": out of memory");
  } catch (const std::exception& e) {
    return concord::Internal(std::string(where) + ": unexpected exception: " + e.what());
  } catch (...) {
    return concord::Internal(std::string(where) +
                             ": unexpected exception of a type not derived from std::exception");
  }
}

// The exception being handled, recorded on comm (call only inside a catch block). Never throws:
// when even its message cannot be made (no memory), SYSTEM with the text "out of memory".
concord_status_t RecordException(concord_comm_t comm, const char* where) noexcept {
  try {
    return Record(comm, CurrentException(where));
  } catch (...) {
    return Record(comm, Status(Code::kSystemError, "out of memory"));
  }
}

// Runs body, turning any exception into an error status recorded on comm. A finalized comm is
// refused touching nothing of it (the message goes where concord_comm_last_error(NULL) finds it).
template <typename F>
concord_status_t Guard(concord_comm_t comm, F&& body) noexcept {
  try {
    if (comm != nullptr) {
      if (!LiveComms::Get().Contains(comm)) return Record(nullptr, NotAlive());
      const Status forked = Forked(comm->pid, "the communicator");
      if (!forked.ok()) return Record(nullptr, forked);
    }
    return Record(comm, body());
  } catch (...) {
    return RecordException(comm, "Concord");
  }
}

// Why the last call on a request copied by fork was refused (concord_request_error's answer there).
thread_local std::string forked_request_error;

// True, keeping why, for a request made by another process (see Forked): the caller returns
// NOT_INITIALIZED (concord_request_free: nothing) touching nothing of it.
bool RefuseForked(concord_request_t request) noexcept {
  if (request->pid == ProcessId()) return false;
  try {
    KeepText(Forked(request->pid, "the request"), &forked_request_error);
  } catch (...) {
    forked_request_error = "out of memory";  // the inline buffer holds it: no allocation
  }
  return true;
}

// A call on `request` that failed by itself: the message is kept for concord_request_error.
// Never throws.
concord_status_t RecordOnRequest(concord_request_t request, const Status& s) noexcept {
  concord::MutexLock lock(request->mu);
  KeepText(s, &request->call_error);
  return ToC(s);
}

// Runs the body of a call on a request (NULL too), turning any exception into an error status
// kept on the request, as Guard does for a communicator.
template <typename F>
concord_status_t GuardRequest(concord_request_t request, const char* where, F&& body) noexcept {
  try {
    return body();
  } catch (...) {
    if (request == nullptr) return CONCORD_ERR_SYSTEM;
    try {
      return RecordOnRequest(request, CurrentException(where));
    } catch (...) {
      return RecordOnRequest(request, Status(Code::kSystemError, "out of memory"));
    }
  }
}

// The integer behind a C enum field. A C caller may store any int there; loading it as the enum
// type in C++ is undefined when it is out of the enumerators' range, so it is read as bytes.
template <typename Enum>
int EnumValue(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized on supported platforms");
  int value;
  std::memcpy(&value, &field, sizeof(value));
  return value;
}

concord_comm_t NewHandle(concord::Communicator created) {
  auto* handle = new concord_comm;
  handle->engine = std::move(created.engine);
  handle->origin = std::move(created.origin);
  LiveComms::Get().Add(handle);
  return handle;
}

Status CheckComm(concord_comm_t comm) {
  if (comm == nullptr || !comm->engine) {
    return Status(Code::kNotInitialized, "the communicator is NULL or was finalized");
  }
  return Status::Ok();
}

Status ToRequest(const char* name, const concord_tensor_t* t, concord::OpType op,
                 concord::TensorRequest* out) {
  if (name == nullptr) return concord::InvalidArgument("the tensor name is NULL");
  CONCORD_RETURN_IF_ERROR(CheckBoundedString(name, concord::kMaxNameBytes, "the tensor name"));
  if (t == nullptr) return concord::InvalidArgument("the tensor descriptor is NULL");
  const std::string who = std::string("tensor '") + name + "': ";
  const int dtype = EnumValue(t->dtype);
  if (!concord::IsValidDType(dtype)) {
    return concord::InvalidArgument(who + "unknown dtype " + std::to_string(dtype));
  }
  if (t->ndim < 0 || t->ndim > CONCORD_MAX_DIMS) {
    return concord::InvalidArgument(who + "ndim " + std::to_string(t->ndim) + " is outside [0, " +
                                    std::to_string(CONCORD_MAX_DIMS) + "]");
  }
  if (t->ndim > 0 && t->shape == nullptr) return concord::InvalidArgument(who + "shape is NULL");
  out->name = name;
  out->op = op;
  out->dtype = static_cast<concord::DType>(dtype);
  out->shape.assign(t->shape, t->shape + t->ndim);
  out->device = t->device;
  return Status::Ok();
}

// An output descriptor must describe the same elements as the input.
Status CheckSameLayout(const concord::TensorRequest& in, const concord_tensor_t* out) {
  if (EnumValue(out->dtype) != static_cast<int>(in.dtype) || out->device != in.device) {
    return concord::InvalidArgument("tensor '" + in.name +
                                    "': output dtype or device differs from the input's");
  }
  if (out->ndim < 0 || out->ndim > CONCORD_MAX_DIMS || (out->ndim > 0 && out->shape == nullptr)) {
    return concord::InvalidArgument("tensor '" + in.name + "': output shape is invalid");
  }
  // Counted without overflow: neither shape has been checked yet.
  auto elements = [](const int64_t* shape, size_t ndim, int64_t* n) {
    *n = 1;
    for (size_t i = 0; i < ndim; ++i) {
      if (shape[i] < 0 || __builtin_mul_overflow(*n, shape[i], n)) return false;
    }
    return true;
  };
  int64_t n_out = 0, n_in = 0;
  if (!elements(out->shape, static_cast<size_t>(out->ndim), &n_out) ||
      !elements(in.shape.data(), in.shape.size(), &n_in)) {
    return concord::InvalidArgument("tensor '" + in.name +
                                    "': a dimension is negative or the shape overflows");
  }
  if (n_out != n_in) {
    return concord::InvalidArgument("tensor '" + in.name + "': output has " +
                                    std::to_string(n_out) + " elements, the input " +
                                    std::to_string(n_in));
  }
  return Status::Ok();
}

// Points the entry at input's data and at output's (NULL output: in place, into input).
Status SetBuffers(const concord_tensor_t* input, const concord_tensor_t* output,
                  concord::QueueEntry* e) {
  e->input = input->data;
  e->output = input->data;
  if (output != nullptr) {
    CONCORD_RETURN_IF_ERROR(CheckSameLayout(e->request, output));
    e->output = output->data;
  }
  return Status::Ok();
}

// The largest struct_size of a versioned struct the library reads (far beyond any version): a
// larger one is garbage, not a newer caller's struct.
constexpr size_t kMaxStructBytes = 4096;

// Checks the struct_size of a versioned options struct `Opts` (fields are only ever appended):
// at least `smallest`, the fields every version has, at most kMaxStructBytes, and a multiple of
// the struct's alignment, as the sizeof of every version is. A size that ends inside a field would
// have half a pointer or number copied (a NULL compression spec read as a wild pointer), so it is
// refused, not rounded. A newer caller's larger struct is taken when the fields this library does
// not have hold their default, zero (every appended option's default is 0 or NULL); a set one is
// UNAVAILABLE, rather than dropped in silence.
template <typename Opts>
Status CheckOptsSize(const Opts* opts, size_t smallest, const std::string& what) {
  const size_t struct_size = opts->struct_size;
  if (struct_size < smallest || struct_size > kMaxStructBytes || struct_size % alignof(Opts) != 0) {
    const std::string why = struct_size < smallest ? "too small"
                            : struct_size > kMaxStructBytes
                                ? "too large"
                                : "not a multiple of " + std::to_string(alignof(Opts));
    return concord::InvalidArgument(what + ": struct_size " + std::to_string(struct_size) + " is " +
                                    why + ", not the size of any version; set it with " +
                                    "its _init (this library's is " + std::to_string(sizeof(Opts)) +
                                    " bytes)");
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(opts);
  for (size_t i = sizeof(Opts); i < struct_size; ++i) {
    if (bytes[i] == 0) continue;
    return Status(Code::kUnavailable,
                  what + ": struct_size " + std::to_string(struct_size) +
                      " is larger than this library's (" + std::to_string(sizeof(Opts)) +
                      " bytes) and byte " + std::to_string(i) +
                      " is not zero: a field of a newer Concord is set, which this library does "
                      "not have; leave it at its default (0) or use a newer library");
  }
  return Status::Ok();
}

// Reads the caller's device options (NULL: none) into *stream and *event; `what` names the
// operation in an error.
Status ReadDeviceOptions(const concord_device_opts_t* opts, const std::string& what, void** stream,
                         void** event) {
  if (opts == nullptr) return Status::Ok();
  CONCORD_RETURN_IF_ERROR(
      CheckOptsSize(opts, offsetof(concord_device_opts_t, ready_event) + sizeof(void*),
                    what + ": device options"));
  *stream = opts->stream;
  *event = opts->ready_event;
  return Status::Ok();
}

// Copies the caller's device options into the entry (the engine checks them against the tensor).
Status SetDeviceOptions(const concord_device_opts_t* opts, concord::QueueEntry* e) {
  return ReadDeviceOptions(opts, "tensor '" + e->request.name + "'", &e->ready_stream,
                           &e->ready_event);
}

// Set while a blocking call (concord_allreduce, ...) enqueues: its thread waits for the request
// right after, so the engine need not be woken for it (Engine::Enqueue's then_wait).
thread_local bool t_blocking_call = false;

struct BlockingCall {
  BlockingCall() { t_blocking_call = true; }
  ~BlockingCall() { t_blocking_call = false; }  // when the enqueue failed before Submit()
};

// A new handle whose state runs the callback on completion, then frees the handle if detached.
concord_request* NewRequest(concord_callback_t callback, void* user_data) {
  auto* req = new concord_request;
  req->callback = callback;
  req->user_data = user_data;
  req->state = std::make_shared<concord::RequestState>([req](const Status& s) {
    if (req->callback != nullptr) req->callback(req, ToC(s), req->user_data);
    bool free_now;
    {
      concord::MutexLock lock(req->mu);
      req->completed = true;
      free_now = req->detached;
    }
    if (free_now) delete req;
  });
  return req;
}

// Queues entry; on success *request receives a new handle whose callback runs on completion.
Status Submit(concord_comm_t comm, concord::QueueEntry entry, concord_callback_t callback,
              void* user_data, concord_request_t* request) {
  if (request == nullptr) return concord::InvalidArgument("the request out-pointer is NULL");
  auto* req = NewRequest(callback, user_data);
  req->device = entry.request.device != CONCORD_DEVICE_CPU;
  entry.state = req->state;
  req->gate = comm->engine->wait_gate();
  // Taken at once: a callback this thread runs while it waits may enqueue on another engine.
  const bool then_wait = t_blocking_call;
  t_blocking_call = false;
  Status s = comm->engine->Enqueue(std::move(entry), then_wait);
  if (!s.ok()) {
    delete req;
    return s;
  }
  *request = req;
  return Status::Ok();
}

// request is read only after enqueued was computed (the enqueue call writes it).
concord_status_t WaitAndFree(concord_comm_t comm, concord_status_t enqueued,
                             const concord_request_t* request_out) {
  if (enqueued != CONCORD_SUCCESS) return enqueued;
  concord_request_t request = *request_out;
  concord_status_t result;
  try {
    // A blocking call is refused inside its thread's group at enqueue, so no wait is refused here.
    const concord::StatusOr<bool> waited =
        request->gate->Wait(*request->state, concord::Deadline::Infinite());
    result = Record(comm, waited.ok() ? request->state->status() : waited.status());
  } catch (...) {
    result = RecordException(comm, "Concord");
  }
  concord_request_free(request);
  return result;
}

// CONCORD_VERSION's integer as "major.minor.patch".
std::string VersionText(int version) {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

// Whether `user` looks like a concord_config_t that concord_config_init prepared: a struct_size
// that holds at least struct_size and version (and is not absurd), and a version of this major.
Status CheckConfigHeader(const concord_config_t& user) {
  constexpr size_t kSmallest = offsetof(concord_config_t, rank);  // struct_size and version
  constexpr size_t kLargest = 65536;  // far beyond any future concord_config_t
  const std::string init = "; prepare the config with concord_config_init() before setting fields";
  if (user.struct_size == 0)
    return concord::InvalidArgument("concord_config_t.struct_size is 0" + init);
  // Every version's size is a multiple of the alignment: another would cut a field in two.
  if (user.struct_size < kSmallest || user.struct_size > kLargest ||
      user.struct_size % alignof(concord_config_t) != 0) {
    return concord::InvalidArgument(
        "concord_config_t.struct_size is " + std::to_string(user.struct_size) +
        ", not the size of any concord_config_t (this library's is " +
        std::to_string(sizeof(concord_config_t)) + " bytes, and any is at least " +
        std::to_string(kSmallest) + " and a multiple of " +
        std::to_string(alignof(concord_config_t)) + ")" + init);
  }
  if (user.version <= 0) {
    return concord::InvalidArgument("concord_config_t.version is " + std::to_string(user.version) +
                                    ", not a Concord version" + init);
  }
  if (user.version / 10000 != CONCORD_VERSION_MAJOR) {
    return Status(Code::kVersionMismatch,
                  "the config was built for Concord " + VersionText(user.version) +
                      " (concord_config_t.version " + std::to_string(user.version) +
                      "), this library is " + VersionText(CONCORD_VERSION) +
                      ": rebuild against this library's concord.h");
  }
  return Status::Ok();
}

// Overrides `config` (read from the environment) with the fields of `c` that are set: not their
// "unset" value (-1, or NULL), naming each one taken in config->sources so that Config::Finalize's
// errors name the field. Any other value is taken as given, and Finalize checks it.
Status MergeConfig(const concord_config_t& c, concord::Config* config) {
  for (const auto& [text, name] : {std::pair<const char*, const char*>{c.store, "store"},
                                   {c.token, "token"},
                                   {c.job_id, "job_id"},
                                   {c.iface, "iface"},
                                   {c.host, "host"},
                                   {c.backend, "backend"},
                                   {c.compression, "compression"}}) {
    if (text != nullptr) {
      CONCORD_RETURN_IF_ERROR(
          CheckBoundedString(text, kMaxTextBytes, std::string("concord_config_t.") + name));
    }
  }
  const auto take = [config](const auto& given, const auto& unset, auto* member, const char* name) {
    if (given == unset) return;
    *member = given;
    config->sources[name] = std::string("concord_config_t.") + name;
  };
  take(c.rank, -1, &config->rank, "rank");
  take(c.size, -1, &config->size, "size");
  take(c.local_rank, -1, &config->local_rank, "local_rank");
  take(c.local_size, -1, &config->local_size, "local_size");
  take(c.store, nullptr, &config->store, "store");
  take(c.token, nullptr, &config->token, "token");
  take(c.job_id, nullptr, &config->job_id, "job_id");
  take(c.iface, nullptr, &config->iface, "iface");
  take(c.host, nullptr, &config->host, "host");
  take(c.fusion_threshold_bytes, -1, &config->fusion_threshold_bytes, "fusion_threshold_bytes");
  take(c.cycle_time_ms, -1.0, &config->cycle_time_ms, "cycle_time_ms");
  take(c.timeout_s, -1.0, &config->timeout_s, "timeout_s");
  take(c.cache_capacity, -1, &config->cache_capacity, "cache_capacity");
  take(c.log_level, -1, &config->log_level, "log_level");
  take(c.inline_threshold_bytes, -1, &config->inline_threshold_bytes, "inline_threshold_bytes");
  take(c.direct_threshold_bytes, -1, &config->direct_threshold_bytes, "direct_threshold_bytes");
  take(c.lanes, -1, &config->lanes, "lanes");
  take(c.backend, nullptr, &config->backend, "backend");
  take(c.compression, nullptr, &config->compression, "compression");
  if (c.waiter_progress < -1 || c.waiter_progress > 1) {
    return concord::InvalidArgument(
        "concord_config_t.waiter_progress = " + std::to_string(c.waiter_progress) +
        ": must be -1 (the environment's), 0 or 1");
  }
  if (c.waiter_progress != -1) config->waiter_progress = c.waiter_progress == 1;
  if (c.deterministic < -1 || c.deterministic > 1) {
    return concord::InvalidArgument(
        "concord_config_t.deterministic = " + std::to_string(c.deterministic) +
        ": must be -1 (the environment's), 0 or 1");
  }
  if (c.deterministic != -1) config->deterministic = c.deterministic == 1;
  return Status::Ok();
}

// A send or recv (core/p2p.h): checked and handed to the transport, never negotiated.
Status SubmitP2p(concord_comm_t comm, bool send, const concord_tensor_t* t, int peer, int64_t tag,
                 const concord_device_opts_t* device_opts, concord_callback_t callback,
                 void* user_data, concord_request_t* request) {
  CONCORD_RETURN_IF_ERROR(CheckComm(comm));
  if (request == nullptr) return concord::InvalidArgument("the request out-pointer is NULL");
  concord::P2pEntry e;
  e.send = send;
  e.peer = peer;
  e.tag = tag;
  e.expect = t != nullptr;
  // Built only for an error: this runs for every message.
  auto named = [&] {
    return std::string(send ? "send to" : "recv from") + " rank " + std::to_string(peer) +
           " with tag " + std::to_string(tag);
  };
  auto what = [&] { return named() + ": "; };
  if (send && t == nullptr) return concord::InvalidArgument(what() + "the tensor is NULL");
  if (t != nullptr) {
    const int dtype = EnumValue(t->dtype);
    if (!concord::IsValidDType(dtype)) {
      return concord::InvalidArgument(what() + "unknown dtype " + std::to_string(dtype));
    }
    if (t->ndim < 0 || t->ndim > CONCORD_MAX_DIMS) {
      return concord::InvalidArgument(what() + "ndim " + std::to_string(t->ndim) +
                                      " is outside [0, " + std::to_string(CONCORD_MAX_DIMS) + "]");
    }
    if (t->ndim > 0 && t->shape == nullptr) {
      return concord::InvalidArgument(what() + "shape is NULL");
    }
    e.dtype = static_cast<concord::DType>(dtype);
    e.shape.assign(t->shape, t->shape + t->ndim);
    e.device = t->device;
    e.data = t->data;
  }
  if (device_opts != nullptr) {
    CONCORD_RETURN_IF_ERROR(
        ReadDeviceOptions(device_opts, named(), &e.ready_stream, &e.ready_event));
  }
  concord_request* req = NewRequest(callback, user_data);
  req->device = e.device != CONCORD_DEVICE_CPU;
  req->recv = !send;
  req->gate = comm->engine->p2p_wait_gate();
  e.state = req->state;
  Status s = comm->engine->SubmitP2p(std::move(e));
  if (!s.ok()) {
    delete req;
    return s;
  }
  *request = req;
  return Status::Ok();
}

// Whether a request's output description (data, bytes, first dimension, received splits) can be
// read: once it finished successfully (else its error, or IN_PROGRESS), or, for an operation on
// CUDA tensors, once it was launched on the device: the engine set it before the launch, and the
// caller orders its device work after the operation with concord_request_wait_stream.
concord_status_t OutputReady(concord_request_t request) {
  if (request->state->done()) return ToC(request->state->status());
  if (request->device &&
      request->state->WaitLaunched(concord::Deadline::After(std::chrono::milliseconds(0))).ok()) {
    return CONCORD_SUCCESS;
  }
  return CONCORD_IN_PROGRESS;
}

}  // namespace

extern "C" {

void concord_version(int* major, int* minor, int* patch) {
  if (major) *major = CONCORD_VERSION_MAJOR;
  if (minor) *minor = CONCORD_VERSION_MINOR;
  if (patch) *patch = CONCORD_VERSION_PATCH;
}

const char* concord_status_string(concord_status_t status) {
  // Any int, as for the other enums (found by tests/fuzz/fuzz_c_api: a C caller's unknown value).
  switch (EnumValue(status)) {
    case CONCORD_SUCCESS:
      return "success";
    case CONCORD_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case CONCORD_ERR_MISMATCH:
      return "ranks submitted mismatching requests";
    case CONCORD_ERR_TIMEOUT:
      return "timed out";
    case CONCORD_ERR_PEER_FAILURE:
      return "another rank failed or exited";
    case CONCORD_ERR_BACKEND:
      return "backend error";
    case CONCORD_ERR_NOT_INITIALIZED:
      return "not initialized or already finalized";
    case CONCORD_ERR_INTERNAL:
      return "internal error";
    case CONCORD_ERR_UNAVAILABLE:
      return "not available in this build or on this machine";
    case CONCORD_IN_PROGRESS:
      return "in progress";
    case CONCORD_ERR_VERSION:
      return "version mismatch between header and library";
    case CONCORD_ERR_SYSTEM:
      return "system error";
    case CONCORD_ERR_AUTH:
      return "authentication failed";
    case CONCORD_ERR_PROTOCOL:
      return "malformed data from the network";
  }
  return "unknown status";
}

void concord_config_init(concord_config_t* config) {
  if (config == nullptr) return;
  std::memset(config, 0, sizeof(*config));
  config->struct_size = sizeof(*config);
  config->version = CONCORD_VERSION;
  config->rank = config->size = config->local_rank = config->local_size = -1;
  config->fusion_threshold_bytes = -1;
  config->cycle_time_ms = -1;
  config->timeout_s = -1;
  config->cache_capacity = -1;
  config->log_level = -1;
  config->inline_threshold_bytes = -1;
  config->direct_threshold_bytes = -1;
  config->lanes = -1;
  config->waiter_progress = -1;
  config->deterministic = -1;
}

void concord_device_opts_init(concord_device_opts_t* opts) {
  if (opts == nullptr) return;
  std::memset(opts, 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
}

void concord_allreduce_opts_init(concord_allreduce_opts_t* opts) {
  if (opts == nullptr) return;
  opts->struct_size = sizeof(*opts);
  opts->op = CONCORD_SUM;
  opts->prescale = 1.0;
  opts->postscale = 1.0;
  opts->compression = nullptr;
}

concord_status_t concord_compression_check(const char* spec, int dtype) {
  return Guard(nullptr, [&]() -> Status {
    if (dtype != -1 && !concord::IsValidDType(dtype)) {
      return concord::InvalidArgument("concord_compression_check: unknown dtype " +
                                      std::to_string(dtype));
    }
    if (spec == nullptr || *spec == '\0') return Status::Ok();  // "none"
    CONCORD_RETURN_IF_ERROR(
        CheckBoundedString(spec, kMaxTextBytes, "concord_compression_check: the spec"));
    auto compressor = concord::compression::CreateCompressor(spec);
    Status s = compressor.status();
    const auto type = static_cast<concord::DType>(dtype);
    if (s.ok() && dtype != -1 && !(*compressor)->passes_through(type)) {
      s = (*compressor)->CheckDType(type);
    }
    return s.ok() ? s : s.WithContext(std::string("compression '") + spec + "'");
  });
}

concord_status_t concord_init(concord_comm_t* comm) {
  return concord_init_config(nullptr, comm);
}

concord_status_t concord_init_config(const concord_config_t* user, concord_comm_t* comm) {
  return Guard(nullptr, [&]() -> Status {
    if (comm == nullptr) return concord::InvalidArgument("the communicator out-pointer is NULL");
    concord_config_t c;
    concord_config_init(&c);
    if (user != nullptr) {
      CONCORD_RETURN_IF_ERROR(CheckConfigHeader(*user));
      // Fields a newer caller added are ignored; fields an older caller lacks keep defaults.
      std::memcpy(&c, user, std::min(user->struct_size, sizeof(c)));
    }
    CONCORD_ASSIGN_OR_RETURN(concord::Config config, concord::Config::FromEnvironment());
    CONCORD_RETURN_IF_ERROR(MergeConfig(c, &config));
    // Every setting is checked (Config::Finalize) before anything starts.
    CONCORD_ASSIGN_OR_RETURN(concord::Communicator created, concord::CreateCommunicator(config));
    *comm = NewHandle(std::move(created));
    return Status::Ok();
  });
}

concord_status_t concord_join(concord_comm_t comm, int* last_rank) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    CONCORD_ASSIGN_OR_RETURN(int last, comm->engine->Join());
    if (last_rank != nullptr) *last_rank = last;
    return Status::Ok();
  });
}

concord_status_t concord_comm_split(concord_comm_t comm, int color, int key, concord_comm_t* sub) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    if (sub == nullptr) return concord::InvalidArgument("concord_comm_split: sub is NULL");
    CONCORD_ASSIGN_OR_RETURN(concord::Communicator created,
                             concord::SplitCommunicator(*comm->engine, *comm->origin, color, key));
    *sub = created.engine ? NewHandle(std::move(created)) : nullptr;
    return Status::Ok();
  });
}

concord_status_t concord_comm_create_group(concord_comm_t comm, const int* ranks, int n,
                                           concord_comm_t* sub) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    if (sub == nullptr) return concord::InvalidArgument("concord_comm_create_group: sub is NULL");
    // A bad list still takes part in the exchange, so that every rank fails alike.
    CONCORD_ASSIGN_OR_RETURN(
        concord::Communicator created,
        concord::CreateGroupCommunicator(*comm->engine, *comm->origin, ranks, n));
    *sub = created.engine ? NewHandle(std::move(created)) : nullptr;
    return Status::Ok();
  });
}

concord_status_t concord_finalize(concord_comm_t comm) {
  if (comm == nullptr) return CONCORD_SUCCESS;
  try {
    // Finalized already (twice is a common slip of bindings with destructors): refused, untouched.
    if (!LiveComms::Get().Contains(comm)) return Record(nullptr, NotAlive());
    // A forked child's copy is left alone: shutting it down would talk on the parent's
    // connections (its memory goes with the child).
    const Status forked = Forked(comm->pid, "the communicator");
    if (!forked.ok()) return Record(nullptr, forked);
    Status s = Status::Ok();
    if (comm->engine) {
      s = comm->engine->Shutdown();
      // Refused (and the handle kept) when called from one of this communicator's callbacks.
      if (!s.ok() && !comm->engine->stopped()) return Record(comm, s);
    }
    LiveComms::Get().Remove(comm);
    delete comm;
    // Finalized, but the finalize barrier did not complete: the handle is gone, so the message
    // is kept where concord_comm_last_error(NULL) finds it.
    return Record(nullptr, s);
  } catch (...) {
    return RecordException(comm, "concord_finalize");
  }
}

#define CONCORD_COMM_GETTER(fn, field)                                             \
  concord_status_t fn(concord_comm_t comm, int* out) {                             \
    return Guard(comm, [&]() -> Status {                                           \
      CONCORD_RETURN_IF_ERROR(CheckComm(comm));                                    \
      if (out == nullptr) return concord::InvalidArgument(#fn ": output is NULL"); \
      *out = comm->engine->config().field;                                         \
      return Status::Ok();                                                         \
    });                                                                            \
  }
CONCORD_COMM_GETTER(concord_comm_rank, rank)
CONCORD_COMM_GETTER(concord_comm_size, size)
CONCORD_COMM_GETTER(concord_comm_local_rank, local_rank)
CONCORD_COMM_GETTER(concord_comm_local_size, local_size)
#undef CONCORD_COMM_GETTER

concord_status_t concord_comm_metrics(concord_comm_t comm, char* buffer, size_t capacity,
                                      size_t* length) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    if (length == nullptr) return concord::InvalidArgument("concord_comm_metrics: length is NULL");
    if (buffer == nullptr && capacity != 0) {
      return concord::InvalidArgument("concord_comm_metrics: buffer is NULL but capacity is " +
                                      std::to_string(capacity));
    }
    const std::string json = comm->engine->MetricsJson();
    *length = json.size();
    if (buffer == nullptr) return Status::Ok();
    if (capacity < json.size() + 1) {
      return concord::InvalidArgument("concord_comm_metrics: the metrics need " +
                                      std::to_string(json.size() + 1) + " bytes, the buffer has " +
                                      std::to_string(capacity));
    }
    std::memcpy(buffer, json.c_str(), json.size() + 1);
    return Status::Ok();
  });
}

concord_status_t concord_timeline_start(concord_comm_t comm, const char* path) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    if (path == nullptr || *path == '\0') {
      return concord::InvalidArgument("concord_timeline_start: path is NULL or empty");
    }
    CONCORD_RETURN_IF_ERROR(
        CheckBoundedString(path, kMaxTextBytes, "concord_timeline_start: the path"));
    return comm->engine->StartTimeline(path);
  });
}

concord_status_t concord_timeline_stop(concord_comm_t comm) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    comm->engine->StopTimeline();
    return Status::Ok();
  });
}

concord_status_t concord_comm_stats(concord_comm_t comm, concord_stats_t* stats) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    if (stats == nullptr) return concord::InvalidArgument("concord_comm_stats: stats is NULL");
    constexpr size_t kFirst = offsetof(concord_stats_t, responses_cached);
    if (stats->struct_size < kFirst + sizeof(uint64_t) || stats->struct_size > kMaxStructBytes ||
        stats->struct_size % alignof(concord_stats_t) != 0) {
      return concord::InvalidArgument("concord_comm_stats: struct_size " +
                                      std::to_string(stats->struct_size) +
                                      " is not the size of any concord_stats_t (at least " +
                                      std::to_string(kFirst + sizeof(uint64_t)) + ", at most " +
                                      std::to_string(kMaxStructBytes) +
                                      " and a multiple of 8); set it to "
                                      "sizeof(concord_stats_t)");
    }
    const concord::EngineStats& e = comm->engine->stats();
    concord_stats_t all{};  // a field not filled below reads 0, never stack garbage
    all.struct_size = stats->struct_size;
    all.responses_cached = e.responses_cached.load(std::memory_order_relaxed);
    all.responses_full = e.responses_full.load(std::memory_order_relaxed);
    all.response_lists = e.response_lists.load(std::memory_order_relaxed);
    all.collectives = e.batches.load(std::memory_order_relaxed);
    all.fused_tensors = e.fused_tensors.load(std::memory_order_relaxed);
    all.inline_reductions = e.inline_reductions.load(std::memory_order_relaxed);
    all.device_launches = e.device_launches.load(std::memory_order_relaxed);
    all.cache_evictions = e.cache_evictions.load(std::memory_order_relaxed);
    all.topk_residual_evictions = e.topk_residual_evictions.load(std::memory_order_relaxed);
    all.scratch_bytes = e.scratch_bytes.load(std::memory_order_relaxed);
    all.scratch_reallocations = e.scratch_reallocations.load(std::memory_order_relaxed);
    all.kept_result_bytes = e.kept_result_bytes.load(std::memory_order_relaxed);
    // The fields the caller's struct has: the counters after struct_size that it covers.
    const size_t fields = (std::min(stats->struct_size, sizeof(all)) - kFirst) / sizeof(uint64_t);
    std::memcpy(reinterpret_cast<char*>(stats) + kFirst,
                reinterpret_cast<const char*>(&all) + kFirst, fields * sizeof(uint64_t));
    // A newer caller's counters that this library does not keep read 0, not what was there.
    if (stats->struct_size > sizeof(all)) {
      std::memset(reinterpret_cast<char*>(stats) + sizeof(all), 0,
                  stats->struct_size - sizeof(all));
    }
    return Status::Ok();
  });
}

const char* concord_comm_last_error(concord_comm_t comm) {
  if (comm == nullptr) return init_error.c_str();
  if (!LiveComms::Get().Contains(comm)) {
    return "NOT_INITIALIZED: the communicator was finalized (or is not a handle concord_init "
           "made)";
  }
  if (!Forked(comm->pid, "").ok()) return init_error.c_str();
  concord::MutexLock lock(comm->mu);
  // Looked up, not inserted: a thread that only asks adds no entry (threads come and go).
  const auto it = comm->last_error.find(ThreadSerial());
  return it == comm->last_error.end() ? "" : it->second.c_str();
}

concord_status_t concord_allreduce_async(concord_comm_t comm, const char* name,
                                         const concord_tensor_t* input,
                                         const concord_tensor_t* output,
                                         const concord_allreduce_opts_t* opts,
                                         concord_callback_t callback, void* user_data,
                                         concord_request_t* request) {
  return concord_allreduce_async_ex(comm, name, input, output, opts, nullptr, callback, user_data,
                                    request);
}

concord_status_t concord_allreduce_async_ex(concord_comm_t comm, const char* name,
                                            const concord_tensor_t* input,
                                            const concord_tensor_t* output,
                                            const concord_allreduce_opts_t* opts,
                                            const concord_device_opts_t* device_opts,
                                            concord_callback_t callback, void* user_data,
                                            concord_request_t* request) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    concord::QueueEntry e;
    CONCORD_RETURN_IF_ERROR(ToRequest(name, input, concord::OpType::kAllreduce, &e.request));
    concord_allreduce_opts_t o;
    concord_allreduce_opts_init(&o);
    if (opts != nullptr) {
      CONCORD_RETURN_IF_ERROR(CheckOptsSize(opts, offsetof(concord_allreduce_opts_t, compression),
                                            "tensor '" + e.request.name + "': allreduce options"));
      // Fields a newer caller added are ignored; fields an older caller lacks keep defaults.
      std::memcpy(&o, opts, std::min(opts->struct_size, sizeof(o)));
      o.struct_size = sizeof(o);
    }
    const int reduce_op = EnumValue(o.op);
    if (!concord::IsValidReduceOp(reduce_op)) {
      return concord::InvalidArgument("tensor '" + e.request.name + "': unknown reduce op " +
                                      std::to_string(reduce_op));
    }
    e.request.reduce_op = static_cast<concord::ReduceOp>(reduce_op);
    e.request.prescale = o.prescale;
    e.request.postscale = o.postscale;
    // The communicator's default compresses sums and averages (gradients) only: a min, max or
    // product keeps its exact values unless the call asks for compression itself.
    const bool gradient = e.request.reduce_op == concord::ReduceOp::kSum ||
                          e.request.reduce_op == concord::ReduceOp::kAverage;
    if (o.compression != nullptr) {
      CONCORD_RETURN_IF_ERROR(CheckBoundedString(
          o.compression, kMaxTextBytes, "tensor '" + e.request.name + "': the compression spec"));
      e.request.compression = o.compression;
    } else if (gradient) {
      e.request.compression = comm->engine->config().compression;
      e.compression_by_default = true;
    }
    CONCORD_RETURN_IF_ERROR(SetBuffers(input, output, &e));
    CONCORD_RETURN_IF_ERROR(SetDeviceOptions(device_opts, &e));
    return Submit(comm, std::move(e), callback, user_data, request);
  });
}

concord_status_t concord_allgather_async(concord_comm_t comm, const char* name,
                                         const concord_tensor_t* input, void* output,
                                         size_t output_capacity, concord_callback_t callback,
                                         void* user_data, concord_request_t* request) {
  return concord_allgather_async_ex(comm, name, input, output, output_capacity, nullptr, callback,
                                    user_data, request);
}

concord_status_t concord_allgather_async_ex(concord_comm_t comm, const char* name,
                                            const concord_tensor_t* input, void* output,
                                            size_t output_capacity,
                                            const concord_device_opts_t* device_opts,
                                            concord_callback_t callback, void* user_data,
                                            concord_request_t* request) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    concord::QueueEntry e;
    CONCORD_RETURN_IF_ERROR(ToRequest(name, input, concord::OpType::kAllgather, &e.request));
    e.input = input->data;
    e.output = output;
    e.output_capacity = output == nullptr ? 0 : output_capacity;
    CONCORD_RETURN_IF_ERROR(SetDeviceOptions(device_opts, &e));
    return Submit(comm, std::move(e), callback, user_data, request);
  });
}

concord_status_t concord_broadcast_async(concord_comm_t comm, const char* name,
                                         const concord_tensor_t* input,
                                         const concord_tensor_t* output, int root,
                                         concord_callback_t callback, void* user_data,
                                         concord_request_t* request) {
  return concord_broadcast_async_ex(comm, name, input, output, root, nullptr, callback, user_data,
                                    request);
}

concord_status_t concord_broadcast_async_ex(concord_comm_t comm, const char* name,
                                            const concord_tensor_t* input,
                                            const concord_tensor_t* output, int root,
                                            const concord_device_opts_t* device_opts,
                                            concord_callback_t callback, void* user_data,
                                            concord_request_t* request) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    concord::QueueEntry e;
    CONCORD_RETURN_IF_ERROR(ToRequest(name, input, concord::OpType::kBroadcast, &e.request));
    e.request.root = root;
    CONCORD_RETURN_IF_ERROR(SetBuffers(input, output, &e));
    CONCORD_RETURN_IF_ERROR(SetDeviceOptions(device_opts, &e));
    return Submit(comm, std::move(e), callback, user_data, request);
  });
}

concord_status_t concord_barrier_async(concord_comm_t comm, concord_callback_t callback,
                                       void* user_data, concord_request_t* request) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    if (request == nullptr) return concord::InvalidArgument("the request out-pointer is NULL");
    concord::QueueEntry e;  // no name: the engine numbers it once nothing can refuse it
    e.request.op = concord::OpType::kBarrier;
    e.request.dtype = concord::DType::kUint8;
    return Submit(comm, std::move(e), callback, user_data, request);
  });
}

concord_status_t concord_group_start(concord_comm_t comm) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    return comm->engine->GroupStart();
  });
}

concord_status_t concord_group_end(concord_comm_t comm) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    return comm->engine->GroupEnd();
  });
}

concord_status_t concord_end_step(concord_comm_t comm) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    comm->engine->EndStep();
    return Status::Ok();
  });
}

// ---- point to point (core/p2p.h): checked and handed to the transport, never negotiated ----
concord_status_t concord_send_async(concord_comm_t comm, const concord_tensor_t* tensor, int peer,
                                    int64_t tag, concord_callback_t callback, void* user_data,
                                    concord_request_t* request) {
  return concord_send_async_ex(comm, tensor, peer, tag, nullptr, callback, user_data, request);
}

concord_status_t concord_send_async_ex(concord_comm_t comm, const concord_tensor_t* tensor,
                                       int peer, int64_t tag,
                                       const concord_device_opts_t* device_opts,
                                       concord_callback_t callback, void* user_data,
                                       concord_request_t* request) {
  return Guard(comm, [&] {
    return SubmitP2p(comm, true, tensor, peer, tag, device_opts, callback, user_data, request);
  });
}

concord_status_t concord_recv_async(concord_comm_t comm, const concord_tensor_t* expected, int peer,
                                    int64_t tag, concord_callback_t callback, void* user_data,
                                    concord_request_t* request) {
  return concord_recv_async_ex(comm, expected, peer, tag, nullptr, callback, user_data, request);
}

concord_status_t concord_recv_async_ex(concord_comm_t comm, const concord_tensor_t* expected,
                                       int peer, int64_t tag,
                                       const concord_device_opts_t* device_opts,
                                       concord_callback_t callback, void* user_data,
                                       concord_request_t* request) {
  return Guard(comm, [&] {
    return SubmitP2p(comm, false, expected, peer, tag, device_opts, callback, user_data, request);
  });
}

concord_status_t concord_send(concord_comm_t comm, const concord_tensor_t* tensor, int peer,
                              int64_t tag) {
  concord_request_t r = nullptr;
  return WaitAndFree(comm, concord_send_async(comm, tensor, peer, tag, nullptr, nullptr, &r), &r);
}

concord_status_t concord_recv(concord_comm_t comm, const concord_tensor_t* expected, int peer,
                              int64_t tag) {
  const concord_status_t checked = Guard(comm, [&]() -> Status {
    if (expected != nullptr) return Status::Ok();
    return concord::InvalidArgument(
        "concord_recv: expected is NULL (use concord_recv_async to take the sender's shape into "
        "a request-owned buffer)");
  });
  if (checked != CONCORD_SUCCESS) return checked;
  concord_request_t r = nullptr;
  return WaitAndFree(comm, concord_recv_async(comm, expected, peer, tag, nullptr, nullptr, &r), &r);
}

concord_status_t concord_request_output_shape(concord_request_t request, concord_dtype_t* dtype,
                                              int* ndim, int64_t* shape) {
  return GuardRequest(request, "concord_request_output_shape", [&]() -> concord_status_t {
    if (request == nullptr) return CONCORD_ERR_INVALID_ARGUMENT;
    if (RefuseForked(request)) return CONCORD_ERR_NOT_INITIALIZED;
    if (!request->recv) {
      return RecordOnRequest(request, concord::InvalidArgument("concord_request_output_shape: the "
                                                               "request is not a recv"));
    }
    if (!request->state->done()) return CONCORD_IN_PROGRESS;
    const Status s = request->state->status();
    if (!s.ok()) return ToC(s);
    const auto& out = request->state->output();
    if (dtype) *dtype = static_cast<concord_dtype_t>(out.dtype);
    if (ndim) *ndim = static_cast<int>(out.shape.size());
    if (shape) std::copy(out.shape.begin(), out.shape.end(), shape);
    return CONCORD_SUCCESS;
  });
}

concord_status_t concord_wait(concord_request_t request, double timeout_s) {
  return GuardRequest(request, "concord_wait", [&]() -> concord_status_t {
    if (request == nullptr) return CONCORD_ERR_INVALID_ARGUMENT;
    if (RefuseForked(request)) return CONCORD_ERR_NOT_INITIALIZED;
    if (std::isnan(timeout_s)) {
      return RecordOnRequest(request, concord::InvalidArgument("concord_wait: the limit is NaN"));
    }
    const auto deadline = timeout_s < 0
                              ? concord::Deadline::Infinite()
                              : concord::Deadline::After(std::chrono::milliseconds(
                                    static_cast<int64_t>(std::min(timeout_s, 1e9) * 1000.0)));
    const concord::StatusOr<bool> completed = request->gate->Wait(*request->state, deadline);
    // Refused (the request is in this thread's open group): it still runs once the group ends.
    if (!completed.ok()) return RecordOnRequest(request, completed.status());
    // The limit passed: the request still runs and may be waited on again. (TIMEOUT is only ever
    // the operation's own failure.)
    if (!*completed) return CONCORD_IN_PROGRESS;
    return ToC(request->state->status());
  });
}

concord_status_t concord_test(concord_request_t request) {
  return GuardRequest(request, "concord_test", [&]() -> concord_status_t {
    if (request == nullptr) return CONCORD_ERR_INVALID_ARGUMENT;
    if (RefuseForked(request)) return CONCORD_ERR_NOT_INITIALIZED;
    if (!request->state->done()) return CONCORD_IN_PROGRESS;
    return ToC(request->state->status());
  });
}

const char* concord_request_error(concord_request_t request) {
  if (request == nullptr) return "the request is NULL";
  if (RefuseForked(request)) return forked_request_error.c_str();
  const bool done = request->state->done();
  concord::MutexLock lock(request->mu);
  try {
    std::string& text = request->error_text[ThreadSerial()];
    if (done && !request->state->status().ok()) {
      text = request->state->status().ToString();
    } else {
      text = request->call_error;
    }
    return text.c_str();
  } catch (...) {
    return "out of memory for the request's error message";
  }
}

concord_status_t concord_request_output(concord_request_t request, void** data, size_t* bytes,
                                        int64_t* first_dim) {
  return GuardRequest(request, "concord_request_output", [&]() -> concord_status_t {
    if (request == nullptr) return CONCORD_ERR_INVALID_ARGUMENT;
    if (RefuseForked(request)) return CONCORD_ERR_NOT_INITIALIZED;
    const concord_status_t ready = OutputReady(request);
    if (ready != CONCORD_SUCCESS) return ready;
    const auto& out = request->state->output();
    if (data) *data = out.data;
    if (bytes) *bytes = out.bytes;
    if (first_dim) *first_dim = out.first_dim;
    return CONCORD_SUCCESS;
  });
}

concord_status_t concord_request_wire_bytes(concord_request_t request, uint64_t* bytes) {
  return GuardRequest(request, "concord_request_wire_bytes", [&]() -> concord_status_t {
    if (request == nullptr) return CONCORD_ERR_INVALID_ARGUMENT;
    if (RefuseForked(request)) return CONCORD_ERR_NOT_INITIALIZED;
    if (bytes == nullptr) {
      return RecordOnRequest(request,
                             concord::InvalidArgument("concord_request_wire_bytes: bytes is NULL"));
    }
    if (!request->state->done()) return CONCORD_IN_PROGRESS;
    *bytes = request->state->wire_bytes();
    return CONCORD_SUCCESS;
  });
}

concord_status_t concord_request_wait_stream(concord_request_t request, void* stream,
                                             double timeout_s) {
  return GuardRequest(request, "concord_request_wait_stream", [&]() -> concord_status_t {
    if (request == nullptr) return CONCORD_ERR_INVALID_ARGUMENT;
    if (RefuseForked(request)) return CONCORD_ERR_NOT_INITIALIZED;
    if (stream == nullptr || std::isnan(timeout_s) || !request->device) {
      return RecordOnRequest(
          request,
          concord::InvalidArgument(
              stream == nullptr       ? "concord_request_wait_stream: the stream is NULL"
              : std::isnan(timeout_s) ? "concord_request_wait_stream: the limit is NaN"
                                      : "concord_request_wait_stream: not a CUDA operation"));
    }
    const auto deadline = timeout_s < 0
                              ? concord::Deadline::Infinite()
                              : concord::Deadline::After(std::chrono::milliseconds(
                                    static_cast<int64_t>(std::min(timeout_s, 1e9) * 1000.0)));
    const Status refused = request->gate->CheckWait(*request->state, deadline);
    if (!refused.ok()) return RecordOnRequest(request, refused);
    auto launched = request->state->WaitLaunched(deadline);
    // Its only error: the limit passed before the launch. The request still runs, as in
    // concord_wait, and the stream may be made to wait for it by a later call.
    if (!launched.ok()) return CONCORD_IN_PROGRESS;
    if (*launched == nullptr) return ToC(request->state->status());  // already complete
    const Status queued = (*launched)->StreamWait(stream);
    return queued.ok() ? CONCORD_SUCCESS : RecordOnRequest(request, queued);
  });
}

void concord_request_free(concord_request_t request) {
  if (request == nullptr || RefuseForked(request)) return;  // a fork's copy: left alone
  bool free_now;
  {
    concord::MutexLock lock(request->mu);
    free_now = request->completed;
    request->detached = true;
  }
  if (free_now) delete request;
}

concord_status_t concord_allreduce(concord_comm_t comm, const char* name,
                                   const concord_tensor_t* input, const concord_tensor_t* output,
                                   const concord_allreduce_opts_t* opts) {
  concord_request_t r = nullptr;
  BlockingCall blocking;
  return WaitAndFree(
      comm, concord_allreduce_async(comm, name, input, output, opts, nullptr, nullptr, &r), &r);
}

concord_status_t concord_allgather(concord_comm_t comm, const char* name,
                                   const concord_tensor_t* input, void* output,
                                   size_t output_capacity) {
  concord_request_t r = nullptr;
  BlockingCall blocking;
  return WaitAndFree(
      comm,
      concord_allgather_async(comm, name, input, output, output_capacity, nullptr, nullptr, &r),
      &r);
}

concord_status_t concord_broadcast(concord_comm_t comm, const char* name,
                                   const concord_tensor_t* input, const concord_tensor_t* output,
                                   int root) {
  concord_request_t r = nullptr;
  BlockingCall blocking;
  return WaitAndFree(
      comm, concord_broadcast_async(comm, name, input, output, root, nullptr, nullptr, &r), &r);
}

concord_status_t concord_barrier(concord_comm_t comm) {
  concord_request_t r = nullptr;
  BlockingCall blocking;
  return WaitAndFree(comm, concord_barrier_async(comm, nullptr, nullptr, &r), &r);
}

// ---- reduce-scatter and all-to-all ----

void concord_reducescatter_opts_init(concord_reducescatter_opts_t* opts) {
  if (opts == nullptr) return;
  std::memset(opts, 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
  opts->op = CONCORD_SUM;
  opts->prescale = 1.0;
  opts->postscale = 1.0;
}

void concord_alltoall_opts_init(concord_alltoall_opts_t* opts) {
  if (opts == nullptr) return;
  std::memset(opts, 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
}

}  // extern "C"

namespace {

// Copies a C options struct of either version into `o` (prepared by its init function).
template <typename Opts>
Status CopyOpts(const Opts* opts, size_t smallest, const char* what, Opts* o) {
  if (opts == nullptr) return Status::Ok();
  CONCORD_RETURN_IF_ERROR(CheckOptsSize(opts, smallest, std::string(what) + " options"));
  // Fields a newer caller added are ignored; fields an older caller lacks keep defaults.
  std::memcpy(o, opts, std::min(opts->struct_size, sizeof(*o)));
  o->struct_size = sizeof(*o);
  return Status::Ok();
}

// The caller's splits (nsplits of them; NULL: none, the engine's even split), then the even split
// filled in, so that the output can be checked against this rank's share.
Status SetSplits(concord_comm_t comm, const int64_t* splits, int nsplits,
                 concord::TensorRequest* r) {
  if (splits != nullptr) {
    // nsplits 0 too: only a NULL pointer asks for the even split.
    if (nsplits < 1 || nsplits > (1 << 20)) {
      return concord::InvalidArgument(
          "tensor '" + r->name + "': nsplits " + std::to_string(nsplits) +
          " is not a number of ranks (splits are given: one per rank; NULL splits for the "
          "even split)");
    }
    r->splits.assign(splits, splits + nsplits);
  }
  return concord::NormalizeSplits(r, comm->engine->config().size);
}

}  // namespace

extern "C" {

concord_status_t concord_reducescatter_async(concord_comm_t comm, const char* name,
                                             const concord_tensor_t* input,
                                             const concord_tensor_t* output,
                                             const concord_reducescatter_opts_t* opts,
                                             concord_callback_t callback, void* user_data,
                                             concord_request_t* request) {
  return concord_reducescatter_async_ex(comm, name, input, output, opts, nullptr, callback,
                                        user_data, request);
}

concord_status_t concord_reducescatter_async_ex(concord_comm_t comm, const char* name,
                                                const concord_tensor_t* input,
                                                const concord_tensor_t* output,
                                                const concord_reducescatter_opts_t* opts,
                                                const concord_device_opts_t* device_opts,
                                                concord_callback_t callback, void* user_data,
                                                concord_request_t* request) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    concord::QueueEntry e;
    CONCORD_RETURN_IF_ERROR(ToRequest(name, input, concord::OpType::kReducescatter, &e.request));
    concord_reducescatter_opts_t o;
    concord_reducescatter_opts_init(&o);
    CONCORD_RETURN_IF_ERROR(CopyOpts(
        opts, offsetof(concord_reducescatter_opts_t, nsplits) + sizeof(int), "reducescatter", &o));
    const int reduce_op = EnumValue(o.op);
    if (!concord::IsValidReduceOp(reduce_op)) {
      return concord::InvalidArgument("tensor '" + e.request.name + "': unknown reduce op " +
                                      std::to_string(reduce_op));
    }
    e.request.reduce_op = static_cast<concord::ReduceOp>(reduce_op);
    e.request.prescale = o.prescale;
    e.request.postscale = o.postscale;
    if (o.compression != nullptr) {
      CONCORD_RETURN_IF_ERROR(CheckBoundedString(
          o.compression, kMaxTextBytes, "tensor '" + e.request.name + "': the compression spec"));
      e.request.compression = o.compression;
    }
    if (e.request.shape.empty()) {
      return concord::InvalidArgument("tensor '" + e.request.name +
                                      "': reducescatter needs at least one dimension");
    }
    CONCORD_RETURN_IF_ERROR(SetSplits(comm, o.recv_splits, o.nsplits, &e.request));
    CONCORD_RETURN_IF_ERROR(concord::ValidateSplits(e.request, comm->engine->config().size));
    if (output == nullptr) {
      return concord::InvalidArgument("tensor '" + e.request.name + "': the output is NULL");
    }
    // The output must be exactly this rank's share: [splits[rank], the input's other dims].
    const int rank = comm->engine->config().rank;
    std::vector<int64_t> want = e.request.shape;
    if (static_cast<size_t>(rank) < e.request.splits.size()) want[0] = e.request.splits[rank];
    const bool same = EnumValue(output->dtype) == static_cast<int>(e.request.dtype) &&
                      output->device == e.request.device &&
                      output->ndim == static_cast<int>(want.size()) && output->shape != nullptr &&
                      std::equal(want.begin(), want.end(), output->shape);
    if (!same) {
      std::string shape;
      for (int64_t d : want) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      return concord::InvalidArgument("tensor '" + e.request.name +
                                      "': the output must have the input's dtype and device and "
                                      "shape [" +
                                      shape + "] (this rank's split, then the input's dims)");
    }
    e.input = input->data;
    e.output = output->data;
    e.output_capacity = concord::RowBytes(e.request) * static_cast<size_t>(want[0]);
    CONCORD_RETURN_IF_ERROR(SetDeviceOptions(device_opts, &e));
    return Submit(comm, std::move(e), callback, user_data, request);
  });
}

concord_status_t concord_reducescatter(concord_comm_t comm, const char* name,
                                       const concord_tensor_t* input,
                                       const concord_tensor_t* output,
                                       const concord_reducescatter_opts_t* opts) {
  concord_request_t r = nullptr;
  BlockingCall blocking;
  return WaitAndFree(
      comm, concord_reducescatter_async(comm, name, input, output, opts, nullptr, nullptr, &r), &r);
}

concord_status_t concord_alltoall_async(concord_comm_t comm, const char* name,
                                        const concord_tensor_t* input, void* output,
                                        size_t output_capacity, const concord_alltoall_opts_t* opts,
                                        concord_callback_t callback, void* user_data,
                                        concord_request_t* request) {
  return concord_alltoall_async_ex(comm, name, input, output, output_capacity, opts, nullptr,
                                   callback, user_data, request);
}

concord_status_t concord_alltoall_async_ex(concord_comm_t comm, const char* name,
                                           const concord_tensor_t* input, void* output,
                                           size_t output_capacity,
                                           const concord_alltoall_opts_t* opts,
                                           const concord_device_opts_t* device_opts,
                                           concord_callback_t callback, void* user_data,
                                           concord_request_t* request) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    concord::QueueEntry e;
    CONCORD_RETURN_IF_ERROR(ToRequest(name, input, concord::OpType::kAlltoall, &e.request));
    concord_alltoall_opts_t o;
    concord_alltoall_opts_init(&o);
    CONCORD_RETURN_IF_ERROR(
        CopyOpts(opts, offsetof(concord_alltoall_opts_t, nsplits) + sizeof(int), "alltoall", &o));
    if (e.request.shape.empty()) {
      return concord::InvalidArgument("tensor '" + e.request.name +
                                      "': alltoall needs at least one dimension");
    }
    CONCORD_RETURN_IF_ERROR(SetSplits(comm, o.splits, o.nsplits, &e.request));
    e.input = input->data;
    e.output = output;
    e.output_capacity = output == nullptr ? 0 : output_capacity;
    CONCORD_RETURN_IF_ERROR(SetDeviceOptions(device_opts, &e));
    return Submit(comm, std::move(e), callback, user_data, request);
  });
}

concord_status_t concord_alltoall(concord_comm_t comm, const char* name,
                                  const concord_tensor_t* input, void* output,
                                  size_t output_capacity, const concord_alltoall_opts_t* opts,
                                  int64_t* received_splits, int nreceived) {
  concord_request_t r = nullptr;
  BlockingCall blocking;
  const concord_status_t checked = Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    if (output == nullptr) {
      return concord::InvalidArgument(
          "concord_alltoall: the output is NULL (a blocking call keeps no result; use "
          "concord_alltoall_async to let the request own it)");
    }
    if (received_splits != nullptr && nreceived != comm->engine->config().size) {
      return concord::InvalidArgument("concord_alltoall: nreceived is " +
                                      std::to_string(nreceived) + ", the communicator has " +
                                      std::to_string(comm->engine->config().size) + " ranks");
    }
    return Status::Ok();
  });
  if (checked != CONCORD_SUCCESS) return checked;
  const concord_status_t enqueued = concord_alltoall_async(
      comm, name, input, output, output_capacity, opts, nullptr, nullptr, &r);
  if (enqueued != CONCORD_SUCCESS) return enqueued;
  concord_status_t result;
  try {
    const concord::StatusOr<bool> waited = r->gate->Wait(*r->state, concord::Deadline::Infinite());
    const Status s = waited.ok() ? r->state->status() : waited.status();
    if (s.ok() && received_splits != nullptr) {
      const std::vector<int64_t>& got = r->state->output().splits;
      std::copy(got.begin(), got.end(), received_splits);
    }
    result = Record(comm, s);
  } catch (...) {
    result = RecordException(comm, "concord_alltoall");
  }
  concord_request_free(r);
  return result;
}

// ---- reduce and gather to a root ----

void concord_reduce_opts_init(concord_reduce_opts_t* opts) {
  if (opts == nullptr) return;
  std::memset(opts, 0, sizeof(*opts));
  opts->struct_size = sizeof(*opts);
  opts->op = CONCORD_SUM;
  opts->prescale = 1.0;
  opts->postscale = 1.0;
}

concord_status_t concord_reduce_async(concord_comm_t comm, const char* name,
                                      const concord_tensor_t* input, const concord_tensor_t* output,
                                      int root, const concord_reduce_opts_t* opts,
                                      concord_callback_t callback, void* user_data,
                                      concord_request_t* request) {
  return concord_reduce_async_ex(comm, name, input, output, root, opts, nullptr, callback,
                                 user_data, request);
}

concord_status_t concord_reduce_async_ex(concord_comm_t comm, const char* name,
                                         const concord_tensor_t* input,
                                         const concord_tensor_t* output, int root,
                                         const concord_reduce_opts_t* opts,
                                         const concord_device_opts_t* device_opts,
                                         concord_callback_t callback, void* user_data,
                                         concord_request_t* request) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    concord::QueueEntry e;
    CONCORD_RETURN_IF_ERROR(ToRequest(name, input, concord::OpType::kReduce, &e.request));
    concord_reduce_opts_t o;
    concord_reduce_opts_init(&o);
    CONCORD_RETURN_IF_ERROR(
        CopyOpts(opts, offsetof(concord_reduce_opts_t, postscale) + sizeof(double), "reduce", &o));
    const int reduce_op = EnumValue(o.op);
    if (!concord::IsValidReduceOp(reduce_op)) {
      return concord::InvalidArgument("tensor '" + e.request.name + "': unknown reduce op " +
                                      std::to_string(reduce_op));
    }
    e.request.reduce_op = static_cast<concord::ReduceOp>(reduce_op);
    e.request.prescale = o.prescale;
    e.request.postscale = o.postscale;
    e.request.root = root;
    if (root == comm->engine->config().rank) {
      CONCORD_RETURN_IF_ERROR(SetBuffers(input, output, &e));
    } else {
      e.input = input->data;  // the output of a rank other than the root is ignored
    }
    CONCORD_RETURN_IF_ERROR(SetDeviceOptions(device_opts, &e));
    return Submit(comm, std::move(e), callback, user_data, request);
  });
}

concord_status_t concord_reduce(concord_comm_t comm, const char* name,
                                const concord_tensor_t* input, const concord_tensor_t* output,
                                int root, const concord_reduce_opts_t* opts) {
  concord_request_t r = nullptr;
  BlockingCall blocking;
  return WaitAndFree(
      comm, concord_reduce_async(comm, name, input, output, root, opts, nullptr, nullptr, &r), &r);
}

concord_status_t concord_gather_async(concord_comm_t comm, const char* name,
                                      const concord_tensor_t* input, void* output,
                                      size_t output_capacity, int root, concord_callback_t callback,
                                      void* user_data, concord_request_t* request) {
  return concord_gather_async_ex(comm, name, input, output, output_capacity, root, nullptr,
                                 callback, user_data, request);
}

concord_status_t concord_gather_async_ex(concord_comm_t comm, const char* name,
                                         const concord_tensor_t* input, void* output,
                                         size_t output_capacity, int root,
                                         const concord_device_opts_t* device_opts,
                                         concord_callback_t callback, void* user_data,
                                         concord_request_t* request) {
  return Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    concord::QueueEntry e;
    CONCORD_RETURN_IF_ERROR(ToRequest(name, input, concord::OpType::kGather, &e.request));
    e.request.root = root;
    e.input = input->data;
    if (root == comm->engine->config().rank) {  // the others' output is ignored
      e.output = output;
      e.output_capacity = output == nullptr ? 0 : output_capacity;
    }
    CONCORD_RETURN_IF_ERROR(SetDeviceOptions(device_opts, &e));
    return Submit(comm, std::move(e), callback, user_data, request);
  });
}

concord_status_t concord_gather(concord_comm_t comm, const char* name,
                                const concord_tensor_t* input, void* output, size_t output_capacity,
                                int root) {
  concord_request_t r = nullptr;
  BlockingCall blocking;
  const concord_status_t checked = Guard(comm, [&]() -> Status {
    CONCORD_RETURN_IF_ERROR(CheckComm(comm));
    if (output == nullptr && root == comm->engine->config().rank) {
      return concord::InvalidArgument(
          "concord_gather: the output is NULL on the root (a blocking call keeps no result; use "
          "concord_gather_async to let the request own it)");
    }
    return Status::Ok();
  });
  if (checked != CONCORD_SUCCESS) return checked;
  return WaitAndFree(
      comm,
      concord_gather_async(comm, name, input, output, output_capacity, root, nullptr, nullptr, &r),
      &r);
}

concord_status_t concord_request_received_splits(concord_request_t request, int64_t* splits,
                                                 int n) {
  return GuardRequest(request, "concord_request_received_splits", [&]() -> concord_status_t {
    if (request == nullptr) return CONCORD_ERR_INVALID_ARGUMENT;
    if (RefuseForked(request)) return CONCORD_ERR_NOT_INITIALIZED;
    if (splits == nullptr) {
      return RecordOnRequest(
          request, concord::InvalidArgument("concord_request_received_splits: splits is NULL"));
    }
    const concord_status_t ready = OutputReady(request);
    if (ready != CONCORD_SUCCESS) return ready;
    const std::vector<int64_t>& got = request->state->output().splits;
    if (got.empty() || n != static_cast<int>(got.size())) {
      return RecordOnRequest(
          request,
          concord::InvalidArgument(got.empty() ? "concord_request_received_splits: not an alltoall"
                                               : "concord_request_received_splits: n is " +
                                                     std::to_string(n) + ", the alltoall has " +
                                                     std::to_string(got.size()) + " ranks"));
    }
    std::copy(got.begin(), got.end(), splits);
    return CONCORD_SUCCESS;
  });
}

}  // extern "C"
