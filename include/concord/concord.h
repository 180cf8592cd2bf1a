/*
 * Concord C API: collective communication for data-parallel training.
 *
 * Plain C99. Every function returns a concord_status_t (or is a pure query), never throws and never
 * aborts on bad input: an invalid argument returns an error code and changes nothing. The message
 * behind the last error on a communicator is kept per handle (concord_comm_last_error).
 *
 * Threading: a communicator may be used from any number of threads at once; each enqueue is
 * atomic. Requests may be waited on from any thread, but each request is freed exactly once.
 * Callbacks run on whichever thread completes the request, which may be a thread waiting in
 * concord_wait (see concord_callback_t): they must not wait on requests of their communicator.
 *
 * fork(): a child process cannot use its parent's communicators or requests (their threads and
 * connections are the parent's). Every call on them there returns NOT_INITIALIZED saying so and
 * touches nothing: concord_finalize and concord_request_free leave them alone (the parent's job
 * goes on undisturbed), concord_comm_last_error and concord_request_error give the reason. The
 * child may concord_init communicators of its own.
 *
 * Versioned structs (the config, the options, concord_stats_t): set struct_size with their _init
 * (or sizeof). Fields are only ever appended, so the library reads the fields the caller's
 * struct_size covers and keeps defaults for the rest; a struct_size that is no version's size
 * (smaller than the first fields, not a multiple of 8, which would end inside a field, or larger
 * than 4096 bytes, 65536 for the config) is INVALID_ARGUMENT. A newer caller's larger struct:
 * the fields this library does not have must hold their default in an options struct (0 or NULL,
 * the default of every field appended to one), else UNAVAILABLE saying which byte is set; they
 * are ignored in the config (whose "unset" is -1 or NULL); in concord_stats_t they are set to 0.
 *
 * Strings (tensor names, compression specs, paths, the config's strings) must end with a NUL
 * within 65536 bytes; the library reads no further, and refuses one without it with
 * INVALID_ARGUMENT.
 *
 * Handles: once a communicator is finalized, every call given it returns NOT_INITIALIZED touching
 * nothing of it (concord_finalize again too), with the message in concord_comm_last_error(NULL);
 * only until a later concord_init happens to reuse its address, so do not rely on it. A request
 * freed, or waited on by one thread while another frees it, cannot be detected: the behaviour is
 * undefined.
 *
 * Memory: an enqueue copies the name, the tensor descriptors and their shape arrays, and the
 * option structs (the compression spec too), so all of them may be reused or freed as soon as the
 * call returns. The data itself (input, output, an allgather's buffer) belongs to the operation
 * until it completes: keep it valid, do not write to it and do not read an output before then.
 *
 * Example (tests/docs compiles every fenced block of this header and of the README):
 *   ```c
 *   concord_comm_t comm;
 *   if (concord_init(&comm) != CONCORD_SUCCESS) {
 *     fprintf(stderr, "concord_init: %s\n", concord_comm_last_error(NULL));
 *     exit(1);
 *   }
 *   float grad[1024] = {0};
 *   int64_t shape[1] = {1024};
 *   concord_tensor_t t = {grad, CONCORD_FLOAT32, 1, shape, CONCORD_DEVICE_CPU};
 *   concord_allreduce_opts_t opts;
 *   concord_allreduce_opts_init(&opts);
 *   opts.op = CONCORD_AVERAGE;
 *   if (concord_allreduce(comm, "grad", &t, NULL, &opts) != CONCORD_SUCCESS)
 *     fprintf(stderr, "allreduce: %s\n", concord_comm_last_error(comm));
 *   concord_finalize(comm);
 *   ```
 */
#ifndef CONCORD_CONCORD_H_
#define CONCORD_CONCORD_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define CONCORD_API
#elif defined(CONCORD_BUILDING_LIBRARY)
#define CONCORD_API __attribute__((visibility("default")))
#else
#define CONCORD_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define CONCORD_VERSION_MAJOR 0
#define CONCORD_VERSION_MINOR 1
#define CONCORD_VERSION_PATCH 0
#define CONCORD_VERSION \
  (CONCORD_VERSION_MAJOR * 10000 + CONCORD_VERSION_MINOR * 100 + CONCORD_VERSION_PATCH)

/** Status codes. Values never change; new codes are only appended. */
typedef enum concord_status {
  CONCORD_SUCCESS = 0,
  CONCORD_ERR_INVALID_ARGUMENT = 1, /**< bad argument; nothing was changed */
  CONCORD_ERR_MISMATCH = 2,         /**< ranks disagree about a tensor (dtype, shape, op, ...) */
  CONCORD_ERR_TIMEOUT = 3,          /**< a deadline passed */
  CONCORD_ERR_PEER_FAILURE = 4,     /**< another rank exited, was killed or failed */
  CONCORD_ERR_BACKEND = 5,          /**< the transport or collective library failed */
  CONCORD_ERR_NOT_INITIALIZED = 6,  /**< use before init or after finalize */
  CONCORD_ERR_INTERNAL = 7,         /**< a bug in Concord; please report it */
  CONCORD_ERR_UNAVAILABLE = 8,      /**< feature or backend not built or not usable here */
  CONCORD_IN_PROGRESS = 9,          /**< not finished yet (concord_test, a wait's limit passed) */
  CONCORD_ERR_VERSION = 10,         /**< header and library major versions differ */
  CONCORD_ERR_SYSTEM = 11,          /**< an operating-system call failed */
  CONCORD_ERR_AUTH = 12,            /**< rendezvous refused: wrong job secret */
  CONCORD_ERR_PROTOCOL = 13         /**< malformed bytes arrived from the network */
} concord_status_t;

/** Element types. Values never change. */
typedef enum concord_dtype {
  CONCORD_UINT8 = 0,
  CONCORD_INT8 = 1,
  CONCORD_INT32 = 2,
  CONCORD_INT64 = 3,
  CONCORD_FLOAT16 = 4,
  CONCORD_BFLOAT16 = 5,
  CONCORD_FLOAT32 = 6,
  CONCORD_FLOAT64 = 7
} concord_dtype_t;

/** Reduction operators. AVERAGE divides the sum by the number of ranks (integer types truncate). */
typedef enum concord_reduce_op {
  CONCORD_SUM = 0,
  CONCORD_AVERAGE = 1,
  CONCORD_MIN = 2,
  CONCORD_MAX = 3,
  CONCORD_PRODUCT = 4
} concord_reduce_op_t;

#define CONCORD_DEVICE_CPU (-1)
#define CONCORD_MAX_DIMS 8

/** Opaque communicator: one background engine, its queue, buffers and connections. */
typedef struct concord_comm* concord_comm_t;
/** Opaque handle of one enqueued operation; free it with concord_request_free. */
typedef struct concord_request* concord_request_t;

/** Called once when a request finishes, on the thread that completes it: the communicator's
 *  background thread; a thread waiting in concord_wait or a blocking call, which runs the engine's
 *  work itself (CONCORD_WAITER_PROGRESS); one of the communicator's lane threads
 *  (CONCORD_LANES); the GPU backend's completion thread (CUDA tensors); the thread calling
 *  concord_group_end when the group is refused; or the thread calling concord_finalize for what it
 *  fails. Inside its own callback the request is still IN_PROGRESS. The callback may enqueue and
 *  may free its request; it must not wait on requests of this communicator (that may never
 *  return) nor finalize it (refused with INVALID_ARGUMENT). Not called when the enqueue itself
 *  fails. */
typedef void (*concord_callback_t)(concord_request_t request, concord_status_t status,
                                   void* user_data);

/**
 * Configuration for concord_init_config. Call concord_config_init first: it sets struct_size and
 * version and fills every field with its "take it from the environment or the default" value:
 * -1 for numbers, NULL for strings; no other value means "unset". Every other value is checked at
 * init, like the environment variables (README, Configuration): one out of range, a compression
 * spec that does not parse, an unknown backend fail concord_init_config with INVALID_ARGUMENT and a
 * message naming the field, the value and what is accepted ("concord_config_t.timeout_s = 0: the
 * timeout must be in (0, 86400] seconds").
 * Fields may only be appended in later versions; the library reads struct_size to know which exist.
 */
typedef struct concord_config {
  size_t struct_size; /**< sizeof(concord_config_t) as compiled by the caller */
  int version;        /**< CONCORD_VERSION as compiled by the caller */
  int rank;           /**< -1: from the environment */
  int size;           /**< -1: from the environment */
  int local_rank;     /**< -1: from the environment, else rank when all ranks are local, else 0 */
  int local_size;     /**< -1: from the environment, else size (all ranks on this host) */
  const char* store;  /**< rendezvous: "tcp://host:port" or "file:///dir"; NULL: environment */
  const char* token;  /**< secret for the TCP store; NULL: environment */
  const char* job_id; /**< separates jobs that share a store; NULL: environment or "default" */
  const char* iface;  /**< network interface for data traffic (e.g. "lo"); NULL: environment */
  const char* host;   /**< address to bind and advertise; NULL: environment or from iface */
  int64_t fusion_threshold_bytes; /**< -1: environment or 64 MiB; 0 disables fusion */
  double cycle_time_ms;           /**< -1: environment or 0 (no gathering delay); 0 .. 60000 */
  double timeout_s;               /**< -1: environment or 30; else in (0, 86400] seconds */
  int cache_capacity;             /**< -1: environment or 1024; 0 disables the response cache */
  int log_level;                  /**< -1: environment or 1 (0 error, 1 warning, 2 info, 3 debug) */
  /** -1: environment or 32 KiB; allreduces this small are reduced by the
   *  coordinator during negotiation (no backend call); 0 turns that off; at most 256 KiB. */
  int64_t inline_threshold_bytes;
  /** -1: environment or 256 KiB; allreduces this large are never fused (run in place) */
  int64_t direct_threshold_bytes;
  /** -1: environment or 2; data-plane lanes whose collectives run concurrently (1 to 8) */
  int lanes;
  /** "gloo", "gloo-ibverbs", "mpi", "nccl" or "auto" (README, Configuration);
   *  NULL: CONCORD_BACKEND or "gloo" */
  const char* backend;
  /** the compression of sum and average allreduces that name none, a spec as in
   *  concord_allreduce_opts_t (parsed at init); NULL: CONCORD_COMPRESSION or "none" */
  const char* compression;
  /** -1: environment (CONCORD_WAITER_PROGRESS) or 1; 1: a thread waiting for a request runs the
   *  engine's work itself; 0: only the engine's thread does */
  int waiter_progress;
  /** -1: environment (CONCORD_DETERMINISTIC) or 0; 1: every element of an allreduce and a
   *  reducescatter is combined in rank order, so results are bitwise identical for a given number
   *  of ranks whatever the fusion, lanes, thresholds and arrival order (CPU tensors only) */
  int deterministic;
} concord_config_t;

/** Options of an allreduce. Initialise with concord_allreduce_opts_init. */
typedef struct concord_allreduce_opts {
  size_t struct_size;
  concord_reduce_op_t op; /**< default CONCORD_SUM */
  double prescale;        /**< multiplies the input before the reduction; default 1 */
  double postscale;       /**< multiplies the result; default 1 */
  /** Gradient compression, a spec such as "none", "fp16", "bf16", "topk:density=0.01" or
   *  "topk:density=0.001,method=exact,values=fp16" (README, Compression); every rank must give
   *  the same (else MISMATCH). NULL (the default): for a sum or an average, CONCORD_COMPRESSION
   *  or concord_config_t.compression where its compressor takes the tensor (a dtype it does not
   *  take, or a CUDA tensor, travels uncompressed); for min, max and product none. "" is "none".
   *  fp16 and bf16 reduce their 16-bit values with op, and send a float16 or bfloat16 tensor as it
   *  is; top-k adds the ranks' shares, so it takes sum and average only. A spec that does not
   * parse, a dtype the compressor does not take, top-k with another op, or an input or output not
   * aligned to the element size fails the enqueue with INVALID_ARGUMENT naming the problem; CPU
   * tensors only (UNAVAILABLE for a CUDA tensor). Top-k keeps error feedback per name (README,
   * Compression). Older callers whose struct ends before this field get the default. */
  const char* compression;
} concord_allreduce_opts_t;

/** A tensor: contiguous row-major data described by dtype and shape. */
typedef struct concord_tensor {
  void* data; /**< may be NULL only when the tensor has no elements */
  concord_dtype_t dtype;
  int ndim;             /**< 0 (a scalar) to CONCORD_MAX_DIMS */
  const int64_t* shape; /**< ndim entries, each >= 0 */
  int device;           /**< CONCORD_DEVICE_CPU, or a CUDA device id (data is device memory) */
} concord_tensor_t;

/**
 * Device options of one operation on CUDA tensors, for the _ex entry points. Initialise with
 * concord_device_opts_init; fields may only be appended (struct_size tells which exist). The
 * handles are CUDA's, passed as void* so this header needs no CUDA header. Giving either for a CPU
 * tensor is an INVALID_ARGUMENT.
 */
typedef struct concord_device_opts {
  size_t struct_size;
  /** cudaStream_t: the operation reads the tensor only after the work queued on this stream so
   *  far (e.g. the producer's kernels) has run. The caller's thread is not blocked. With neither
   *  a stream nor an event (both NULL, NULL options, or the plain forms), the operation waits for
   *  the legacy default stream, as CUDA reads a NULL stream: the kernels and copies queued so far
   *  on stream 0 (a cudaMemcpy from pageable memory may return before its bytes arrive) and, by
   *  its implicit synchronization, on every blocking stream; not on non-blocking streams.
   */
  void* stream;
  /** cudaEvent_t, already recorded: the operation waits for it too; NULL: no event. */
  void* ready_event;
} concord_device_opts_t;

/**
 * A communicator's counters since init, and the memory it holds now (scratch_bytes,
 * kept_result_bytes), read with concord_comm_stats. Set struct_size to
 * sizeof(concord_stats_t) first; fields may only be appended in later versions, and the library
 * fills only those that fit in struct_size (an older caller gets the fields it knows).
 */
typedef struct concord_stats {
  size_t struct_size;
  uint64_t responses_cached;  /**< operations negotiated as a response-cache bit (fast path) */
  uint64_t responses_full;    /**< operations negotiated in full, errors included */
  uint64_t response_lists;    /**< response lists executed */
  uint64_t collectives;       /**< collectives run on the backends */
  uint64_t fused_tensors;     /**< tensors that went through the fusion buffer */
  uint64_t inline_reductions; /**< small operations the coordinator completed during negotiation */
  uint64_t device_launches;   /**< collectives handed to the device backend */
  /** response-cache entries evicted to make room (CONCORD_CACHE_CAPACITY); the same on every
   *  rank */
  uint64_t cache_evictions;
  /** top-k residuals dropped because CONCORD_TOPK_RESIDUALS names already held one (the least
   *  recently compressed name lost its error feedback); this rank's count */
  uint64_t topk_residual_evictions;
  /** bytes of scratch memory this rank holds now (a gauge, not a count): the lanes' fusion and
   *  gather buffers and top-k's selection scratch after the last response list; grown for a large
   *  operation and given back after a burst of smaller ones */
  uint64_t scratch_bytes;
  /** times the lanes' fusion and gather buffers were allocated or freed so far; flat in a steady
   *  training loop */
  uint64_t scratch_reallocations;
  /** bytes of freed requests' result memory (an allgather, gather or all-to-all without an output
   *  buffer, a recv of the sender's shape) kept for reuse after the last response list (a gauge);
   *  a block nobody takes is given back */
  uint64_t kept_result_bytes;
} concord_stats_t;

/* ---- library and communicator ---- */
CONCORD_API void concord_version(int* major, int* minor, int* patch);
CONCORD_API const char* concord_status_string(concord_status_t status);
CONCORD_API void concord_config_init(concord_config_t* config);
CONCORD_API void concord_allreduce_opts_init(concord_allreduce_opts_t* opts);
CONCORD_API void concord_device_opts_init(concord_device_opts_t* opts);
/** Checks a compression spec (concord_allreduce_opts_t.compression) without a communicator, so a
 *  bad one can be refused before any operation: SUCCESS when it parses and, for dtype >= 0 (a
 *  concord_dtype_t), its compressor takes that dtype; else INVALID_ARGUMENT naming the problem
 *  (concord_comm_last_error(NULL) has the message; an allreduce's enqueue would fail the same
 *  way). dtype -1: the spec alone. NULL or "" is "none". Touches no state; thread-safe. */
CONCORD_API concord_status_t concord_compression_check(const char* spec, int dtype);

/** Initialises from the environment (CONCORD_*, or torchrun's, Slurm's, Open MPI's variables).
 *  Every setting is checked before anything starts: a bad one is INVALID_ARGUMENT naming the
 *  variable or field, its value and what is accepted (concord_comm_last_error(NULL)); *comm is
 *  then unchanged and nothing is left allocated. */
CONCORD_API concord_status_t concord_init(concord_comm_t* comm);
/** The same, with the set fields of `config` (NULL: none) overriding the environment. A config
 *  not prepared by concord_config_init (struct_size 0 or not a concord_config_t size, version <= 0)
 *  is INVALID_ARGUMENT saying so; one built for another major version is ERR_VERSION. */
CONCORD_API concord_status_t concord_init_config(const concord_config_t* config,
                                                 concord_comm_t* comm);
/** Runs a last barrier with the other ranks (at most the timeout), fails pending requests with
 *  NOT_INITIALIZED, stops the engine and frees the handle. NULL is ok. From one of the
 *  communicator's own callbacks it is refused with INVALID_ARGUMENT and the handle stays valid.
 *  The others learn at once that this rank finalized: operations they submitted that this rank
 *  did not fail with PEER_FAILURE naming it, and so do their sends and recvs with it. When
 *  the barrier does not complete (TIMEOUT: other ranks did not finalize in time; or the error
 *  that failed it), the handle is still freed and the status says so, with the message in
 *  concord_comm_last_error(NULL). */
CONCORD_API concord_status_t concord_finalize(concord_comm_t comm);

CONCORD_API concord_status_t concord_comm_rank(concord_comm_t comm, int* rank);
CONCORD_API concord_status_t concord_comm_size(concord_comm_t comm, int* size);
CONCORD_API concord_status_t concord_comm_local_rank(concord_comm_t comm, int* local_rank);
CONCORD_API concord_status_t concord_comm_local_size(concord_comm_t comm, int* local_size);
/** Fills `stats` (its struct_size set by the caller; one smaller than the first counter, or NULL,
 *  is INVALID_ARGUMENT). Thread-safe; the counters move while the engine works. */
CONCORD_API concord_status_t concord_comm_stats(concord_comm_t comm, concord_stats_t* stats);
/** The communicator's metrics as one JSON object: the counters above, operations, bytes and
 *  errors by op and dtype, latency histograms by op and size, time in each lane's collectives,
 *  fusion fill, compression ratio, stall warnings and (rank 0) the straggler figures; the README's
 *  "Metrics" section lists every field. Sets *length to the JSON's length (without the NUL) and,
 *  when `capacity` (bytes at `buffer`) holds it and the NUL, writes both. buffer NULL with
 *  capacity 0 only asks the length (SUCCESS); a non-NULL buffer too small for it is
 *  INVALID_ARGUMENT saying how many bytes it needs, and nothing is written to the buffer (*length
 *  is still set, to the length needed; the metrics move while the engine works: ask with room to
 *  spare). Thread-safe. */
CONCORD_API concord_status_t concord_comm_metrics(concord_comm_t comm, char* buffer,
                                                  size_t capacity, size_t* length);
/** Starts the communicator's timeline: each rank writes `path`.rank<R>, a Chrome Trace Event JSON
 *  file (Perfetto and chrome://tracing open it) with every operation's phases per tensor
 *  (negotiate, execute, callback), its lanes' fused batches (with their members) and collectives
 *  (with bytes), and the engine's cycles; perf/concord-timeline merge joins the ranks' files.
 *  Call it on every rank, or on those to trace. INVALID_ARGUMENT naming the file and the system's
 *  reason when it cannot be written, or when a timeline is already on (CONCORD_TIMELINE starts one
 *  at init). A write that fails later logs a warning and turns the timeline off; operations go on.
 *  Thread-safe. */
CONCORD_API concord_status_t concord_timeline_start(concord_comm_t comm, const char* path);
/** Writes the rest of the timeline and closes its file (SUCCESS also when none is on, and when a
 *  write failed: that only logs a warning). concord_finalize stops it too. Thread-safe. */
CONCORD_API concord_status_t concord_timeline_stop(concord_comm_t comm);
/** The message of the last call on this communicator that failed on the calling thread (empty
 *  when none has; a later success does not clear it). Valid until the next call on this
 *  communicator from the same thread. A finalized communicator: a fixed text saying so.
 *  NULL comm: the message of the last call on this thread that failed without a communicator to
 *  keep it: concord_init or concord_init_config, a concord_finalize whose barrier did not
 *  complete, or any call given a NULL or a finalized communicator; also not cleared by a
 *  success. Errors of an operation itself are kept on its request (concord_request_error). */
CONCORD_API const char* concord_comm_last_error(concord_comm_t comm);

/* ---- sub-communicators (process sets) ---- */
/** A color that joins no sub-communicator (MPI_UNDEFINED, NCCL_SPLIT_NOCOLOR). */
#define CONCORD_UNDEFINED (-1)
/**
 * Splits `comm` as MPI_Comm_split and ncclCommSplit do: the ranks that give the same color (>= 0)
 * form one new communicator, ranked by key, then by their rank in `comm`; a rank that gives
 * CONCORD_UNDEFINED gets *sub = NULL (and SUCCESS). Collective over `comm`: every rank calls it,
 * in the same order as its other splits of `comm`, and it returns once this rank's communicator
 * is connected (at most the timeout). A bad argument on any rank (a color below -1) fails the
 * call on every rank with INVALID_ARGUMENT naming that rank; *sub is then left unchanged.
 * The new communicator has the parent's settings, its own engine, thread and connections (docs/
 * ARCHITECTURE.md, "Sub-communicators"), and everything works on it as on any communicator,
 * from any thread; it is freed with concord_finalize, which does not disturb the parent or its
 * siblings (either may be finalized first). A member's failure fails the communicators it
 * belongs to, their errors naming its rank in the parent, and no other.
 */
CONCORD_API concord_status_t concord_comm_split(concord_comm_t comm, int color, int key,
                                                concord_comm_t* sub);
/**
 * A communicator of the ranks ranks[0..n-1] of `comm`, in that order (its rank i is ranks[i]);
 * ranks outside the list get *sub = NULL. Collective over `comm`: every rank calls it with the
 * same list (else INVALID_ARGUMENT on every rank naming one that differs), which must be
 * non-empty, without repeats and within [0, size).
 */
CONCORD_API concord_status_t concord_comm_create_group(concord_comm_t comm, const int* ranks, int n,
                                                       concord_comm_t* sub);

/* ---- asynchronous operations: enqueue now, complete later ---- */
/**
 * Allreduce input into output (output NULL or output->data == input->data: in place).
 * name identifies the tensor across ranks; a name may be in flight only once at a time.
 */
CONCORD_API concord_status_t concord_allreduce_async(concord_comm_t comm, const char* name,
                                                     const concord_tensor_t* input,
                                                     const concord_tensor_t* output,
                                                     const concord_allreduce_opts_t* opts,
                                                     concord_callback_t callback, void* user_data,
                                                     concord_request_t* request);
/**
 * Allgather along the first dimension, which may differ between ranks (other dims must agree).
 * output: a buffer of output_capacity bytes, or NULL to let the request own the result
 * (concord_request_output). A result larger than output_capacity fails with INVALID_ARGUMENT.
 */
CONCORD_API concord_status_t concord_allgather_async(concord_comm_t comm, const char* name,
                                                     const concord_tensor_t* input, void* output,
                                                     size_t output_capacity,
                                                     concord_callback_t callback, void* user_data,
                                                     concord_request_t* request);
/** Broadcast root's input to every rank's output (output NULL: in place). */
CONCORD_API concord_status_t concord_broadcast_async(concord_comm_t comm, const char* name,
                                                     const concord_tensor_t* input,
                                                     const concord_tensor_t* output, int root,
                                                     concord_callback_t callback, void* user_data,
                                                     concord_request_t* request);
/**
 * The same operations with device options (device_opts may be NULL). CUDA tensors go to the GPU
 * backend (CONCORD_BACKEND auto or nccl: NCCL); without one, or on a device this communicator does
 * not use (each rank uses GPU local_rank modulo the GPUs), the call fails with UNAVAILABLE or
 * INVALID_ARGUMENT saying why. A CUDA allgather needs an output buffer on the device.
 */
CONCORD_API concord_status_t
concord_allreduce_async_ex(concord_comm_t comm, const char* name, const concord_tensor_t* input,
                           const concord_tensor_t* output, const concord_allreduce_opts_t* opts,
                           const concord_device_opts_t* device_opts, concord_callback_t callback,
                           void* user_data, concord_request_t* request);
CONCORD_API concord_status_t concord_allgather_async_ex(
    concord_comm_t comm, const char* name, const concord_tensor_t* input, void* output,
    size_t output_capacity, const concord_device_opts_t* device_opts, concord_callback_t callback,
    void* user_data, concord_request_t* request);
CONCORD_API concord_status_t concord_broadcast_async_ex(
    concord_comm_t comm, const char* name, const concord_tensor_t* input,
    const concord_tensor_t* output, int root, const concord_device_opts_t* device_opts,
    concord_callback_t callback, void* user_data, concord_request_t* request);
CONCORD_API concord_status_t concord_barrier_async(concord_comm_t comm, concord_callback_t callback,
                                                   void* user_data, concord_request_t* request);

/* ---- reduce-scatter and all-to-all (CUDA tensors too: the _ex forms below) ---- */
/** Options of a reduce-scatter. Initialise with concord_reducescatter_opts_init; fields may only
 *  be appended (struct_size tells which exist). */
typedef struct concord_reducescatter_opts {
  size_t struct_size;
  concord_reduce_op_t op; /**< default CONCORD_SUM */
  double prescale;        /**< multiplies the input first (floating dtypes only); default 1 */
  double postscale;       /**< multiplies the result (floating dtypes only); default 1 */
  /** Rows of the first dimension each rank receives, in rank order: nsplits (the number of
   *  ranks) counts, none negative, summing to the first dimension, the same on every rank (else
   *  MISMATCH). NULL (the default): the even split, rank r receives n / size rows and the first
   *  n % size ranks one more (Horovod's rule). Given with nsplits other than the number of ranks
   *  (0 too): INVALID_ARGUMENT. */
  const int64_t* recv_splits;
  int nsplits;
  /** A summable compressor spec, "fp16" or "bf16" (float32 and float64 tensors): the input is
   *  cast down, reduced in 16 bits (with op) on the wire and cast back into output; the same on
   * every rank (else MISMATCH). NULL or "none" (the default): none; CONCORD_COMPRESSION does not
   * apply to reduce-scatter. Top-k, an unknown spec or another dtype: INVALID_ARGUMENT at enqueue.
   */
  const char* compression;
} concord_reducescatter_opts_t;

/** Options of an all-to-all. Initialise with concord_alltoall_opts_init. */
typedef struct concord_alltoall_opts {
  size_t struct_size;
  /** Rows of the first dimension this rank sends to each rank, in rank order: nsplits (the
   *  number of ranks) counts, none negative, summing to the first dimension; they may differ
   *  between ranks (alltoallv). NULL (the default): n / size rows to every rank (size must divide
   *  n). Given with nsplits other than the number of ranks (0 too): INVALID_ARGUMENT. */
  const int64_t* splits;
  int nsplits;
} concord_alltoall_opts_t;

CONCORD_API void concord_reducescatter_opts_init(concord_reducescatter_opts_t* opts);
CONCORD_API void concord_alltoall_opts_init(concord_alltoall_opts_t* opts);

/**
 * Reduce-scatter along the first dimension: every rank's input is reduced (opts->op; NULL opts:
 * sum, even split) and rank r receives rows [sum of splits before r, + splits[r]) of the result in
 * output, whose shape must be [splits[r], the input's other dimensions] with the input's dtype
 * (output->data may be NULL when that is empty). The output may overlap the input: in place,
 * output->data == input->data leaves this rank's rows at the start of the input buffer (the input
 * is read in full before the output is written; a large one is copied first). Every rank
 * must give the same dtype, shape, op, scales and splits, else every rank fails with MISMATCH
 * naming the field. Bad splits (wrong count, negative, not summing to the first dimension), a
 * scalar input or a wrong output shape are INVALID_ARGUMENT at enqueue.
 */
CONCORD_API concord_status_t concord_reducescatter_async(
    concord_comm_t comm, const char* name, const concord_tensor_t* input,
    const concord_tensor_t* output, const concord_reducescatter_opts_t* opts,
    concord_callback_t callback, void* user_data, concord_request_t* request);
CONCORD_API concord_status_t concord_reducescatter(concord_comm_t comm, const char* name,
                                                   const concord_tensor_t* input,
                                                   const concord_tensor_t* output,
                                                   const concord_reducescatter_opts_t* opts);
/**
 * All-to-all along the first dimension: this rank sends opts->splits[d] rows of its input to rank
 * d (NULL opts: the even split) and receives, in rank order, what every rank sends it. The
 * receive counts are exchanged during negotiation: concord_request_received_splits returns them,
 * concord_request_output the result (its first dimension is their sum). The other dimensions and
 * the dtype must agree on every rank (else MISMATCH). output: a buffer of output_capacity bytes,
 * or NULL to let the request own the result; a result larger than output_capacity fails this
 * rank's request with INVALID_ARGUMENT (it still takes part, so the others complete).
 */
CONCORD_API concord_status_t concord_alltoall_async(concord_comm_t comm, const char* name,
                                                    const concord_tensor_t* input, void* output,
                                                    size_t output_capacity,
                                                    const concord_alltoall_opts_t* opts,
                                                    concord_callback_t callback, void* user_data,
                                                    concord_request_t* request);
/** Blocking all-to-all into output (not NULL: nothing would hold the result); received_splits,
 *  when not NULL, receives nreceived (the number of ranks) row counts, one from each rank. */
CONCORD_API concord_status_t concord_alltoall(concord_comm_t comm, const char* name,
                                              const concord_tensor_t* input, void* output,
                                              size_t output_capacity,
                                              const concord_alltoall_opts_t* opts,
                                              int64_t* received_splits, int nreceived);
/** The rows a finished all-to-all received from each rank: n must be the number of ranks
 *  (INVALID_ARGUMENT otherwise, or for another operation); IN_PROGRESS while it runs (on CUDA
 *  tensors: until it was launched on the device, as concord_request_output); its error when it
 *  failed. */
CONCORD_API concord_status_t concord_request_received_splits(concord_request_t request,
                                                             int64_t* splits, int n);

/* ---- reduce and gather to a root (CUDA tensors too: the _ex forms below) ---- */
/** Options of a reduce. Initialise with concord_reduce_opts_init; fields may only be appended
 *  (struct_size tells which exist). */
typedef struct concord_reduce_opts {
  size_t struct_size;
  concord_reduce_op_t op; /**< default CONCORD_SUM */
  double prescale;        /**< multiplies the input first (floating dtypes only); default 1 */
  double postscale;       /**< multiplies the result (floating dtypes only); default 1 */
} concord_reduce_opts_t;

CONCORD_API void concord_reduce_opts_init(concord_reduce_opts_t* opts);

/**
 * Reduce to a root, as MPI_Reduce: every rank's input is reduced (opts->op, with the scales;
 * NULL opts: a sum) and only rank `root` receives the result, in output (NULL or output->data ==
 * input->data: in place), which must have the input's dtype, device and number of elements. On
 * every other rank `output` is ignored (it may be NULL) and left untouched; the input is only
 * read. Every rank must give the same root, dtype, shape, op and scales, else every rank fails
 * with MISMATCH naming the field and the ranks. A root outside [0, size), or an output whose data
 * is NULL on the root while the tensor has elements, is INVALID_ARGUMENT at enqueue. A joined
 * rank (concord_join) contributes the identity, as to an allreduce; a reduce whose root has
 * joined fails. Small reduces fuse with each other (whatever their roots) and run as one
 * allreduce of the fusion buffer; larger ones run alone as the backend's reduce (MPI:
 * MPI_Ireduce; Gloo, shared memory and the hierarchical backend: an allreduce into scratch memory
 * on the other ranks).
 */
CONCORD_API concord_status_t concord_reduce_async(concord_comm_t comm, const char* name,
                                                  const concord_tensor_t* input,
                                                  const concord_tensor_t* output, int root,
                                                  const concord_reduce_opts_t* opts,
                                                  concord_callback_t callback, void* user_data,
                                                  concord_request_t* request);
CONCORD_API concord_status_t concord_reduce(concord_comm_t comm, const char* name,
                                            const concord_tensor_t* input,
                                            const concord_tensor_t* output, int root,
                                            const concord_reduce_opts_t* opts);
/**
 * Gather to a root along the first dimension, as an allgather whose result only rank `root`
 * receives: every rank's rows in rank order (first dimensions may differ between ranks; the other
 * dimensions, the dtype and the root must agree, else MISMATCH). On the root, output is a buffer
 * of output_capacity bytes, or NULL to let the request own the result (concord_request_output);
 * a result larger than output_capacity fails the root's request with INVALID_ARGUMENT (it still
 * takes part). On every other rank output and output_capacity are ignored (NULL is fine) and
 * concord_request_output reports nothing (NULL, 0 bytes, first dimension 0). A root outside
 * [0, size) or a scalar input is INVALID_ARGUMENT at enqueue. A joined rank contributes no rows;
 * a gather whose root has joined fails. Small gathers complete through rank 0 during negotiation
 * like allgathers; larger ones run as MPI_Igatherv on MPI, elsewhere as an allgather into scratch
 * memory on the other ranks.
 */
CONCORD_API concord_status_t concord_gather_async(concord_comm_t comm, const char* name,
                                                  const concord_tensor_t* input, void* output,
                                                  size_t output_capacity, int root,
                                                  concord_callback_t callback, void* user_data,
                                                  concord_request_t* request);
/** Blocking gather: on the root, output must not be NULL (nothing would hold the result:
 *  INVALID_ARGUMENT); elsewhere it is ignored. */
CONCORD_API concord_status_t concord_gather(concord_comm_t comm, const char* name,
                                            const concord_tensor_t* input, void* output,
                                            size_t output_capacity, int root);

/**
 * Reduce-scatter, all-to-all, reduce and gather with device options (device_opts may be NULL), as
 * concord_allreduce_async_ex: CUDA tensors go to the GPU backend and run asynchronously (NCCL:
 * ncclReduceScatter, or one ncclReduce per rank when the splits are uneven; ncclSend and
 * ncclRecv pairs; ncclReduce; ncclSend and ncclRecv to the root). A CUDA all-to-all, and a CUDA
 * gather on its root, need an output buffer on the device (the request cannot own device
 * memory): INVALID_ARGUMENT at enqueue. Compression and deterministic mode cover CPU tensors only
 * (UNAVAILABLE). The plain forms take CUDA tensors too, ordered after the legacy default stream
 * (concord_device_opts_t).
 */
CONCORD_API concord_status_t concord_reducescatter_async_ex(
    concord_comm_t comm, const char* name, const concord_tensor_t* input,
    const concord_tensor_t* output, const concord_reducescatter_opts_t* opts,
    const concord_device_opts_t* device_opts, concord_callback_t callback, void* user_data,
    concord_request_t* request);
CONCORD_API concord_status_t concord_alltoall_async_ex(concord_comm_t comm, const char* name,
                                                       const concord_tensor_t* input, void* output,
                                                       size_t output_capacity,
                                                       const concord_alltoall_opts_t* opts,
                                                       const concord_device_opts_t* device_opts,
                                                       concord_callback_t callback, void* user_data,
                                                       concord_request_t* request);
CONCORD_API concord_status_t concord_reduce_async_ex(concord_comm_t comm, const char* name,
                                                     const concord_tensor_t* input,
                                                     const concord_tensor_t* output, int root,
                                                     const concord_reduce_opts_t* opts,
                                                     const concord_device_opts_t* device_opts,
                                                     concord_callback_t callback, void* user_data,
                                                     concord_request_t* request);
CONCORD_API concord_status_t concord_gather_async_ex(concord_comm_t comm, const char* name,
                                                     const concord_tensor_t* input, void* output,
                                                     size_t output_capacity, int root,
                                                     const concord_device_opts_t* device_opts,
                                                     concord_callback_t callback, void* user_data,
                                                     concord_request_t* request);

/**
 * This rank has run out of data (uneven epochs): until every rank has called concord_join, it
 * takes part in the operations the other ranks submit without a tensor of its own, as Horovod's
 * join: an allreduce or reduce gets the reduction's identity from it (zeros for sum and average,
 * and an average divides by the ranks that contributed), an allgather or gather no rows, a
 * broadcast's data is received and dropped, barriers complete; a broadcast, reduce or gather
 * whose root has joined, a reduce-scatter or all-to-all, operations on CUDA tensors, and
 * concord_comm_split or concord_comm_create_group (they need every rank; the refused one leaves
 * later splits matched) fail with INVALID_ARGUMENT on the ranks that called them. Blocks until
 * every rank has joined and stores the last rank to join in *last_rank (may be NULL). Not from a
 * completion callback, nor inside a group (INVALID_ARGUMENT); a failure of the job ends it with
 * that error. Joined ranks' operations are negotiated in full (not through the response cache).
 */
CONCORD_API concord_status_t concord_join(concord_comm_t comm, int* last_rank);

/**
 * Grouped submission: operations enqueued by this thread between group_start and group_end are held
 * and enqueued atomically at group_end, negotiated as one unit and fused together where their dtype
 * and op allow. Groups do not nest; each thread has its own, so several threads may have groups
 * open on one communicator at once (as with NCCL); what a completion callback enqueues never joins
 * a group, even one open on the thread that runs the callback. Every rank must enqueue the same
 * members in the same order: ranks recognise a group by its first member's name and its size, so a
 * different order fails every member with MISMATCH, and different members fail with MISMATCH or
 * never complete (the stall warning names them; CONCORD_STALL_SHUTDOWN_S fails the job with
 * TIMEOUT). When group_end fails (a name already in flight, a failed communicator), every member
 * completes with that error. A blocking call (concord_allreduce, concord_barrier, ...) inside a
 * group is refused with INVALID_ARGUMENT, since it would wait for a member that runs only at
 * group_end; so is a concord_wait or concord_request_wait_stream without a limit, from the thread
 * that opened the group, for a member before group_end (the request is untouched: wait for it after
 * group_end).
 */
CONCORD_API concord_status_t concord_group_start(concord_comm_t comm);
CONCORD_API concord_status_t concord_group_end(concord_comm_t comm);

/**
 * Ends this rank's training step: operations enqueued afterwards belong to the next step. Optional;
 * call it at the same point of every step on every rank (or on none), e.g. after waiting for the
 * step's gradients. Steps let Concord catch a rank that skipped a tensor in a step (or submitted
 * it twice): otherwise its next submission would be reduced with the others' previous one, a
 * wrong sum with no error. With steps marked, the submissions of the older step fail with MISMATCH
 * naming the tensor, the ranks and their steps, and the newer ones wait for their peers, so the
 * job stays in step. Thread-safe; cheap (an atomic increment).
 */
CONCORD_API concord_status_t concord_end_step(concord_comm_t comm);

/* ---- point to point (pipeline stages) ---- */
/**
 * Sends `tensor` to rank `peer` with `tag` (>= 0; at most (MPI_TAG_UB - 2) / 2 on
 * the MPI backend, 2^30 - 2 with Open MPI; any int64 on Gloo). Point to point is not negotiated:
 * the message (a header with dtype and shape, then the bytes) goes straight to the peer on
 * connections of its own, and no other rank takes part. Messages from one rank to another with
 * one tag arrive in the order they were sent; different tags and peers never wait for each other,
 * and any number may be in flight. The tensor's data must stay valid until the request completes
 * (on Gloo it completes once its bytes are written to the socket; on MPI once MPI completes the
 * send, which for large messages is when the peer receives them). Refused with INVALID_ARGUMENT
 * (nothing is sent) for a peer outside the communicator or this rank, a negative tag, NULL data
 * with elements. A peer that fails completes it with PEER_FAILURE naming the peer; one that does
 * not take the bytes within CONCORD_TIMEOUT_S with TIMEOUT. With more than two ranks a peer's
 * closed connection may follow a failure elsewhere (the peer exited because of it), so such an
 * operation waits for the communicator's failure and then reports its cause (the rank that
 * failed), its own peer's failure after it; without one within CONCORD_TIMEOUT_S + 1 s, or at
 * finalize, it reports its peer's failure. On MPI such a timeout (or a message
 * still arriving at a recv's timeout) closes point to point on the communicator: MPI cannot
 * withdraw a message it started, and would still read or write the buffer, so every pending and
 * later send and recv fails with that error (on Gloo such a failure stays with that peer's
 * operations). A CUDA tensor (with a GPU backend:
 * CONCORD_BACKEND auto or nccl; else UNAVAILABLE) travels through host memory: the send copies it
 * out before returning (after the work on the _ex form's ready stream and event), the recv copies
 * the message in before it completes; either end may be a CPU or a CUDA tensor.
 * Callbacks of sends and recvs run on the communicator's point-to-point thread (or on the calling
 * thread when the operation completes at once); they must not wait for requests of this
 * communicator. concord_finalize completes those still in flight with NOT_INITIALIZED and tells
 * the peers, behind what this rank sent: their recvs from it that nothing matched, and later sends
 * to it, fail at once with PEER_FAILURE saying it finalized.
 */
CONCORD_API concord_status_t concord_send_async(concord_comm_t comm, const concord_tensor_t* tensor,
                                                int peer, int64_t tag, concord_callback_t callback,
                                                void* user_data, concord_request_t* request);
/**
 * Receives the next message from rank `peer` with `tag`. With `expected` (a CPU or CUDA tensor)
 * the message lands in expected->data, and must have its dtype and shape: otherwise the request
 * fails with MISMATCH naming both, the message is consumed and dropped, and the next one on (peer,
 * tag) is received intact. With `expected` NULL the recv takes the sender's dtype and shape; the
 * request owns the bytes (concord_request_output: data, bytes, first dimension;
 * concord_request_output_shape: dtype and shape). A message that does not arrive within
 * CONCORD_TIMEOUT_S fails with TIMEOUT; a peer that fails, with PEER_FAILURE naming it (or, with
 * more than two ranks, the communicator's cause first, as for concord_send_async). Argument
 * errors as for concord_send_async.
 */
CONCORD_API concord_status_t concord_recv_async(concord_comm_t comm,
                                                const concord_tensor_t* expected, int peer,
                                                int64_t tag, concord_callback_t callback,
                                                void* user_data, concord_request_t* request);
/**
 * The same with device options (device_opts may be NULL) for a CUDA tensor: the copy out of (send)
 * or into (recv) the tensor waits for the work queued so far on device_opts->stream and for
 * device_opts->ready_event; with neither (and in the plain forms), for the legacy default stream,
 * as concord_device_opts_t says. Giving either for a CPU tensor is an INVALID_ARGUMENT.
 */
CONCORD_API concord_status_t concord_send_async_ex(concord_comm_t comm,
                                                   const concord_tensor_t* tensor, int peer,
                                                   int64_t tag,
                                                   const concord_device_opts_t* device_opts,
                                                   concord_callback_t callback, void* user_data,
                                                   concord_request_t* request);
CONCORD_API concord_status_t concord_recv_async_ex(concord_comm_t comm,
                                                   const concord_tensor_t* expected, int peer,
                                                   int64_t tag,
                                                   const concord_device_opts_t* device_opts,
                                                   concord_callback_t callback, void* user_data,
                                                   concord_request_t* request);
/** Blocking: enqueue, wait, free. concord_recv needs `expected` (there is no request to own it). */
CONCORD_API concord_status_t concord_send(concord_comm_t comm, const concord_tensor_t* tensor,
                                          int peer, int64_t tag);
CONCORD_API concord_status_t concord_recv(concord_comm_t comm, const concord_tensor_t* expected,
                                          int peer, int64_t tag);
/**
 * The dtype and shape a finished recv received (*ndim entries of shape, which must hold
 * CONCORD_MAX_DIMS). Any out-pointer may be NULL. INVALID_ARGUMENT for a request that is not a
 * recv (concord_request_error says so); IN_PROGRESS while running; the request's error if it
 * failed.
 */
CONCORD_API concord_status_t concord_request_output_shape(concord_request_t request,
                                                          concord_dtype_t* dtype, int* ndim,
                                                          int64_t* shape);

/* ---- requests ---- */
/** Blocks until the request finishes, at most timeout_s seconds (< 0: no limit; the engine's own
 *  deadlines still apply; 0: a poll; NaN: INVALID_ARGUMENT). Returns the request's final status
 *  once it finished, or CONCORD_IN_PROGRESS when the limit passed first: the request still runs,
 *  nothing is recorded on it, and it may be waited on again. CONCORD_ERR_TIMEOUT is always the
 *  operation's own failure (a deadline of the engine: CONCORD_TIMEOUT_S, the stall shutdown),
 *  never the limit of this call. Meanwhile the calling thread runs the engine's negotiation and
 *  collectives itself, unless CONCORD_WAITER_PROGRESS=0. Without a limit, INVALID_ARGUMENT at once,
 *  recorded on the request (concord_request_error), when the request is a member of a group this
 *  thread has open: only this thread's concord_group_end submits it, so the wait could never end
 *  (a limited wait returns IN_PROGRESS at its limit). */
CONCORD_API concord_status_t concord_wait(concord_request_t request, double timeout_s);
/** CONCORD_IN_PROGRESS while running, else the request's final status. Never blocks. */
CONCORD_API concord_status_t concord_test(concord_request_t request);
/** The error message of a finished request that failed; otherwise the message of the last call on
 *  this request that failed by itself (concord_request_wait_stream's, say), or empty.
 *  Kept per calling thread, like concord_comm_last_error: valid until the same thread's next call
 *  of it on this request, or until the request is freed; other threads' calls leave it alone. */
CONCORD_API const char* concord_request_error(concord_request_t request);
/**
 * Result of an allgather, a gather (on its root) or an alltoall: data (owned by the request when no
 * output buffer was given), its size in bytes and its first dimension. Any out-pointer may be NULL.
 * IN_PROGRESS while running, except for an operation on CUDA tensors, whose result is described
 * once it has been launched on the device (concord_request_wait_stream returned): the data is
 * then ready for device work ordered after it. The request's error once it failed.
 */
CONCORD_API concord_status_t concord_request_output(concord_request_t request, void** data,
                                                    size_t* bytes, int64_t* first_dim);
/** Bytes this rank put on the wire for a finished request: for an allreduce what its algorithm
 *  sends (2(n-1)/n of the encoded bytes for a ring allreduce, (n-1) times them for top-k's
 *  allgather, the inline copies through rank 0); estimates for allgather ((n-1)/n of the result)
 *  and broadcast (one copy); 0 for a barrier and with one rank. IN_PROGRESS while running;
 *  INVALID_ARGUMENT for a NULL `bytes` (concord_request_error says so). */
CONCORD_API concord_status_t concord_request_wire_bytes(concord_request_t request, uint64_t* bytes);
/**
 * For an operation on CUDA tensors, like torch's Work.wait(): makes `stream` (a cudaStream_t) wait
 * on the GPU until the operation has finished, so work queued on it afterwards sees the result.
 * Blocks the host only until the operation has been launched on the device (at most timeout_s;
 * < 0: no limit). Returns SUCCESS when the wait is queued or the operation already succeeded, the
 * operation's status when it already failed, IN_PROGRESS when the limit passed before the launch
 * (nothing queued; the request still runs: call it again), INVALID_ARGUMENT for a CPU operation or
 * a NULL stream. An error on the device after the launch is seen by concord_wait.
 */
CONCORD_API concord_status_t concord_request_wait_stream(concord_request_t request, void* stream,
                                                         double timeout_s);
/** Frees a request. A request still running is detached: it completes, then frees itself. */
CONCORD_API void concord_request_free(concord_request_t request);

/* ---- blocking conveniences: enqueue, wait, free ---- */
CONCORD_API concord_status_t concord_allreduce(concord_comm_t comm, const char* name,
                                               const concord_tensor_t* input,
                                               const concord_tensor_t* output,
                                               const concord_allreduce_opts_t* opts);
CONCORD_API concord_status_t concord_allgather(concord_comm_t comm, const char* name,
                                               const concord_tensor_t* input, void* output,
                                               size_t output_capacity);
CONCORD_API concord_status_t concord_broadcast(concord_comm_t comm, const char* name,
                                               const concord_tensor_t* input,
                                               const concord_tensor_t* output, int root);
CONCORD_API concord_status_t concord_barrier(concord_comm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* CONCORD_CONCORD_H_ */
