/*
 * The C API (include/concord/concord.h) exercised from plain C99, in one process (rank 0 of 1),
 * in the manner of LevelDB's c_test.c: every call's status is checked, invalid arguments return an
 * error, change nothing and leave a last-error message that names the problem.
 */
#define _XOPEN_SOURCE 700 /* setenv, mkdtemp, nftw */
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "concord/concord.h"
#include "tests/common/check.h"
#include "tests/common/tensors.h"

/* A phase names what the checks after it are about: failures print it first. */
static void StartPhase(const char* name) {
  CheckSetContext("%s", name);
  fprintf(stderr, "=== %s\n", name);
}

/* The last error on comm contains `part`. */
static void CheckLastError(concord_comm_t comm, const char* part) {
  const char* msg = concord_comm_last_error(comm);
  CHECKF(msg != NULL && strstr(msg, part) != NULL, "last error '%s' does not mention '%s'",
         msg ? msg : "(null)", part);
}

struct Counter {
  volatile int calls; /* written by the engine thread */
  concord_status_t last;
  concord_request_t request;
};

static void OnDone(concord_request_t request, concord_status_t status, void* user_data) {
  struct Counter* c = (struct Counter*)user_data;
  c->calls++;
  c->last = status;
  c->request = request;
}

static void TestVersionAndStrings(void) {
  int major = -1, minor = -1, patch = -1;
  concord_status_t s;
  StartPhase("version and status strings");
  concord_version(&major, &minor, &patch);
  CHECK(major == CONCORD_VERSION_MAJOR);
  CHECK(minor == CONCORD_VERSION_MINOR);
  CHECK(patch == CONCORD_VERSION_PATCH);
  concord_version(NULL, NULL, NULL); /* every out-pointer may be NULL */
  for (s = CONCORD_SUCCESS; s <= CONCORD_ERR_PROTOCOL; s = (concord_status_t)(s + 1)) {
    const char* text = concord_status_string(s);
    CHECK(text != NULL && text[0] != '\0');
    CHECK(text != NULL && strcmp(text, "unknown status") != 0);
  }
  CHECK(strcmp(concord_status_string(CONCORD_SUCCESS), "success") == 0);
  CHECK(strstr(concord_status_string(CONCORD_ERR_AUTH), "auth") != NULL);
  CHECK(strcmp(concord_status_string((concord_status_t)999), "unknown status") == 0);
  /* Distinct codes have distinct strings. */
  CHECK(strcmp(concord_status_string(CONCORD_ERR_TIMEOUT),
               concord_status_string(CONCORD_ERR_PEER_FAILURE)) != 0);
}

static void TestConfigInit(void) {
  concord_config_t c;
  concord_allreduce_opts_t o;
  StartPhase("config and options defaults");
  memset(&c, 0x5a, sizeof(c));
  concord_config_init(&c);
  CHECK(c.struct_size == sizeof(concord_config_t));
  CHECK(c.version == CONCORD_VERSION);
  CHECK(c.rank == -1 && c.size == -1 && c.local_rank == -1 && c.local_size == -1);
  CHECK(c.store == NULL && c.token == NULL && c.job_id == NULL && c.iface == NULL &&
        c.host == NULL);
  CHECK(c.fusion_threshold_bytes == -1);
  CHECK(c.cycle_time_ms == -1);
  CHECK(c.timeout_s == -1);
  CHECK(c.cache_capacity == -1);
  CHECK(c.log_level == -1);
  CHECK(c.lanes == -1 && c.waiter_progress == -1 && c.deterministic == -1);
  concord_config_init(NULL); /* no crash */
  memset(&o, 0x5a, sizeof(o));
  concord_allreduce_opts_init(&o);
  CHECK(o.struct_size == sizeof(concord_allreduce_opts_t));
  CHECK(o.op == CONCORD_SUM);
  CHECK(o.prescale == 1.0 && o.postscale == 1.0);
  concord_allreduce_opts_init(NULL);
}

/* concord_compression_check: what an allreduce's enqueue would refuse, without a communicator. */
static void TestCompressionCheck(void) {
  StartPhase("compression check");
  CHECK_STATUS(concord_compression_check(NULL, -1), CONCORD_SUCCESS);
  CHECK_STATUS(concord_compression_check("", CONCORD_INT32), CONCORD_SUCCESS);
  CHECK_STATUS(concord_compression_check("fp16", CONCORD_FLOAT64), CONCORD_SUCCESS);
  /* A 16-bit floating tensor travels as it is under a cast. */
  CHECK_STATUS(concord_compression_check("fp16", CONCORD_BFLOAT16), CONCORD_SUCCESS);
  CHECK_STATUS(concord_compression_check("bf16", CONCORD_FLOAT16), CONCORD_SUCCESS);
  CHECK_STATUS(concord_compression_check("fp16", CONCORD_INT8), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(concord_compression_check("topk:density=0.01", -1), CONCORD_SUCCESS);
  CHECK_STATUS(concord_compression_check("fp17", -1), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(NULL, "compression 'fp17': unknown compressor 'fp17'");
  CHECK_STATUS(concord_compression_check("topk:density=2", -1), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(NULL, "density");
  CHECK_STATUS(concord_compression_check("topk:density=0.1", CONCORD_FLOAT64),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(NULL, "compression 'topk:density=0.1'");
  CHECK_STATUS(concord_compression_check("fp16", 99), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(NULL, "unknown dtype 99");
}

/* init_config refuses `c` with INVALID_ARGUMENT, leaves the out-pointer alone, and its error
 * text names `what`. */
static void ExpectInitRefused(const concord_config_t* c, const char* what) {
  concord_comm_t comm = (concord_comm_t)0x1;
  CHECK_STATUS(concord_init_config(c, &comm), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(comm == (concord_comm_t)0x1);
  CHECK(strstr(concord_comm_last_error(NULL), what) != NULL);
}

static void TestInitErrors(void) {
  concord_config_t c;
  concord_comm_t comm = (concord_comm_t)0x1;
  StartPhase("init errors");
  concord_config_init(&c);
  c.rank = 0;
  c.size = 1;
  CHECK_STATUS(concord_init_config(&c, NULL), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(concord_comm_last_error(NULL), "NULL") != NULL);

  c.version = (CONCORD_VERSION_MAJOR + 1) * 10000; /* a different major version */
  CHECK_STATUS(concord_init_config(&c, &comm), CONCORD_ERR_VERSION);
  CHECK(comm == (concord_comm_t)0x1); /* unchanged */
  CheckLastError(NULL, "built for Concord 1.0.0 (concord_config_t.version 10000)");
  CheckLastError(NULL, "this library is 0.1.0");

  concord_config_init(&c);
  c.rank = 3;
  c.size = 2; /* rank outside the world */
  ExpectInitRefused(&c, "rank");

  concord_config_init(&c);
  c.rank = 0;
  c.size = 1;
  c.log_level = 9;
  ExpectInitRefused(&c, "log level");

  c.log_level = -1;
  c.waiter_progress = 2;
  ExpectInitRefused(&c, "waiter_progress");
  c.waiter_progress = 0; /* only the engine's thread makes progress: blocking calls still work */
  CHECK_STATUS(concord_init_config(&c, &comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_barrier(comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
  comm = (concord_comm_t)0x1;

  /* Operations on a NULL communicator. */
  {
    int x = 7;
    concord_request_t r = (concord_request_t)0x1;
    CHECK_STATUS(concord_comm_rank(NULL, &x), CONCORD_ERR_NOT_INITIALIZED);
    CHECK_STATUS(concord_comm_size(NULL, &x), CONCORD_ERR_NOT_INITIALIZED);
    CHECK_STATUS(concord_comm_local_rank(NULL, &x), CONCORD_ERR_NOT_INITIALIZED);
    CHECK_STATUS(concord_comm_local_size(NULL, &x), CONCORD_ERR_NOT_INITIALIZED);
    CHECK(x == 7);
    CHECK_STATUS(concord_barrier_async(NULL, NULL, NULL, &r), CONCORD_ERR_NOT_INITIALIZED);
    CHECK(r == (concord_request_t)0x1);
    CHECK_STATUS(concord_barrier(NULL), CONCORD_ERR_NOT_INITIALIZED);
    CHECK_STATUS(concord_group_start(NULL), CONCORD_ERR_NOT_INITIALIZED);
    CHECK_STATUS(concord_group_end(NULL), CONCORD_ERR_NOT_INITIALIZED);
    CHECK_STATUS(concord_finalize(NULL), CONCORD_SUCCESS); /* documented: NULL is ok */
    /* Request functions on NULL. */
    CHECK_STATUS(concord_wait(NULL, 1.0), CONCORD_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(concord_test(NULL), CONCORD_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(concord_request_output(NULL, NULL, NULL, NULL), CONCORD_ERR_INVALID_ARGUMENT);
    CHECK(concord_request_error(NULL) != NULL);
    concord_request_free(NULL);
  }
}

/* One bad concord_config_t field: where it is, its C type ('i' int, 'l' int64_t, 'd' double,
 * 's' string, 'z' size_t), the value (number or text) and what the error must say. */
struct BadField {
  size_t offset;
  char type;
  double number;
  const char* text;
  const char* says;
};

static void SetField(concord_config_t* c, const struct BadField* f) {
  char* at = (char*)c + f->offset;
  int i = (int)f->number;
  int64_t l = (int64_t)f->number;
  size_t z = (size_t)f->number;
  switch (f->type) {
    case 'i':
      memcpy(at, &i, sizeof(i));
      break;
    case 'l':
      memcpy(at, &l, sizeof(l));
      break;
    case 'd':
      memcpy(at, &f->number, sizeof(f->number));
      break;
    case 's':
      memcpy(at, &f->text, sizeof(f->text));
      break;
    case 'z':
      memcpy(at, &z, sizeof(z));
      break;
  }
}

/* A good config for one process, rank 0 of 1. */
static void SingleConfig(concord_config_t* c) {
  concord_config_init(c);
  c->rank = 0;
  c->size = 1;
  c->timeout_s = 20;
}

/* After a refusal, a good init works and the communicator runs. */
static void ExpectGoodInitWorks(const char* after) {
  concord_config_t c;
  concord_comm_t comm = NULL;
  int32_t v = 3;
  int64_t shape[1] = {1};
  concord_tensor_t t = CpuTensor(&v, CONCORD_INT32, 1, shape);
  SingleConfig(&c);
  CHECKF(concord_init_config(&c, &comm) == CONCORD_SUCCESS, "a good init after %s: %s", after,
         concord_comm_last_error(NULL));
  if (comm == NULL) return;
  CHECK_STATUS(concord_allreduce(comm, "after", &t, NULL, NULL), CONCORD_SUCCESS);
  CHECK(v == 3);
  CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
}

/* Every bad value of a concord_config_t field, and of the variables behind them, is refused at
 * init with INVALID_ARGUMENT and a message naming the field or variable, the value and what is
 * accepted; the out-pointer is untouched (nothing was made: under ASan or valgrind nothing
 * leaks), and a good init afterwards works. */
static void TestBadConfigValues(void) {
  static const struct BadField fields[] = {
      {offsetof(concord_config_t, struct_size), 'z', 0, NULL,
       "concord_config_t.struct_size is 0; prepare the config with concord_config_init()"},
      {offsetof(concord_config_t, struct_size), 'z', 4, NULL,
       "concord_config_t.struct_size is 4, not the size of any concord_config_t"},
      {offsetof(concord_config_t, struct_size), 'z', 1e9, NULL,
       "concord_config_t.struct_size is 1000000000, not the size of any concord_config_t"},
      /* ends inside the store pointer: half of it would be read */
      {offsetof(concord_config_t, struct_size), 'z', offsetof(concord_config_t, store) + 4, NULL,
       "not the size of any concord_config_t (this library's is"},
      {offsetof(concord_config_t, version), 'i', 0, NULL,
       "concord_config_t.version is 0, not a Concord version"},
      {offsetof(concord_config_t, timeout_s), 'd', 0, NULL,
       "concord_config_t.timeout_s = 0: the timeout must be in (0, 86400] seconds"},
      {offsetof(concord_config_t, timeout_s), 'd', -5, NULL,
       "concord_config_t.timeout_s = -5: the timeout must be in (0, 86400] seconds"},
      {offsetof(concord_config_t, timeout_s), 'd', NAN, NULL, "concord_config_t.timeout_s = nan"},
      {offsetof(concord_config_t, timeout_s), 'd', INFINITY, NULL,
       "concord_config_t.timeout_s = inf"},
      {offsetof(concord_config_t, cycle_time_ms), 'd', -2, NULL,
       "concord_config_t.cycle_time_ms = -2: the cycle time must be in [0, 60000] ms"},
      {offsetof(concord_config_t, cycle_time_ms), 'd', NAN, NULL,
       "concord_config_t.cycle_time_ms = nan"},
      {offsetof(concord_config_t, fusion_threshold_bytes), 'l', -5, NULL,
       "concord_config_t.fusion_threshold_bytes = -5: the fusion threshold must be >= 0 bytes"},
      {offsetof(concord_config_t, direct_threshold_bytes), 'l', -2, NULL,
       "concord_config_t.direct_threshold_bytes = -2: the direct threshold must be >= 0 bytes"},
      {offsetof(concord_config_t, inline_threshold_bytes), 'l', 262145, NULL,
       "concord_config_t.inline_threshold_bytes = 262145: the inline threshold must be in [0, "
       "262144] bytes"},
      {offsetof(concord_config_t, inline_threshold_bytes), 'l', -7, NULL,
       "concord_config_t.inline_threshold_bytes = -7"},
      {offsetof(concord_config_t, cache_capacity), 'i', -3, NULL,
       "concord_config_t.cache_capacity = -3: the response cache capacity must be >= 0"},
      {offsetof(concord_config_t, lanes), 'i', 0, NULL,
       "concord_config_t.lanes = 0: the number of lanes must be in [1, 8]"},
      {offsetof(concord_config_t, lanes), 'i', 99, NULL, "concord_config_t.lanes = 99"},
      {offsetof(concord_config_t, log_level), 'i', 9, NULL,
       "concord_config_t.log_level = 9: the log level must be 0 (errors)"},
      {offsetof(concord_config_t, waiter_progress), 'i', 2, NULL,
       "concord_config_t.waiter_progress = 2: must be -1 (the environment's), 0 or 1"},
      {offsetof(concord_config_t, deterministic), 'i', 2, NULL,
       "concord_config_t.deterministic = 2: must be -1 (the environment's), 0 or 1"},
      {offsetof(concord_config_t, rank), 'i', 3, NULL,
       "concord_config_t.rank = 3: the rank must be in [0, 1) (the size, from "
       "concord_config_t.size)"},
      {offsetof(concord_config_t, rank), 'i', -5, NULL, "concord_config_t.rank = -5"},
      {offsetof(concord_config_t, size), 'i', 0, NULL,
       "concord_config_t.size = 0: the number of ranks must be >= 1"},
      {offsetof(concord_config_t, local_size), 'i', -4, NULL,
       "concord_config_t.local_size = -4: the number of ranks on this host must be >= 1"},
      {offsetof(concord_config_t, backend), 's', 0, "nccl-ish",
       "concord_config_t.backend = 'nccl-ish': not a backend; use gloo, gloo-ibverbs, mpi, nccl "
       "or auto"},
      {offsetof(concord_config_t, backend), 's', 0, "", "concord_config_t.backend = ''"},
      {offsetof(concord_config_t, compression), 's', 0, "zstd:level=99",
       "concord_config_t.compression = 'zstd:level=99': unknown compressor 'zstd' (known: none, "
       "fp16, bf16, topk)"},
      {offsetof(concord_config_t, compression), 's', 0, "topk:density=0",
       "concord_config_t.compression = 'topk:density=0'"},
      {offsetof(concord_config_t, compression), 's', 0, "fp16,bf16",
       "concord_config_t.compression = 'fp16,bf16': unknown compressor 'fp16,bf16'"},
  };
  /* Variables: read at init, refused there too, named as variables. */
  static const char* const variables[][3] = {
      {"CONCORD_COMPRESSION", "bogus",
       "CONCORD_COMPRESSION = 'bogus': unknown compressor 'bogus' (known: none, fp16, bf16, "
       "topk)"},
      {"CONCORD_COMPRESSION", "zstd:level=99", "CONCORD_COMPRESSION = 'zstd:level=99'"},
      {"CONCORD_TIMEOUT_S", "-1", "CONCORD_TIMEOUT_S = -1: the timeout must be in (0, 86400]"},
      {"CONCORD_TIMEOUT_S", "nan",
       "environment variable CONCORD_TIMEOUT_S='nan' is not a finite "
       "number"},
      {"CONCORD_STALL_WARNING_S", "0",
       "CONCORD_STALL_WARNING_S = 0: the stall warning time must "
       "be in (0, 86400] seconds"},
      {"CONCORD_STALL_SHUTDOWN_S", "-3", "CONCORD_STALL_SHUTDOWN_S = -3"},
      {"CONCORD_FUSION_THRESHOLD", "-1", "CONCORD_FUSION_THRESHOLD = -1"},
      {"CONCORD_DIRECT_THRESHOLD", "-1", "CONCORD_DIRECT_THRESHOLD = -1"},
      {"CONCORD_INLINE_THRESHOLD", "999999", "CONCORD_INLINE_THRESHOLD = 999999"},
      {"CONCORD_CACHE_CAPACITY", "-1", "CONCORD_CACHE_CAPACITY = -1"},
      {"CONCORD_LANES", "12", "CONCORD_LANES = 12: the number of lanes must be in [1, 8]"},
      {"CONCORD_LANES", "99999999999",
       "CONCORD_LANES='99999999999' is out of range for a 32-bit "
       "integer"},
      {"CONCORD_BACKEND", "glo", "CONCORD_BACKEND = 'glo': not a backend"},
      {"CONCORD_GLOO_ALGORITHM", "bcube", "CONCORD_GLOO_ALGORITHM = 'bcube'"},
      {"CONCORD_WAITER_PROGRESS", "yes", "CONCORD_WAITER_PROGRESS='yes' is not an integer"},
  };
  size_t k;
  StartPhase("bad config values");
  for (k = 0; k < sizeof(fields) / sizeof(fields[0]); ++k) {
    concord_config_t c;
    concord_comm_t comm = (concord_comm_t)0x1;
    concord_status_t s;
    SingleConfig(&c);
    SetField(&c, &fields[k]);
    s = concord_init_config(&c, &comm);
    CHECKF(s == CONCORD_ERR_INVALID_ARGUMENT, "case %u (%s): status %s", (unsigned)k,
           fields[k].says, concord_status_string(s));
    CHECK(comm == (concord_comm_t)0x1);
    CHECKF(strstr(concord_comm_last_error(NULL), fields[k].says) != NULL,
           "case %u: the error '%s' does not say '%s'", (unsigned)k, concord_comm_last_error(NULL),
           fields[k].says);
  }
  ExpectGoodInitWorks("bad fields");
  for (k = 0; k < sizeof(variables) / sizeof(variables[0]); ++k) {
    concord_config_t c;
    concord_comm_t comm = (concord_comm_t)0x1;
    concord_status_t s;
    SingleConfig(&c);
    if (strcmp(variables[k][0], "CONCORD_TIMEOUT_S") == 0) c.timeout_s = -1; /* the variable's */
    setenv(variables[k][0], variables[k][1], 1);
    s = concord_init_config(&c, &comm);
    unsetenv(variables[k][0]);
    CHECKF(s == CONCORD_ERR_INVALID_ARGUMENT, "%s=%s: status %s", variables[k][0], variables[k][1],
           concord_status_string(s));
    CHECK(comm == (concord_comm_t)0x1);
    CHECKF(strstr(concord_comm_last_error(NULL), variables[k][2]) != NULL,
           "%s=%s: the error '%s' does not say '%s'", variables[k][0], variables[k][1],
           concord_comm_last_error(NULL), variables[k][2]);
  }
  /* concord_init reads the same variables. */
  {
    concord_comm_t comm = (concord_comm_t)0x1;
    setenv("CONCORD_COMPRESSION", "bogus", 1);
    CHECK_STATUS(concord_init(&comm), CONCORD_ERR_INVALID_ARGUMENT);
    unsetenv("CONCORD_COMPRESSION");
    CHECK(comm == (concord_comm_t)0x1);
    CheckLastError(NULL, "CONCORD_COMPRESSION = 'bogus': unknown compressor 'bogus'");
  }
  /* A field wins over its variable: a good field hides a bad-range variable... */
  {
    concord_config_t c;
    concord_comm_t comm = NULL;
    SingleConfig(&c);
    c.compression = "fp16";
    setenv("CONCORD_COMPRESSION", "bogus", 1);
    CHECK_STATUS(concord_init_config(&c, &comm), CONCORD_SUCCESS);
    unsetenv("CONCORD_COMPRESSION");
    CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
  }
  ExpectGoodInitWorks("bad variables");
}

static concord_comm_t InitSingle(void) {
  concord_config_t c;
  concord_comm_t comm = NULL;
  concord_config_init(&c);
  c.rank = 0;
  c.size = 1;
  c.local_rank = 0;
  c.local_size = 1;
  c.timeout_s = 20;
  CHECK_STATUS(concord_init_config(&c, &comm), CONCORD_SUCCESS);
  if (comm == NULL) {
    fprintf(stderr, "init failed: %s\n", concord_comm_last_error(NULL));
    exit(1);
  }
  return comm;
}

static void TestGetters(concord_comm_t comm) {
  int v = -5;
  StartPhase("getters");
  CHECK_STATUS(concord_comm_rank(comm, &v), CONCORD_SUCCESS);
  CHECK(v == 0);
  CHECK_STATUS(concord_comm_size(comm, &v), CONCORD_SUCCESS);
  CHECK(v == 1);
  CHECK_STATUS(concord_comm_local_rank(comm, &v), CONCORD_SUCCESS);
  CHECK(v == 0);
  CHECK_STATUS(concord_comm_local_size(comm, &v), CONCORD_SUCCESS);
  CHECK(v == 1);
  CHECK(strcmp(concord_comm_last_error(comm), "") == 0); /* no error yet */
  CHECK_STATUS(concord_comm_rank(comm, NULL), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "NULL");
  CHECK_STATUS(concord_comm_size(comm, NULL), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(concord_comm_local_rank(comm, NULL), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(concord_comm_local_size(comm, NULL), CONCORD_ERR_INVALID_ARGUMENT);
}

/* The scratch memory a fused group and an owned allgather leave: a fused group packs into a lane's
 * fusion buffer (scratch_bytes), and an allgather's result the request owned, once freed, is kept
 * for reuse (kept_result_bytes). The figures move after each response list: barriers' lists follow.
 */
static void AllocateScratch(concord_comm_t comm, size_t elements) {
  enum { kFused = 4 };
  float* data = (float*)calloc(kFused * elements, sizeof(float));
  int64_t shape[1];
  concord_request_t r[kFused];
  char name[32];
  void* gathered = NULL;
  size_t bytes = 0;
  int i;
  shape[0] = (int64_t)elements;
  CHECK(data != NULL);
  CHECK_STATUS(concord_group_start(comm), CONCORD_SUCCESS);
  for (i = 0; i < kFused; ++i) {
    concord_tensor_t t = CpuTensor(data + i * elements, CONCORD_FLOAT32, 1, shape);
    snprintf(name, sizeof(name), "stats.fused%d", i);
    CHECK_STATUS(concord_allreduce_async(comm, name, &t, NULL, NULL, NULL, NULL, &r[i]),
                 CONCORD_SUCCESS);
  }
  CHECK_STATUS(concord_group_end(comm), CONCORD_SUCCESS);
  for (i = 0; i < kFused; ++i) {
    CHECK_STATUS(concord_wait(r[i], 10), CONCORD_SUCCESS);
    concord_request_free(r[i]);
  }
  {
    concord_tensor_t t = CpuTensor(data, CONCORD_FLOAT32, 1, shape);
    CHECK_STATUS(concord_allgather_async(comm, "stats.owned", &t, NULL, 0, NULL, NULL, &r[0]),
                 CONCORD_SUCCESS);
    CHECK_STATUS(concord_wait(r[0], 10), CONCORD_SUCCESS);
    CHECK_STATUS(concord_request_output(r[0], &gathered, &bytes, NULL), CONCORD_SUCCESS);
    CHECK(gathered != NULL && bytes == elements * sizeof(float));
    concord_request_free(r[0]);
  }
  CHECK_STATUS(concord_barrier(comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_barrier(comm), CONCORD_SUCCESS);
  free(data);
}

/* The counters: refused without room for one or with a size that ends inside one; an older
 * caller's smaller struct gets only the fields it has (one from before the scratch figures
 * too: they stay as they were); a repeated name is served by the response cache; the scratch
 * memory shows. */
static void TestStats(concord_comm_t comm) {
  const size_t elements = 16 * 1024; /* 64 KiB: under the direct threshold, so fused */
  concord_stats_t s, before;
  float x[2] = {1, 2};
  int64_t shape[1] = {2};
  concord_tensor_t t = {x, CONCORD_FLOAT32, 1, shape, CONCORD_DEVICE_CPU};
  int i;
  StartPhase("stats");
  CHECK_STATUS(concord_comm_stats(comm, NULL), CONCORD_ERR_INVALID_ARGUMENT);
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(size_t);
  CHECK_STATUS(concord_comm_stats(comm, &s), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "struct_size");
  s.struct_size = offsetof(concord_stats_t, responses_full) + 4; /* ends inside a counter */
  CHECK_STATUS(concord_comm_stats(comm, &s), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "not the size of any concord_stats_t");
  CHECK_STATUS(concord_comm_stats(NULL, &s), CONCORD_ERR_NOT_INITIALIZED);
  memset(&before, 0, sizeof(before));
  before.struct_size = sizeof(before);
  CHECK_STATUS(concord_comm_stats(comm, &before), CONCORD_SUCCESS);
  for (i = 0; i < 3; ++i) {
    CHECK_STATUS(concord_allreduce(comm, "stats.repeated", &t, NULL, NULL), CONCORD_SUCCESS);
  }
  memset(&s, 0xAB, sizeof(s));
  s.struct_size = offsetof(concord_stats_t, responses_full); /* responses_cached only */
  CHECK_STATUS(concord_comm_stats(comm, &s), CONCORD_SUCCESS);
  CHECKF(s.responses_cached >= before.responses_cached + 2, "%llu cached, %llu before",
         (unsigned long long)s.responses_cached, (unsigned long long)before.responses_cached);
  CHECK(s.responses_full == 0xABABABABABABABABull); /* beyond its struct_size: untouched */
  s.struct_size = sizeof(s);
  CHECK_STATUS(concord_comm_stats(comm, &s), CONCORD_SUCCESS);
  CHECK(s.response_lists >= before.response_lists + 3);
  CHECK(s.cache_evictions == 0);

  AllocateScratch(comm, elements);
  memset(&s, 0xAB, sizeof(s));
  s.struct_size = offsetof(concord_stats_t, scratch_bytes); /* a caller built before them */
  CHECK_STATUS(concord_comm_stats(comm, &s), CONCORD_SUCCESS);
  CHECK(s.topk_residual_evictions != 0xABABABABABABABABull); /* its last field: filled */
  CHECK(s.scratch_bytes == 0xABABABABABABABABull && s.kept_result_bytes == 0xABABABABABABABABull &&
        s.scratch_reallocations == 0xABABABABABABABABull);
  s.struct_size = sizeof(s);
  CHECK_STATUS(concord_comm_stats(comm, &s), CONCORD_SUCCESS);
  CHECKF(s.scratch_bytes >= 4 * elements * sizeof(float), "%llu scratch bytes",
         (unsigned long long)s.scratch_bytes);
  CHECK(s.scratch_reallocations >= 1);
  CHECKF(s.kept_result_bytes >= elements * sizeof(float), "%llu kept result bytes",
         (unsigned long long)s.kept_result_bytes);
}

/* concord_comm_metrics: the length query, a buffer too small (untouched), the JSON itself. */
static void TestMetrics(concord_comm_t comm) {
  char small[8];
  char* json;
  size_t length = 0, again = 0;
  StartPhase("metrics");
  CHECK_STATUS(concord_comm_metrics(comm, NULL, 0, NULL), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "length");
  CHECK_STATUS(concord_comm_metrics(comm, NULL, 16, &length), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(concord_comm_metrics(NULL, NULL, 0, &length), CONCORD_ERR_NOT_INITIALIZED);
  CHECK_STATUS(concord_comm_metrics(comm, NULL, 0, &length), CONCORD_SUCCESS);
  CHECKF(length > 100, "%zu bytes of metrics", length);
  memset(small, 'x', sizeof(small));
  CHECK_STATUS(concord_comm_metrics(comm, small, sizeof(small), &again),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "bytes");
  /* The size needed now (the JSON's numbers change length as the counters move, so it need not
     equal the first query's), and the short buffer untouched. */
  CHECK(again > sizeof(small) && small[0] == 'x' && small[7] == 'x');
  json = (char*)malloc(again + 4096);
  CHECK(json != NULL);
  CHECK_STATUS(concord_comm_metrics(comm, json, again + 4096, &length), CONCORD_SUCCESS);
  CHECK(strlen(json) == length && json[0] == '{' && json[length - 1] == '}');
  CHECK(strstr(json, "\"operations\":[") != NULL && strstr(json, "\"stats.repeated\"") == NULL);
  CHECK(strstr(json, "\"op\":\"allreduce\",\"dtype\":\"float32\"") != NULL);
  /* TestStats left scratch memory: the counters have it, not 0. */
  CHECK(strstr(json, "\"scratch_bytes\":") != NULL && strstr(json, "\"scratch_bytes\":0,") == NULL);
  CHECK(strstr(json, "\"kept_result_bytes\":") != NULL);
  free(json);
}

/* One invalid allreduce: the expected status, the last error mentions `part`, no request. */
static void BadAllreduce(concord_comm_t comm, const char* name, const concord_tensor_t* in,
                         const concord_tensor_t* out, const concord_allreduce_opts_t* o,
                         concord_status_t want, const char* part) {
  concord_request_t r = (concord_request_t)0x1;
  CHECK_STATUS(concord_allreduce_async(comm, name, in, out, o, NULL, NULL, &r), want);
  CHECK(r == (concord_request_t)0x1);
  CheckLastError(comm, part);
}

static void TestInvalidArguments(concord_comm_t comm) {
  float x[4] = {1, 2, 3, 4};
  const float orig[4] = {1, 2, 3, 4};
  int32_t xi[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  int64_t negative[2] = {2, -3};
  int64_t big[2] = {2, 5};
  concord_tensor_t t = CpuTensor(x, CONCORD_FLOAT32, 1, shape);
  concord_tensor_t ti = CpuTensor(xi, CONCORD_INT32, 1, shape);
  concord_tensor_t bad;
  concord_allreduce_opts_t o;
  concord_request_t r = (concord_request_t)0x1;
  StartPhase("invalid arguments");

  BadAllreduce(comm, NULL, &t, NULL, NULL, CONCORD_ERR_INVALID_ARGUMENT, "name");
  BadAllreduce(comm, "", &t, NULL, NULL, CONCORD_ERR_INVALID_ARGUMENT, "name");
  BadAllreduce(comm, "t", NULL, NULL, NULL, CONCORD_ERR_INVALID_ARGUMENT, "NULL");
  BadAllreduce(comm, "__concord.reserved", &t, NULL, NULL, CONCORD_ERR_INVALID_ARGUMENT,
               "reserved");
  CHECK_STATUS(concord_allreduce_async(comm, "t", &t, NULL, NULL, NULL, NULL, NULL),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "request");

  bad = t;
  bad.dtype = (concord_dtype_t)42;
  BadAllreduce(comm, "t.dtype", &bad, NULL, NULL, CONCORD_ERR_INVALID_ARGUMENT, "dtype");
  bad = t;
  bad.ndim = -1;
  BadAllreduce(comm, "t.ndim", &bad, NULL, NULL, CONCORD_ERR_INVALID_ARGUMENT, "ndim");
  bad.ndim = CONCORD_MAX_DIMS + 1;
  BadAllreduce(comm, "t.ndim", &bad, NULL, NULL, CONCORD_ERR_INVALID_ARGUMENT, "ndim");
  bad = t;
  bad.shape = NULL;
  BadAllreduce(comm, "t.shape", &bad, NULL, NULL, CONCORD_ERR_INVALID_ARGUMENT, "shape");
  bad = t;
  bad.ndim = 2;
  bad.shape = negative;
  BadAllreduce(comm, "t.negative", &bad, NULL, NULL, CONCORD_ERR_INVALID_ARGUMENT, "negative");
  bad = t;
  bad.data = NULL;
  BadAllreduce(comm, "t.nodata", &bad, NULL, NULL, CONCORD_ERR_INVALID_ARGUMENT, "NULL");
  bad = t;
  bad.device = 0;
  BadAllreduce(comm, "t.device", &bad, NULL, NULL, CONCORD_ERR_UNAVAILABLE, "device");

  concord_allreduce_opts_init(&o);
  o.op = (concord_reduce_op_t)17;
  BadAllreduce(comm, "t.op", &t, NULL, &o, CONCORD_ERR_INVALID_ARGUMENT, "reduce op");
  concord_allreduce_opts_init(&o);
  o.struct_size = 1;
  BadAllreduce(comm, "t.opts", &t, NULL, &o, CONCORD_ERR_INVALID_ARGUMENT, "struct_size");
  /* A struct_size that ends inside a field (half of the compression pointer) is no version's
   * size: refused, never half-copied into a wild pointer. */
  concord_allreduce_opts_init(&o);
  o.compression = "fp16";
  o.struct_size = offsetof(concord_allreduce_opts_t, compression) + 4;
  BadAllreduce(comm, "t.opts", &t, NULL, &o, CONCORD_ERR_INVALID_ARGUMENT, "not a multiple of 8");
  {
    concord_reducescatter_opts_t rs;
    concord_reducescatter_opts_init(&rs);
    rs.compression = "fp16";
    rs.struct_size = offsetof(concord_reducescatter_opts_t, compression) + 4;
    CHECK_STATUS(concord_reducescatter(comm, "t.rs.opts", &t, &t, &rs),
                 CONCORD_ERR_INVALID_ARGUMENT);
    CheckLastError(comm, "reducescatter options: struct_size");
  }
  concord_allreduce_opts_init(&o);
  o.prescale = 2.0;
  BadAllreduce(comm, "t.intscale", &ti, NULL, &o, CONCORD_ERR_INVALID_ARGUMENT, "scale");
  concord_allreduce_opts_init(&o);
  o.postscale = 0.5;
  BadAllreduce(comm, "t.intscale", &ti, NULL, &o, CONCORD_ERR_INVALID_ARGUMENT, "scale");
  concord_allreduce_opts_init(&o);
  o.postscale = HUGE_VAL;
  BadAllreduce(comm, "t.infscale", &t, NULL, &o, CONCORD_ERR_INVALID_ARGUMENT, "finite");

  /* An output that does not match the input. */
  bad = t;
  bad.ndim = 2;
  bad.shape = big;
  BadAllreduce(comm, "t.out", &t, &bad, NULL, CONCORD_ERR_INVALID_ARGUMENT, "elements");
  bad = t;
  bad.dtype = CONCORD_FLOAT64;
  BadAllreduce(comm, "t.out", &t, &bad, NULL, CONCORD_ERR_INVALID_ARGUMENT, "dtype");

  /* Broadcast: a bad root. */
  CHECK_STATUS(concord_broadcast_async(comm, "b.root", &t, NULL, 1, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "root");
  CHECK_STATUS(concord_broadcast_async(comm, "b.root", &t, NULL, -1, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "root");
  CHECK_STATUS(concord_broadcast(comm, "b.root", &t, NULL, 5), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(r == (concord_request_t)0x1);

  /* Reduce and gather: a bad root, a NULL output on the root, a scalar gather; a blocking
   * gather needs an output on its root. */
  CHECK_STATUS(concord_reduce_async(comm, "rd.root", &t, NULL, 1, NULL, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "root 1 is outside [0, 1)");
  CHECK_STATUS(concord_reduce(comm, "rd.root", &t, NULL, -1, NULL), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "root");
  bad = t;
  bad.data = NULL;
  CHECK_STATUS(concord_reduce_async(comm, "rd.null", &t, &bad, 0, NULL, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "output data is NULL on the root");
  CHECK_STATUS(concord_gather_async(comm, "ga.root", &t, NULL, 0, 2, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "root 2");
  CHECK_STATUS(concord_gather(comm, "ga.null", &t, NULL, 0, 0), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "output is NULL on the root");
  bad = t;
  bad.ndim = 0;
  CHECK_STATUS(concord_gather_async(comm, "ga.scalar", &bad, NULL, 0, 0, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "dimension");
  CHECK(r == (concord_request_t)0x1);

  /* Allgather of a scalar (no first dimension). */
  bad = t;
  bad.ndim = 0;
  CHECK_STATUS(concord_allgather_async(comm, "g.scalar", &bad, NULL, 0, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "dimension");
  CHECK(r == (concord_request_t)0x1);

  /* Barrier: NULL out-pointer. */
  CHECK_STATUS(concord_barrier_async(comm, NULL, NULL, NULL), CONCORD_ERR_INVALID_ARGUMENT);

  /* Nothing was changed: the data is intact and nothing is in flight (every name is free). */
  CHECK(memcmp(x, orig, sizeof(x)) == 0);
  CHECK_STATUS(concord_allreduce(comm, "t", &t, NULL, NULL), CONCORD_SUCCESS);
  CHECK(memcmp(x, orig, sizeof(x)) == 0); /* a sum over one rank */

  /* Groups: end without start; start twice. */
  CHECK_STATUS(concord_group_end(comm), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "group");
  CHECK_STATUS(concord_group_start(comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_group_start(comm), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "nest");
  /* A blocking call would wait for a member that runs only at group_end (tests/fuzz found it). */
  CHECK_STATUS(concord_allreduce(comm, "t", &t, NULL, NULL), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "blocking call inside a group");
  CHECK_STATUS(concord_barrier(comm), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(concord_group_end(comm), CONCORD_SUCCESS); /* an empty group */
}

/* Waits 50 ms for the request given, from a thread other than the group's. */
static void* WaitBriefly(void* request) {
  return (void*)(intptr_t)concord_wait((concord_request_t)request, 0.05);
}

static void TestInFlightName(concord_comm_t comm) {
  float x[2] = {1, 2}, y[2] = {3, 4};
  int64_t shape[1] = {2};
  concord_tensor_t tx = CpuTensor(x, CONCORD_FLOAT32, 1, shape);
  concord_tensor_t ty = CpuTensor(y, CONCORD_FLOAT32, 1, shape);
  concord_request_t r1 = NULL, r2 = (concord_request_t)0x1, r3 = NULL;
  struct Counter c1 = {0, CONCORD_IN_PROGRESS, NULL};
  StartPhase("a name already in flight");
  /* Inside a group nothing runs until group_end, so the first request is surely in flight. */
  CHECK_STATUS(concord_group_start(comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_allreduce_async(comm, "dup", &tx, NULL, NULL, OnDone, &c1, &r1),
               CONCORD_SUCCESS);
  CHECK_STATUS(concord_allreduce_async(comm, "dup", &ty, NULL, NULL, NULL, NULL, &r2),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "dup");
  CHECK(r2 == (concord_request_t)0x1);
  CHECK(concord_test(r1) == CONCORD_IN_PROGRESS);
  CHECK(c1.calls == 0);
  /* Waiting for a member from the thread whose group holds it would never end: refused at once,
   * the request untouched. Another thread may wait (group_end may come meanwhile). */
  CHECK_STATUS(concord_wait(r1, -1), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(concord_request_error(r1), "'dup' is in the group this thread has open") != NULL);
  {
    pthread_t other;
    void* waited = NULL;
    CHECK(pthread_create(&other, NULL, WaitBriefly, r1) == 0);
    CHECK(pthread_join(other, &waited) == 0);
    CHECK((concord_status_t)(intptr_t)waited == CONCORD_IN_PROGRESS);
  }
  CHECK(concord_test(r1) == CONCORD_IN_PROGRESS);
  CHECK(c1.calls == 0);
  CHECK_STATUS(concord_group_end(comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_wait(r1, 10), CONCORD_SUCCESS);
  CHECK(c1.calls == 1 && c1.last == CONCORD_SUCCESS && c1.request == r1);
  concord_request_free(r1);
  /* Once finished, the name may be used again. */
  CHECK_STATUS(concord_allreduce_async(comm, "dup", &ty, NULL, NULL, NULL, NULL, &r3),
               CONCORD_SUCCESS);
  CHECK_STATUS(concord_wait(r3, 10), CONCORD_SUCCESS);
  concord_request_free(r3);
  CHECK(y[0] == 3 && y[1] == 4);
}

/* A wait whose limit passes returns IN_PROGRESS and leaves the request as it was: still running,
 * waitable again, no error recorded on it. (TIMEOUT is only ever an operation's own failure: see
 * TestWaitOnATimedOutOperation.) */
static void TestWaitLimit(concord_comm_t comm) {
  float x[3] = {1, 2, 3};
  int64_t shape[1] = {3};
  concord_tensor_t t = CpuTensor(x, CONCORD_FLOAT32, 1, shape);
  concord_request_t r = NULL;
  struct Counter c = {0, CONCORD_IN_PROGRESS, NULL};
  StartPhase("a wait whose limit passes");
  /* Held in an open group, the request cannot finish before group_end. */
  CHECK_STATUS(concord_group_start(comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_allreduce_async(comm, "held.wait", &t, NULL, NULL, OnDone, &c, &r),
               CONCORD_SUCCESS);
  CHECK_STATUS(concord_wait(r, 0.05), CONCORD_IN_PROGRESS);
  CHECK_STATUS(concord_wait(r, 0), CONCORD_IN_PROGRESS); /* 0: a poll */
  CHECK_STATUS(concord_test(r), CONCORD_IN_PROGRESS);
  CHECK(strcmp(concord_request_error(r), "") == 0); /* not a failure of anything */
  CHECK(c.calls == 0);
  CHECK_STATUS(concord_group_end(comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_wait(r, 10), CONCORD_SUCCESS); /* the same request, waited on again */
  CHECK_STATUS(concord_wait(r, 0), CONCORD_SUCCESS);  /* finished: its status at once */
  CHECK(c.calls == 1 && c.last == CONCORD_SUCCESS);
  CHECK(x[0] == 1 && x[2] == 3);
  CHECK_STATUS(concord_wait(r, NAN), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(concord_request_error(r), "NaN") != NULL); /* says why */
  concord_request_free(r);
}

static void TestAsync(concord_comm_t comm) {
  enum { N = 16 };
  double a[N][8];
  double out[8];
  int64_t shape[1] = {8};
  concord_request_t reqs[N];
  struct Counter counters[N];
  concord_allreduce_opts_t o;
  concord_tensor_t t, to;
  char name[32];
  int i, j;
  StartPhase("async with wait, test, callbacks");
  concord_allreduce_opts_init(&o);
  o.prescale = 0.5;
  o.postscale = 4.0;
  for (i = 0; i < N; ++i) {
    for (j = 0; j < 8; ++j) a[i][j] = i + j;
    counters[i].calls = 0;
    counters[i].last = CONCORD_IN_PROGRESS;
    counters[i].request = NULL;
    t = CpuTensor(a[i], CONCORD_FLOAT64, 1, shape);
    sprintf(name, "async.%d", i);
    CHECK_STATUS(concord_allreduce_async(comm, name, &t, NULL, i % 2 ? &o : NULL, OnDone,
                                         &counters[i], &reqs[i]),
                 CONCORD_SUCCESS);
  }
  for (i = 0; i < N; ++i) {
    if (i % 2) {
      concord_status_t s;
      int spins = 0;
      while ((s = concord_test(reqs[i])) == CONCORD_IN_PROGRESS && spins < 2000000) ++spins;
      CHECK_STATUS(s, CONCORD_SUCCESS);
      CHECK_STATUS(concord_wait(reqs[i], 10), CONCORD_SUCCESS);
    } else {
      CHECK_STATUS(concord_wait(reqs[i], 10), CONCORD_SUCCESS);
      CHECK_STATUS(concord_test(reqs[i]), CONCORD_SUCCESS); /* stays finished */
    }
    CHECK(strcmp(concord_request_error(reqs[i]), "") == 0);
    CHECK(counters[i].calls == 1);
    CHECK(counters[i].last == CONCORD_SUCCESS);
    CHECK(counters[i].request == reqs[i]);
    for (j = 0; j < 8; ++j) CHECK(a[i][j] == (i % 2 ? 2.0 * (i + j) : (double)(i + j)));
    concord_request_free(reqs[i]);
  }
  /* Out of place: the input stays, the output gets the result. */
  for (j = 0; j < 8; ++j) out[j] = -1;
  t = CpuTensor(a[0], CONCORD_FLOAT64, 1, shape);
  to = CpuTensor(out, CONCORD_FLOAT64, 1, shape);
  CHECK_STATUS(concord_allreduce(comm, "outofplace", &t, &to, &o), CONCORD_SUCCESS);
  for (j = 0; j < 8; ++j) {
    CHECK(out[j] == 2.0 * j);
    CHECK(a[0][j] == (double)j);
  }
  /* concord_wait with a zero timeout on a finished request. */
  {
    concord_request_t r;
    CHECK_STATUS(concord_barrier_async(comm, NULL, NULL, &r), CONCORD_SUCCESS);
    CHECK_STATUS(concord_wait(r, -1), CONCORD_SUCCESS);
    CHECK_STATUS(concord_wait(r, 0), CONCORD_SUCCESS);
    concord_request_free(r);
  }
}

static void TestDetach(concord_comm_t comm) {
  enum { N = 32 };
  static int32_t data[N][64];
  int64_t shape[1] = {64};
  struct Counter counters[N];
  concord_request_t r;
  concord_tensor_t t;
  char name[32];
  int i, spins;
  StartPhase("freeing running requests (detach)");
  for (i = 0; i < N; ++i) {
    counters[i].calls = 0;
    t = CpuTensor(data[i], CONCORD_INT32, 1, shape);
    sprintf(name, "detach.%d", i);
    CHECK_STATUS(concord_allreduce_async(comm, name, &t, NULL, NULL, OnDone, &counters[i], &r),
                 CONCORD_SUCCESS);
    concord_request_free(r); /* probably still running: it completes, then frees itself */
  }
  /* A barrier after them completes after them (one rank: requests run in order). */
  CHECK_STATUS(concord_barrier(comm), CONCORD_SUCCESS);
  for (spins = 0; spins < 1000000; ++spins) {
    int done = 0;
    for (i = 0; i < N; ++i) done += counters[i].calls;
    if (done == N) break;
  }
  for (i = 0; i < N; ++i) CHECK(counters[i].calls == 1);
  /* The names are free again. */
  t = CpuTensor(data[0], CONCORD_INT32, 1, shape);
  CHECK_STATUS(concord_allreduce(comm, "detach.0", &t, NULL, NULL), CONCORD_SUCCESS);
}

/* An allgather that succeeds, waited for; its request, with its output in data, bytes, first. */
static concord_request_t AllgatherDone(concord_comm_t comm, const char* name,
                                       const concord_tensor_t* t, void* out, size_t capacity,
                                       void** data, size_t* bytes, int64_t* first) {
  concord_request_t r = NULL;
  CHECK_STATUS(concord_allgather_async(comm, name, t, out, capacity, NULL, NULL, &r),
               CONCORD_SUCCESS);
  CHECK_STATUS(concord_wait(r, 10), CONCORD_SUCCESS);
  CHECK_STATUS(concord_request_output(r, data, bytes, first), CONCORD_SUCCESS);
  return r;
}

static void TestBlockingAndAllgather(concord_comm_t comm) {
  int64_t rows[2] = {3, 2};
  int64_t shape1[1] = {5};
  int8_t in[6] = {1, -2, 3, -4, 5, -6};
  int8_t out[16];
  uint16_t h[5] = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500}; /* 1, 2, 3, 4, 5 in binary16 */
  uint16_t h2[5];
  concord_tensor_t t = CpuTensor(in, CONCORD_INT8, 2, rows);
  concord_tensor_t th = CpuTensor(h, CONCORD_FLOAT16, 1, shape1);
  concord_tensor_t th2 = CpuTensor(h2, CONCORD_FLOAT16, 1, shape1);
  concord_request_t r;
  void* data = NULL;
  size_t bytes = 0;
  int64_t first = 0;
  int i;
  StartPhase("blocking conveniences and allgather output");
  CHECK_STATUS(concord_barrier(comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_broadcast(comm, "bcast", &th, NULL, 0), CONCORD_SUCCESS);
  CHECK(h[4] == 0x4500);
  memset(h2, 0, sizeof(h2));
  CHECK_STATUS(concord_broadcast(comm, "bcast.out", &th, &th2, 0), CONCORD_SUCCESS);
  CHECK(memcmp(h, h2, sizeof(h)) == 0);

  /* Reduce and gather on one rank: the input itself, in place and out of place. */
  memset(h2, 0, sizeof(h2));
  CHECK_STATUS(concord_reduce(comm, "reduce.out", &th, &th2, 0, NULL), CONCORD_SUCCESS);
  CHECK(memcmp(h, h2, sizeof(h)) == 0);
  CHECK_STATUS(concord_reduce(comm, "reduce.in", &th, NULL, 0, NULL), CONCORD_SUCCESS);
  CHECK(h[4] == 0x4500);
  memset(out, 0, sizeof(out));
  CHECK_STATUS(concord_gather(comm, "gather.root", &t, out, 6, 0), CONCORD_SUCCESS);
  CHECK(memcmp(in, out, 6) == 0);

  /* Into a caller buffer: exact capacity, then too small. */
  memset(out, 0, sizeof(out));
  CHECK_STATUS(concord_allgather(comm, "gather", &t, out, 6), CONCORD_SUCCESS);
  CHECK(memcmp(in, out, 6) == 0);
  CHECK_STATUS(concord_allgather(comm, "gather", &t, out, 5), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "gather");

  /* Into the request's own memory. */
  r = AllgatherDone(comm, "gather.owned", &t, NULL, 0, &data, &bytes, &first);
  CHECK(bytes == 6);
  CHECK(first == 3);
  CHECK(data != NULL && data != (void*)in && memcmp(data, in, 6) == 0);
  CHECK_STATUS(concord_request_output(r, NULL, NULL, NULL), CONCORD_SUCCESS);
  concord_request_free(r);

  /* Owned results of 128 KiB: a live request's memory is never another's; a freed request's is
   * taken again by the next result that fits (the engine's ResultBuffers). */
  {
    enum { kRows = 32768 };
    static float big[kRows];
    int64_t big_rows[1] = {kRows};
    concord_tensor_t tb = CpuTensor(big, CONCORD_FLOAT32, 1, big_rows);
    concord_request_t r2 = NULL;
    void* first_data = NULL;
    void* second_data = NULL;
    for (i = 0; i < kRows; ++i) big[i] = (float)i;
    r = AllgatherDone(comm, "gather.big", &tb, NULL, 0, &first_data, &bytes, &first);
    CHECK(bytes == sizeof(big) && memcmp(first_data, big, sizeof(big)) == 0);
    big[7] = -1.0f;
    r2 = AllgatherDone(comm, "gather.big", &tb, NULL, 0, &second_data, &bytes, &first);
    CHECK(second_data != first_data && memcmp(second_data, big, sizeof(big)) == 0);
    CHECK(((float*)first_data)[7] == 7.0f); /* the first result is untouched */
    concord_request_free(r);
    concord_request_free(r2);
    big[7] = 7.0f;
    r = AllgatherDone(comm, "gather.big", &tb, NULL, 0, &data, &bytes, &first);
    CHECK((data == first_data || data == second_data) && memcmp(data, big, sizeof(big)) == 0);
    concord_request_free(r);
  }

  /* A caller buffer: the output points at it. */
  r = AllgatherDone(comm, "gather.buf", &t, out, sizeof(out), &data, &bytes, &first);
  CHECK(data == (void*)out && bytes == 6 && first == 3);
  concord_request_free(r);

  /* A size-0 contribution. */
  rows[0] = 0;
  r = AllgatherDone(comm, "gather.empty", &t, NULL, 0, &data, &bytes, &first);
  CHECK(bytes == 0 && first == 0);
  concord_request_free(r);

  /* Failed request: the error text and the output call. */
  rows[0] = 3;
  CHECK_STATUS(concord_allgather_async(comm, "gather.small", &t, out, 2, NULL, NULL, &r),
               CONCORD_SUCCESS);
  CHECK_STATUS(concord_wait(r, 10), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(concord_request_error(r), "gather.small") != NULL);
  CHECK_STATUS(concord_request_output(r, &data, &bytes, &first), CONCORD_ERR_INVALID_ARGUMENT);
  concord_request_free(r);

  /* Every dtype through the blocking allreduce (one rank: the identity, average too). */
  for (i = 0; i <= CONCORD_FLOAT64; ++i) {
    double buf[4] = {0, 0, 0, 0};
    int64_t n[1] = {4};
    concord_allreduce_opts_t o;
    concord_tensor_t tt = CpuTensor(buf, (concord_dtype_t)i, 1, n);
    char name[32];
    memset(buf, 1, sizeof(buf));
    concord_allreduce_opts_init(&o);
    o.op = CONCORD_AVERAGE;
    sprintf(name, "dtype.%d", i);
    CHECK_STATUS(concord_allreduce(comm, name, &tt, NULL, &o), CONCORD_SUCCESS);
    {
      unsigned char ones[32];
      memset(ones, 1, sizeof(ones));
      CHECK(memcmp(buf, ones, 4 * ElementSize((concord_dtype_t)i)) == 0);
    }
  }
  /* Zero elements with NULL data are fine. */
  {
    int64_t zero[1] = {0};
    concord_tensor_t tz = CpuTensor(NULL, CONCORD_FLOAT32, 1, zero);
    CHECK_STATUS(concord_allreduce(comm, "zero", &tz, NULL, NULL), CONCORD_SUCCESS);
    CHECK_STATUS(concord_broadcast(comm, "zero.b", &tz, NULL, 0), CONCORD_SUCCESS);
  }
}

/* fork(): the child cannot use its parent's communicator or requests: each call is
 * NOT_INITIALIZED saying so and touches nothing (before, a child's finalize crashed or hung, and
 * its calls could write into the parent's connections). The parent's go on. The child, limited
 * by an alarm, reports by its exit status: one bit per check that failed. */
static int ChildChecks(concord_comm_t comm, concord_request_t done, concord_tensor_t* t) {
  int bad = 0;
  const char* why;
  if (concord_allreduce(comm, "fork.child", t, NULL, NULL) != CONCORD_ERR_NOT_INITIALIZED) bad |= 1;
  why = concord_comm_last_error(comm);
  if (why == NULL || strstr(why, "is a fork of it") == NULL) bad |= 2;
  if (concord_wait(done, -1) != CONCORD_ERR_NOT_INITIALIZED) bad |= 4;
  if (concord_test(done) != CONCORD_ERR_NOT_INITIALIZED) bad |= 8;
  why = concord_request_error(done);
  if (why == NULL || strstr(why, "is a fork of it") == NULL) bad |= 16;
  concord_request_free(done); /* the parent's: left alone */
  if (concord_finalize(comm) != CONCORD_ERR_NOT_INITIALIZED) bad |= 32;
  return bad;
}

static void TestFork(concord_comm_t comm) {
  float v[3] = {1, 2, 3};
  int64_t shape[1] = {3};
  concord_tensor_t t = CpuTensor(v, CONCORD_FLOAT32, 1, shape);
  concord_request_t done = NULL;
  pid_t child;
  int status = 0;
  StartPhase("a forked child refuses its parent's communicator");
  CHECK_STATUS(concord_allreduce_async(comm, "fork.before", &t, NULL, NULL, NULL, NULL, &done),
               CONCORD_SUCCESS);
  CHECK_STATUS(concord_wait(done, -1), CONCORD_SUCCESS);
  fflush(NULL);
  child = fork();
  if (child == 0) {
    alarm(20);
    _exit(ChildChecks(comm, done, &t));
  }
  CHECKF(child > 0, "fork failed");
  if (child <= 0) return;
  CHECKF(waitpid(child, &status, 0) == child, "waitpid failed");
  CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
         "the child's checks failed: exit status %d (bits: 1 call, 2 last error, 4 wait, 8 test, "
         "16 request error, 32 finalize), signal %d",
         WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  CHECK_STATUS(concord_test(done), CONCORD_SUCCESS);
  concord_request_free(done);
  CHECK_STATUS(concord_allreduce(comm, "fork.after", &t, NULL, NULL), CONCORD_SUCCESS);
  CHECKF(v[0] == 1.0f && v[2] == 3.0f, "one rank's sum changed the tensor: %g %g", v[0], v[2]);
}

static void TestFinalizeWithPending(void) {
  concord_comm_t comm = InitSingle();
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  concord_tensor_t t = CpuTensor(x, CONCORD_FLOAT32, 1, shape);
  concord_request_t r = NULL;
  struct Counter c = {0, CONCORD_IN_PROGRESS, NULL};
  StartPhase("finalize with a pending request");
  /* Held in an open group, the request cannot run; finalize fails it with NOT_INITIALIZED. */
  CHECK_STATUS(concord_group_start(comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_allreduce_async(comm, "held", &t, NULL, NULL, OnDone, &c, &r),
               CONCORD_SUCCESS);
  CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
  /* The request outlives the communicator: it is finished, with the documented status. */
  CHECK_STATUS(concord_test(r), CONCORD_ERR_NOT_INITIALIZED);
  CHECK_STATUS(concord_wait(r, 1), CONCORD_ERR_NOT_INITIALIZED);
  CHECK(strlen(concord_request_error(r)) > 0);
  CHECK(c.calls == 1 && c.last == CONCORD_ERR_NOT_INITIALIZED);
  concord_request_free(r);
}

/* One rank of TestWaitOnATimedOutOperation, run on its own thread; the main thread checks what
 * it saw (check.h's checks are for one thread). */
struct WaitRank {
  int rank;
  const char* store;
  concord_status_t init, short_wait, after_short_wait, long_wait;
  double long_wait_s;
  char error[512];
};

static pthread_mutex_t rank0_mu = PTHREAD_MUTEX_INITIALIZER;
static int rank0_done = 0; /* rank 0 has its operation's failure */

static double NowSeconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void* RunWaitRank(void* arg) {
  struct WaitRank* w = (struct WaitRank*)arg;
  concord_config_t c;
  concord_comm_t comm = NULL;
  concord_config_init(&c);
  c.rank = w->rank;
  c.size = 2;
  c.store = w->store;
  c.job_id = "c-api-wait";
  c.timeout_s = 20;
  w->init = concord_init_config(&c, &comm);
  if (w->init != CONCORD_SUCCESS) {
    snprintf(w->error, sizeof(w->error), "%s", concord_comm_last_error(NULL));
  } else if (w->rank == 0) {
    /* Only rank 0 submits it: the stall shutdown (CONCORD_STALL_SHUTDOWN_S) fails it, TIMEOUT. */
    float x[2] = {1, 2};
    int64_t shape[1] = {2};
    concord_tensor_t t = CpuTensor(x, CONCORD_FLOAT32, 1, shape);
    concord_request_t r = NULL;
    w->short_wait = concord_allreduce_async(comm, "rank0.only", &t, NULL, NULL, NULL, NULL, &r);
    if (w->short_wait == CONCORD_SUCCESS) {
      double start;
      w->short_wait = concord_wait(r, 0.05);
      w->after_short_wait = concord_test(r);
      start = NowSeconds();
      w->long_wait = concord_wait(r, 30);
      w->long_wait_s = NowSeconds() - start;
      snprintf(w->error, sizeof(w->error), "%s", concord_request_error(r));
      concord_request_free(r);
    }
  } else {
    /* Rank 1 keeps its engine up until rank 0 has seen the failure (at most 60 s). */
    double start = NowSeconds();
    for (;;) {
      int done;
      struct timespec tick = {0, 10 * 1000 * 1000};
      pthread_mutex_lock(&rank0_mu);
      done = rank0_done;
      pthread_mutex_unlock(&rank0_mu);
      if (done || NowSeconds() - start > 60) break;
      nanosleep(&tick, NULL);
    }
  }
  if (w->rank == 0) {
    pthread_mutex_lock(&rank0_mu);
    rank0_done = 1;
    pthread_mutex_unlock(&rank0_mu);
  }
  /* The job failed (the stall shutdown): finalize frees the handle whatever its barrier does. */
  if (comm != NULL) concord_finalize(comm);
  return NULL;
}

static int RemoveEntry(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

/* An operation that itself fails with TIMEOUT: concord_wait returns CONCORD_ERR_TIMEOUT (the
 * operation's status) with its message, not IN_PROGRESS. Two ranks as threads over a file store;
 * only rank 0 submits a tensor, and CONCORD_STALL_SHUTDOWN_S=1 fails it after a second. Before
 * that, a short wait returns IN_PROGRESS. */
static void TestWaitOnATimedOutOperation(void) {
  char dir[] = "/tmp/concord-c-api-wait-XXXXXX";
  char store[64];
  struct WaitRank ranks[2];
  pthread_t threads[2];
  int i;
  StartPhase("wait on an operation that fails with TIMEOUT");
  CHECK(mkdtemp(dir) != NULL);
  snprintf(store, sizeof(store), "file://%s", dir);
  memset(ranks, 0, sizeof(ranks));
  rank0_done = 0;
  setenv("CONCORD_STALL_SHUTDOWN_S", "1", 1); /* read at init; no other thread runs now */
  for (i = 0; i < 2; ++i) {
    ranks[i].rank = i;
    ranks[i].store = store;
    CHECK(pthread_create(&threads[i], NULL, RunWaitRank, &ranks[i]) == 0);
  }
  for (i = 0; i < 2; ++i) pthread_join(threads[i], NULL);
  unsetenv("CONCORD_STALL_SHUTDOWN_S");
  nftw(dir, RemoveEntry, 8, FTW_DEPTH | FTW_PHYS);
  for (i = 0; i < 2; ++i) {
    CHECKF(ranks[i].init == CONCORD_SUCCESS, "rank %d: init: %s", i, ranks[i].error);
  }
  CHECK_STATUS(ranks[0].short_wait, CONCORD_IN_PROGRESS);
  CHECK_STATUS(ranks[0].after_short_wait, CONCORD_IN_PROGRESS);
  CHECK_STATUS(ranks[0].long_wait, CONCORD_ERR_TIMEOUT);
  CHECKF(strstr(ranks[0].error, "rank0.only") != NULL &&
             strstr(ranks[0].error, "stall shutdown") != NULL,
         "the error '%s' does not name the tensor and the stall shutdown", ranks[0].error);
  CHECKF(ranks[0].long_wait_s < 15, "the operation took %.1f s to fail", ranks[0].long_wait_s);
}

static void TestTwoCommunicators(void) {
  concord_comm_t a = InitSingle();
  concord_comm_t b = InitSingle();
  int64_t shape[1] = {1};
  int32_t v = 5;
  concord_tensor_t t = CpuTensor(&v, CONCORD_INT32, 1, shape);
  StartPhase("two communicators, last error per handle");
  CHECK_STATUS(concord_allreduce(a, NULL, &t, NULL, NULL), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(a, "name");
  CHECK(strcmp(concord_comm_last_error(b), "") == 0); /* b's last error is its own */
  CHECK_STATUS(concord_allreduce(b, "same", &t, NULL, NULL), CONCORD_SUCCESS);
  CHECK_STATUS(concord_allreduce(a, "same", &t, NULL, NULL), CONCORD_SUCCESS);
  CHECK(v == 5);
  CHECK_STATUS(concord_finalize(b), CONCORD_SUCCESS);
  CHECK_STATUS(concord_finalize(a), CONCORD_SUCCESS);
}

/* The device entry points' checks. This communicator serves CPU tensors only (CONCORD_BACKEND
 * is gloo by default), so a CUDA tensor is refused with UNAVAILABLE naming why. */
static void TestDeviceOptions(concord_comm_t comm) {
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  concord_tensor_t t = CpuTensor(x, CONCORD_FLOAT32, 1, shape);
  concord_tensor_t gpu = t;
  concord_device_opts_t d;
  concord_request_t r = (concord_request_t)0x1;
  int fake_stream = 0;
  StartPhase("device options");
  memset(&d, 0x7f, sizeof(d));
  concord_device_opts_init(&d);
  CHECK(d.struct_size == sizeof(concord_device_opts_t));
  CHECK(d.stream == NULL && d.ready_event == NULL);
  concord_device_opts_init(NULL); /* ignored */

  /* NULL options and empty options behave like the plain entry points. */
  CHECK_STATUS(concord_allreduce_async_ex(comm, "d.plain", &t, NULL, NULL, NULL, NULL, NULL, &r),
               CONCORD_SUCCESS);
  CHECK_STATUS(concord_wait(r, -1), CONCORD_SUCCESS);
  /* A CPU request has no device completion to wait for. */
  CHECK_STATUS(concord_request_wait_stream(r, &fake_stream, 1.0), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(concord_request_error(r), "not a CUDA operation") != NULL);
  concord_request_free(r);
  r = (concord_request_t)0x1;
  CHECK_STATUS(concord_broadcast_async_ex(comm, "d.empty", &t, NULL, 0, &d, NULL, NULL, &r),
               CONCORD_SUCCESS);
  CHECK_STATUS(concord_wait(r, -1), CONCORD_SUCCESS);
  concord_request_free(r);
  CHECK(x[0] == 1 && x[3] == 4);
  CHECK_STATUS(concord_request_wait_stream(NULL, &fake_stream, 1.0), CONCORD_ERR_INVALID_ARGUMENT);

  /* A stream or an event for a CPU tensor is refused on every operation. */
  r = (concord_request_t)0x1;
  d.stream = &fake_stream;
  CHECK_STATUS(concord_allreduce_async_ex(comm, "d.cpu", &t, NULL, NULL, &d, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "CPU tensor");
  CHECK_STATUS(concord_allgather_async_ex(comm, "d.cpu", &t, NULL, 0, &d, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "CPU tensor");
  d.stream = NULL;
  d.ready_event = &fake_stream;
  CHECK_STATUS(concord_broadcast_async_ex(comm, "d.cpu", &t, NULL, 0, &d, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "CPU tensor");
  d.ready_event = NULL;
  d.struct_size = 4;
  CHECK_STATUS(concord_allreduce_async_ex(comm, "d.size", &t, NULL, NULL, &d, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "struct_size");
  concord_device_opts_init(&d);

  /* CUDA tensors: no GPU backend on this communicator; a negative id that is not the CPU. */
  gpu.device = 0;
  CHECK_STATUS(concord_allreduce_async_ex(comm, "d.gpu", &gpu, NULL, NULL, &d, NULL, NULL, &r),
               CONCORD_ERR_UNAVAILABLE);
  CheckLastError(comm, "CUDA device 0");
  CheckLastError(comm, "GPU backend"); /* "starts no GPU backend", or "built without a ..." */
  gpu.device = -7;
  CHECK_STATUS(concord_allreduce_async_ex(comm, "d.gpu", &gpu, NULL, NULL, &d, NULL, NULL, &r),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "neither the CPU");
  CHECK(r == (concord_request_t)0x1); /* never written on failure */
}

/* CONCORD_BACKEND=nccl where NCCL cannot run (not built, or no usable GPU) fails at init naming
 * why; auto starts without a GPU backend and refuses CUDA tensors with the reason. On a machine
 * with a GPU and NCCL both start, and a tensor on a device that does not exist is refused. */
static void TestDeviceBackendChoice(void) {
  concord_config_t c;
  concord_comm_t comm = NULL;
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  concord_tensor_t gpu = CpuTensor(x, CONCORD_FLOAT32, 1, shape);
  concord_request_t r = (concord_request_t)0x1;
  concord_status_t s;
  StartPhase("device backend choice");
  concord_config_init(&c);
  c.rank = 0;
  c.size = 1;
  c.timeout_s = 20;
  setenv("CONCORD_BACKEND", "nccl", 1);
  s = concord_init_config(&c, &comm);
  if (s == CONCORD_SUCCESS) {
    fprintf(stderr, "  (NCCL started: this machine has a usable GPU)\n");
    gpu.device = 4096;
    CHECK_STATUS(concord_allreduce_async(comm, "g", &gpu, NULL, NULL, NULL, NULL, &r),
                 CONCORD_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
  } else {
    CHECK_STATUS(s, CONCORD_ERR_UNAVAILABLE);
    CHECK(strstr(concord_comm_last_error(NULL), "nccl") != NULL);
    fprintf(stderr, "  CONCORD_BACKEND=nccl: %s\n", concord_comm_last_error(NULL));
    setenv("CONCORD_BACKEND", "auto", 1);
    CHECK_STATUS(concord_init_config(&c, &comm), CONCORD_SUCCESS);
    gpu.device = 0;
    CHECK_STATUS(concord_allreduce_async(comm, "g", &gpu, NULL, NULL, NULL, NULL, &r),
                 CONCORD_ERR_UNAVAILABLE);
    CheckLastError(comm, "nccl");
    CHECK(r == (concord_request_t)0x1);
    CHECK_STATUS(concord_allreduce(comm, "cpu", &gpu, NULL, NULL), CONCORD_ERR_UNAVAILABLE);
    gpu.device = CONCORD_DEVICE_CPU; /* CPU tensors still work under auto */
    CHECK_STATUS(concord_allreduce(comm, "cpu", &gpu, NULL, NULL), CONCORD_SUCCESS);
    CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
  }
  unsetenv("CONCORD_BACKEND");
}

/* A string of 'n's with no NUL within the library's 64 KiB limit, ending right before a page
 * that cannot be read: a library that reads a string up to its NUL crashes on it. */
static char* UnterminatedString(size_t* mapped) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t text = ((65536 + 16) / page + 1) * page; /* past the limit, whole pages */
  char* p;
  int fd = open("/dev/zero", O_RDWR);
  CHECK(fd >= 0);
  p = (char*)mmap(NULL, text + page, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  close(fd);
  CHECK(p != (char*)MAP_FAILED);
  CHECK(mprotect(p + text, page, PROT_NONE) == 0);
  memset(p, 'n', text);
  *mapped = text + page;
  return p;
}

/* Every string the API reads is refused without a NUL within 64 KiB, never read past it (before,
 * a tensor name, a spec, a path or a config string was read up to its NUL: a crash here). */
static void TestUnterminatedStrings(concord_comm_t comm) {
  size_t mapped = 0;
  char* text = UnterminatedString(&mapped);
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  concord_tensor_t t = CpuTensor(x, CONCORD_FLOAT32, 1, shape);
  concord_allreduce_opts_t o;
  concord_reducescatter_opts_t rs;
  concord_config_t c;
  concord_comm_t other = (concord_comm_t)0x1;
  StartPhase("strings without a NUL within the limit");
  BadAllreduce(comm, text, &t, NULL, NULL, CONCORD_ERR_INVALID_ARGUMENT,
               "the tensor name has no NUL within its first 65536 bytes");
  concord_allreduce_opts_init(&o);
  o.compression = text;
  BadAllreduce(comm, "spec.unterminated", &t, NULL, &o, CONCORD_ERR_INVALID_ARGUMENT,
               "the compression spec has no NUL");
  concord_reducescatter_opts_init(&rs);
  rs.compression = text;
  CHECK_STATUS(concord_reducescatter(comm, "rs.unterminated", &t, &t, &rs),
               CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "the compression spec has no NUL");
  CHECK_STATUS(concord_compression_check(text, -1), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(NULL, "the spec has no NUL");
  CHECK_STATUS(concord_timeline_start(comm, text), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "the path has no NUL");
  concord_config_init(&c);
  c.rank = 0;
  c.size = 1;
  c.store = text;
  CHECK_STATUS(concord_init_config(&c, &other), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(NULL, "concord_config_t.store has no NUL");
  CHECK(other == (concord_comm_t)0x1);
  CHECK(munmap(text, mapped) == 0);
}

/* Struct wrappers of a newer caller: this library's struct, then fields it does not have. */
struct NewerAllreduceOpts {
  concord_allreduce_opts_t known;
  int64_t unknown[2];
};
struct NewerDeviceOpts {
  concord_device_opts_t known;
  int64_t unknown;
};
struct NewerStats {
  concord_stats_t known;
  uint64_t unknown[3];
};

/* A newer caller's larger struct: taken when the fields this library lacks hold their default
 * (zero), UNAVAILABLE when one is set (before: dropped in silence, SUCCESS); a struct_size far
 * beyond any version is refused; a newer concord_stats_t gets 0 for counters this library does
 * not keep (before: left as they were, garbage in a fresh struct). */
static void TestNewerStructs(concord_comm_t comm) {
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  concord_tensor_t t = CpuTensor(x, CONCORD_FLOAT32, 1, shape);
  struct NewerAllreduceOpts o;
  struct NewerDeviceOpts d;
  struct NewerStats st;
  concord_request_t r = (concord_request_t)0x1;
  StartPhase("newer (larger) versioned structs");
  memset(&o, 0, sizeof(o));
  concord_allreduce_opts_init(&o.known);
  o.known.struct_size = sizeof(o);
  CHECK_STATUS(concord_allreduce(comm, "newer.zero", &t, NULL, &o.known), CONCORD_SUCCESS);
  o.unknown[1] = 1;
  BadAllreduce(comm, "newer.set", &t, NULL, &o.known, CONCORD_ERR_UNAVAILABLE,
               "a field of a newer Concord is set");
  o.unknown[1] = 0;
  o.known.struct_size = 8192;
  BadAllreduce(comm, "newer.huge", &t, NULL, &o.known, CONCORD_ERR_INVALID_ARGUMENT, "too large");

  memset(&d, 0, sizeof(d));
  concord_device_opts_init(&d.known);
  d.known.struct_size = sizeof(d);
  d.unknown = -1;
  CHECK_STATUS(
      concord_allreduce_async_ex(comm, "newer.device", &t, NULL, NULL, &d.known, NULL, NULL, &r),
      CONCORD_ERR_UNAVAILABLE);
  CheckLastError(comm, "device options");
  CHECK(r == (concord_request_t)0x1);

  memset(&st, 0xAB, sizeof(st));
  st.known.struct_size = sizeof(st);
  CHECK_STATUS(concord_comm_stats(comm, &st.known), CONCORD_SUCCESS);
  CHECK(st.unknown[0] == 0 && st.unknown[1] == 0 && st.unknown[2] == 0);
  CHECK(st.known.response_lists > 0);
  st.known.struct_size = 8192;
  CHECK_STATUS(concord_comm_stats(comm, &st.known), CONCORD_ERR_INVALID_ARGUMENT);
  CheckLastError(comm, "at most 4096");
}

/* A request query that fails by itself says why in concord_request_error (before: empty). */
/* On another thread: a failed call on the request, then its message (TestRequestQueryErrors). */
static void* FailAQueryAndReadItsError(void* request) {
  concord_request_t r = (concord_request_t)request;
  if (concord_request_wire_bytes(r, NULL) != CONCORD_ERR_INVALID_ARGUMENT) return NULL;
  return strstr(concord_request_error(r), "bytes is NULL") != NULL ? r : NULL;
}

static void TestRequestQueryErrors(concord_comm_t comm) {
  float x[2] = {1, 2};
  int64_t shape[1] = {2};
  concord_tensor_t t = CpuTensor(x, CONCORD_FLOAT32, 1, shape);
  concord_request_t r = NULL;
  int ndim = -7;
  StartPhase("request query errors");
  CHECK_STATUS(concord_allreduce_async(comm, "query.errors", &t, NULL, NULL, NULL, NULL, &r),
               CONCORD_SUCCESS);
  CHECK_STATUS(concord_wait(r, -1), CONCORD_SUCCESS);
  CHECK_STATUS(concord_request_output_shape(r, NULL, &ndim, NULL), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(ndim == -7);
  CHECK(strstr(concord_request_error(r), "not a recv") != NULL);
  {
    /* The message is kept per thread: another thread's call does not rewrite (or free) the text
     * this thread holds (before, it read the other thread's message, or freed memory). */
    const char* mine = concord_request_error(r);
    pthread_t other;
    void* other_saw = NULL;
    CHECK(pthread_create(&other, NULL, FailAQueryAndReadItsError, r) == 0);
    CHECK(pthread_join(other, &other_saw) == 0);
    CHECK(other_saw == r);
    CHECK(strstr(mine, "not a recv") != NULL);
  }
  CHECK_STATUS(concord_request_wire_bytes(r, NULL), CONCORD_ERR_INVALID_ARGUMENT);
  CHECK(strstr(concord_request_error(r), "bytes is NULL") != NULL);
  concord_request_free(r);
}

/* A finalized communicator is refused by every call, concord_finalize again too, and nothing of
 * it is touched (before: a use after free, and a second finalize crashed). */
static void TestFinalizedHandle(void) {
  concord_comm_t comm = InitSingle();
  float x[2] = {1, 2};
  int64_t shape[1] = {2};
  concord_tensor_t t = CpuTensor(x, CONCORD_FLOAT32, 1, shape);
  concord_request_t r = (concord_request_t)0x1;
  int v = -5;
  StartPhase("a finalized communicator");
  CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
  CHECK_STATUS(concord_finalize(comm), CONCORD_ERR_NOT_INITIALIZED);
  CheckLastError(NULL, "was finalized");
  CHECK_STATUS(concord_comm_rank(comm, &v), CONCORD_ERR_NOT_INITIALIZED);
  CHECK(v == -5);
  CheckLastError(NULL, "was finalized");
  CHECK_STATUS(concord_allreduce_async(comm, "gone", &t, NULL, NULL, NULL, NULL, &r),
               CONCORD_ERR_NOT_INITIALIZED);
  CHECK(r == (concord_request_t)0x1);
  CHECK_STATUS(concord_allreduce(comm, "gone", &t, NULL, NULL), CONCORD_ERR_NOT_INITIALIZED);
  CHECK_STATUS(concord_barrier(comm), CONCORD_ERR_NOT_INITIALIZED);
  CHECK(strstr(concord_comm_last_error(comm), "finalized") != NULL);
}

int main(void) {
  concord_comm_t comm;
  TestVersionAndStrings();
  TestConfigInit();
  TestInitErrors();
  TestCompressionCheck();
  TestBadConfigValues();
  comm = InitSingle();
  TestGetters(comm);
  TestInvalidArguments(comm);
  TestInFlightName(comm);
  TestWaitLimit(comm);
  TestAsync(comm);
  TestDetach(comm);
  TestBlockingAndAllgather(comm);
  TestStats(comm);
  TestMetrics(comm);
  TestDeviceOptions(comm);
  TestFork(comm);
  TestUnterminatedStrings(comm);
  TestNewerStructs(comm);
  TestRequestQueryErrors(comm);
  StartPhase("finalize");
  CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
  TestFinalizeWithPending();
  TestWaitOnATimedOutOperation();
  TestTwoCommunicators();
  TestDeviceBackendChoice();
  TestFinalizedHandle();
  if (CheckFailures()) {
    fprintf(stderr, "c_api_test: %d failures\n", CheckFailures());
    return 1;
  }
  fprintf(stderr, "c_api_test: PASS\n");
  return 0;
}
