// concord-perf: collective benchmarks in the style of nccl-tests, Concord side by side with raw
// Gloo, or with --backend mpi Concord over MPI beside raw MPI_Allreduce, in one run. Start it under
// concordrun (or mpirun for mpi); rank 0 prints.
//
//   concordrun -np 2 concord-perf --op allreduce --bytes 4K:64M --iters 20 --warmup 5
//   concordrun -np 2 concord-perf --workload perf/workloads/resnet50.txt --steps 10
//   mpirun -np 2 concord-perf --backend mpi --bytes 4K:64M
//   concordrun -np 2 concord-perf --backend nccl --bytes 4K:256M   # GPU buffers, beside raw NCCL
//
// Per size: one Concord row (the op through the full engine: negotiation, fusion buffer, backend)
// and, for float32 sum allreduce, one row per raw Gloo algorithm (its objects and buffer built once
// and reused, so Gloo is at its best), or with --backend mpi one raw MPI_Allreduce row (in place,
// on the buffer the Concord row used). Ranks line up with a barrier, then run --iters operations
// back to back, each timed on its own; a row's time is the median of each rank's times, reduced
// with max across ranks (the median, not the mean, because a shared 2-core machine adds scheduler
// stalls of several ms to a few iterations of either side at random); the header says so.
// --percentile P takes each rank's P-th percentile instead, for both sides: a tail the median
// hides (one iteration in ten ten times slower) shows at 90. algbw = bytes / time; busbw as
// nccl-tests defines it: algbw x 2(n-1)/n (allreduce), x (n-1)/n (allgather, reducescatter,
// alltoall), x 1 (broadcast, sendrecv). `bytes` is nccl-tests' size too: the whole buffer of an
// allreduce or broadcast, an allgather's output, a reducescatter's and an alltoall's input on each
// rank, what each rank sends in a sendrecv. A size is rounded down to whole elements (to whole
// elements per rank for allgather, reducescatter and alltoall); sizes that round to one already
// run are skipped. A workload row times whole steps the same way.
//
// After the timed iterations every row (Concord's and the raw ones) runs its operation once more
// on known data (perf/bench_common.h) and checks the result on every rank: a wrong one is printed
// under the row as WRONG RESULT, its JSON row says "checked": false, and the run exits 1. On GPU
// buffers (--backend nccl) the known data is written on the host and copied in, and the result
// copied back and checked on the host the same way.
//
// --versus-deterministic adds a second communicator initialised with deterministic = 1 (its own
// job id, so it rendezvouses apart) and times each size on both, iterations alternating (A B, then
// B A), so that the noise of a shared machine falls on both modes alike; it prints the
// deterministic row and the ratio of the two. Separate jobs per mode, alternated
// (perf/deterministic_overhead.sh), differ by 5-10 points from batch to batch on this machine.
//
// With --backend nccl the sweep's tensors are in GPU memory (device: local rank modulo the GPUs),
// Concord runs with CONCORD_BACKEND=nccl, and the raw row (float32 sum allreduce only) is
// ncclAllReduce on the same device buffer through a communicator of its own. Without a usable GPU
// the run is skipped, saying why (exit 0).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/clock.h"
#include "concord/concord.h"
#include "perf/gloo_raw.h"
#ifdef CONCORD_PERF_MPI
#include "perf/mpi_raw.h"
#endif
#ifdef CONCORD_PERF_NCCL
#include "backends/cuda/cuda_device.h"
#include "perf/device_copy.h"
#include "perf/nccl_raw.h"
#endif
#include "perf/bench_common.h"
#include "perf/workload.h"
#include "rendezvous/hash_store.h"
#include "rendezvous/store_factory.h"

namespace concord {
namespace {

struct Options {
  std::string op = "allreduce";
  DType dtype = DType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  size_t min_bytes = 4096, max_bytes = size_t{64} << 20;
  double factor = 2;
  int iters = 20, warmup = 5;
  double percentile = 50;  // of each rank's per-iteration times: a row's time (50: the median)
  std::string workload;
  int steps = 10;
  int rounds = 3;
  bool raw = true;
  std::vector<std::string> raw_algos = {"ring", "ring_chunked", "halving_doubling", "bcube",
                                        "allreduce"};
  std::string json;
  std::string backend = "gloo";           // gloo, mpi: CPU buffers; nccl: GPU buffers
  std::vector<std::string> compressions;  // workload mode: extra rows, one per compressor spec
  // The communicator the rows run on: "world", "split:K" (sub-communicators of K consecutive
  // ranks, running side by side) or "group:r,r,..." (one of those ranks; the others idle).
  std::string comm = "world";
  std::vector<int> comm_ranks;        // split:K: {K}; group:...: its ranks (parsed with --comm)
  bool versus_deterministic = false;  // also time every size on a deterministic communicator
  // The raw rows' store operations and Gloo connections wait at most this: CONCORD_TIMEOUT_S
  // (RawTimeout), else 30 s, as the library's own default.
  std::chrono::milliseconds raw_timeout{30000};
};

struct Row {
  std::string op, impl, backend = "gloo", workload;
  int ranks = 1;
  size_t bytes = 0;
  double seconds = 0;
  double algbw = 0, busbw = 0;  // GB/s
  bool checked = true;          // its checked run gave every rank the right result
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(
      stderr,
      "concord-perf: %s\n"
      "usage: concord-perf\n"
      "         [--op allreduce|allgather|broadcast|reducescatter|alltoall|sendrecv]\n"
      "         [--dtype float32]\n"
      "         [--redop sum|average|min|max|product] [--bytes MIN:MAX] [--factor F]\n"
      "         [--iters N] [--warmup N] [--percentile P]\n"
      "         [--workload FILE [--steps N] [--rounds N]]\n"
      "         [--no-raw] [--raw-algos a,b,...] [--json FILE]\n"
      "         [--backend gloo|gloo-ibverbs|mpi|nccl] (default: CONCORD_BACKEND, else gloo)\n"
      "         [--compression SPEC ...] (workload mode; repeat for several)\n"
      "         [--comm world|split:K|group:r,r,...] (Concord rows on sub-communicators)\n",
      why.c_str());
  std::exit(2);
}

// --comm split:K: {K}; group:r,r,...: the ranks; world: none. A usage error for a bad number.
std::vector<int> SubCommunicatorRanks(const std::string& comm) {
  std::vector<int> numbers;
  if (comm.rfind("split:", 0) == 0) {
    numbers.push_back(
        static_cast<int>(bench::ParseInteger("--comm split:K", comm.substr(6), 1, 1 << 20, Usage)));
  } else if (comm.rfind("group:", 0) == 0) {
    std::stringstream ss(comm.substr(6));
    for (std::string r; std::getline(ss, r, ',');) {
      numbers.push_back(
          static_cast<int>(bench::ParseInteger("--comm group:", r, 0, 1 << 20, Usage)));
    }
    if (numbers.empty()) Usage("--comm group: needs ranks");
  }
  return numbers;
}

size_t ParseBytes(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  double mult = 1;
  const std::string suffix = end ? std::string(end) : "";
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    mult = 1024;
  else if (suffix == "M" || suffix == "MiB")
    mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty())
    Usage("bad size '" + s + "'");
  // At most 1 PiB: beyond, the cast to size_t is undefined ("1e20" and "inf" ran 0-byte rows).
  if (end == s.c_str() || !(v >= 0) || !(v * mult <= 1e15)) Usage("bad size '" + s + "'");
  return static_cast<size_t>(v * mult);
}

// CONCORD_TIMEOUT_S as the library reads it (core/config.cc): unset or empty, the default; else a
// finite decimal number (no hexadecimal, no blanks) of seconds in (0, 86400]. What the library
// refuses is a usage error here, in the library's words, never a raw timeout quietly left at 30 s.
std::chrono::milliseconds RawTimeout(std::chrono::milliseconds default_timeout) {
  const char* text = std::getenv("CONCORD_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return default_timeout;
  const std::string v = text;
  errno = 0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || std::isspace(static_cast<unsigned char>(v[0])) ||
      v.find_first_of("xX") != std::string::npos) {
    Usage("environment variable CONCORD_TIMEOUT_S='" + v +
          "' is not a finite number (decimal, without blanks)");
  }
  if (errno == ERANGE || !std::isfinite(seconds)) {
    Usage("environment variable CONCORD_TIMEOUT_S='" + v +
          "' is not a finite number in a double's range");
  }
  if (!(seconds > 0 && seconds <= 86400)) {
    Usage("CONCORD_TIMEOUT_S = " + v + ": the timeout must be in (0, 86400] seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  o.raw_timeout = RawTimeout(o.raw_timeout);
  bool backend_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--op") {
      o.op = next();
      if (o.op != "allreduce" && o.op != "allgather" && o.op != "broadcast" &&
          o.op != "reducescatter" && o.op != "alltoall" && o.op != "sendrecv") {
        Usage("bad --op");
      }
    } else if (a == "--dtype") {
      auto d = ParseDTypeName(next());
      if (!d.ok()) Usage(d.status().message());
      o.dtype = *d;
    } else if (a == "--redop") {
      const std::string r = next();
      const char* names[] = {"sum", "average", "min", "max", "product"};
      bool found = false;
      for (int k = 0; k < 5; ++k) {
        if (r == names[k]) o.redop = static_cast<ReduceOp>(k), found = true;
      }
      if (!found) Usage("bad --redop");
    } else if (a == "--bytes") {
      const std::string v = next();
      const size_t colon = v.find(':');
      o.min_bytes = ParseBytes(v.substr(0, colon));
      o.max_bytes = colon == std::string::npos ? o.min_bytes : ParseBytes(v.substr(colon + 1));
      if (o.max_bytes < o.min_bytes) Usage("--bytes MIN:MAX with MAX < MIN");
    } else if (a == "--factor") {
      const std::string v = next();
      char* end = nullptr;
      o.factor = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(o.factor > 1) || !std::isfinite(o.factor))
        Usage("--factor must be a number > 1, not '" + v + "'");
    } else if (a == "--iters") {
      o.iters = static_cast<int>(bench::ParseInteger(a, next(), 1, 100000000, Usage));
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(bench::ParseInteger(a, next(), 0, 100000000, Usage));
    } else if (a == "--workload") {
      o.workload = next();
    } else if (a == "--steps") {
      o.steps = static_cast<int>(bench::ParseInteger(a, next(), 1, 1000000, Usage));
    } else if (a == "--rounds") {
      o.rounds = static_cast<int>(bench::ParseInteger(a, next(), 1, 1000000, Usage));
    } else if (a == "--compression") {
      o.compressions.push_back(next());
    } else if (a == "--no-raw") {
      o.raw = false;
    } else if (a == "--raw-algos") {
      o.raw_algos.clear();
      std::stringstream ss(next());
      for (std::string algo; std::getline(ss, algo, ',');) {
        // Refused here, not at every size on every rank.
        if (algo != "ring" && algo != "ring_chunked" && algo != "halving_doubling" &&
            algo != "bcube" && algo != "allreduce") {
          Usage(
              "--raw-algos takes ring, ring_chunked, halving_doubling, bcube and allreduce, not '" +
              algo + "'");
        }
        o.raw_algos.push_back(algo);
      }
    } else if (a == "--backend") {
      o.backend = next();
      backend_given = true;
      if (o.backend != "gloo" && o.backend != "gloo-ibverbs" && o.backend != "mpi" &&
          o.backend != "nccl")
        Usage("--backend must be gloo, gloo-ibverbs, mpi or nccl");
    } else if (a == "--percentile") {
      const std::string v = next();
      char* end = nullptr;
      o.percentile = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(o.percentile >= 1 && o.percentile <= 99))
        Usage("--percentile must be a number from 1 to 99");
    } else if (a == "--json") {
      o.json = next();
    } else if (a == "--comm") {
      o.comm = next();
      if (o.comm != "world" && o.comm.rfind("split:", 0) != 0 && o.comm.rfind("group:", 0) != 0)
        Usage("--comm must be world, split:K or group:r,r,...");
      o.comm_ranks = SubCommunicatorRanks(o.comm);  // a bad K or rank: before any rank starts
    } else if (a == "--versus-deterministic") {
      o.versus_deterministic = true;
    } else {
      Usage("unknown argument '" + a + "'");
    }
  }
  // The environment's backend (concordrun --backend, concord-fabric real --backend) is the one
  // measured unless --backend says otherwise; a conflict is refused rather than measuring
  // another backend than the job asked for (the library reads CONCORD_BACKEND too).
  if (const char* env = std::getenv("CONCORD_BACKEND"); env != nullptr && *env != '\0') {
    const std::string e = env;
    if (e != "gloo" && e != "gloo-ibverbs" && e != "mpi" && e != "nccl" && e != "auto") {
      Usage("CONCORD_BACKEND=" + e + ": concord-perf measures gloo, gloo-ibverbs, mpi or nccl " +
            "(unset it, or set one of those)");
    }
    if (e == "auto" && !backend_given) {
      Usage("CONCORD_BACKEND=auto: concord-perf measures one backend; give --backend gloo, " +
            std::string("gloo-ibverbs, mpi or nccl"));
    }
    if (backend_given && e != o.backend && e != "auto") {
      Usage("--backend " + o.backend + " but CONCORD_BACKEND=" + e + " (concordrun --backend " +
            "sets it): give the same, or only one");
    }
    if (e != "auto") o.backend = e;  // auto with --backend: --backend says which
  }
  if (o.backend == "nccl" && !o.workload.empty())
    Usage("--workload is not supported with --backend nccl (it uses CPU buffers)");
  if (o.versus_deterministic && (o.backend == "nccl" || !o.workload.empty() || o.comm != "world" ||
                                 (o.op != "allreduce" && o.op != "reducescatter"))) {
    Usage(
        "--versus-deterministic takes --op allreduce or reducescatter on CPU buffers, the world "
        "communicator and no --workload");
  }
  return o;
}

// How a row's time is taken, for the header: ", time: median of iterations, max over ranks", or
// the 90th percentile of iterations with --percentile 90.
std::string StatName(const Options& o) {
  char s[96];
  if (o.percentile == 50) {
    std::snprintf(s, sizeof(s), ", time: median of iterations, max over ranks");
  } else {
    std::snprintf(s, sizeof(s), ", time: %gth percentile of iterations, max over ranks",
                  o.percentile);
  }
  return s;
}

// Aborts the benchmark with the library's message.
void Check(concord_comm_t comm, concord_status_t s, const std::string& what) {
  bench::CheckOrExit("concord-perf", comm, s, what);
}

using bench::Median;
using bench::Percentile;

double Now() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// The maximum of a per-rank value across ranks.
double MaxAcrossRanks(concord_comm_t comm, double value, const std::string& name) {
  return bench::MaxAcrossRanks("concord-perf", comm, value, name);
}

// nccl-tests' factors (its PERFORMANCE.md): with one rank 0, except where nothing depends on n.
double BusFactor(const std::string& op, int n) {
  if (op == "broadcast" || op == "sendrecv") return 1.0;
  if (n <= 1) return 0;
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather" || op == "reducescatter" || op == "alltoall") {
    return static_cast<double>(n - 1) / n;
  }
  return 1.0;
}

Row MakeRow(const std::string& op, const std::string& impl, int ranks, size_t bytes, double seconds,
            const std::string& backend = "gloo") {
  Row r;
  r.backend = backend;
  r.op = op;
  r.impl = impl;
  r.ranks = ranks;
  r.bytes = bytes;
  r.seconds = seconds;
  r.algbw = seconds > 0 ? bytes / seconds / 1e9 : 0;
  r.busbw = r.algbw * BusFactor(op, ranks);
  return r;
}

void PrintRow(const Row& r) {
  std::printf("%12zu  %-26s %12.1f %10.3f %10.3f\n", r.bytes, r.impl.c_str(), r.seconds * 1e6,
              r.algbw, r.busbw);
  if (!r.checked) {
    std::printf(
        "%12s  WRONG RESULT: %s gave a wrong result (the rank's message is on stderr); its "
        "time measures nothing\n",
        "", r.impl.c_str());
  }
  std::fflush(stdout);
}

// Element i of a `dtype` buffer as a double, and set from one (the checked values are small
// integers, exact in every dtype).
double LoadElement(const void* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kUint8:
      return static_cast<const uint8_t*>(data)[i];
    case DType::kInt8:
      return static_cast<const int8_t*>(data)[i];
    case DType::kInt32:
      return static_cast<const int32_t*>(data)[i];
    case DType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kFloat32:
      return static_cast<const float*>(data)[i];
    case DType::kFloat64:
      return static_cast<const double*>(data)[i];
  }
  return 0;
}

void StoreElement(void* data, DType dtype, size_t i, double v) {
  switch (dtype) {
    case DType::kUint8:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v);
      break;
    case DType::kInt8:
      static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v);
      break;
    case DType::kInt32:
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v);
      break;
    case DType::kInt64:
      static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v);
      break;
    case DType::kFloat16:
      static_cast<uint16_t*>(data)[i] = FloatToHalf(static_cast<float>(v));
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(data)[i] = FloatToBFloat16(static_cast<float>(v));
      break;
    case DType::kFloat32:
      static_cast<float*>(data)[i] = static_cast<float>(v);
      break;
    case DType::kFloat64:
      static_cast<double*>(data)[i] = v;
      break;
  }
}

// How far a checked element may be from its value: none for integers; a little for floating
// types, whose average divides in their own precision.
double Tolerance(DType dtype) {
  return IsFloatingPoint(dtype) ? 1e-2 : 0;
}

// Whether every rank of `comm` found its result right (`wrong`: this rank's finding, "" when
// right; printed on stderr by the rank that made it).
bool RightOnEveryRank(concord_comm_t comm, int rank, const std::string& what,
                      const std::string& wrong, const std::string& name) {
  if (!wrong.empty()) {
    std::fprintf(stderr, "concord-perf: %s: wrong result on rank %d: %s\n", what.c_str(), rank,
                 wrong.c_str());
  }
  return bench::MaxAcrossRanks("concord-perf", comm, wrong.empty() ? 0.0 : 1.0, name) == 0;
}

// Where the sweep's tensors live: host vectors, or device buffers on `device`. With device
// buffers, check_in and check_out are host buffers of the same capacity: a checked run's known
// data is written there and copied in, and its result copied back there (HostSide).
struct Buffers {
  void* in = nullptr;
  void* out = nullptr;
  size_t capacity = 0;  // bytes of each
  int device = CONCORD_DEVICE_CPU;
  void* check_in = nullptr;
  void* check_out = nullptr;
};

// Where a checked run's data is written and its result read on the host: b itself on the CPU, b's
// check buffers on a GPU.
Buffers HostSide(const Buffers& b) {
  if (b.device == CONCORD_DEVICE_CPU) return b;
  Buffers host;
  host.in = b.check_in;
  host.out = b.check_out;
  host.capacity = b.capacity;
  return host;
}

// A checked run's first `bytes` of input and output copied from the host side to b's device
// buffers (to_device) or back; nothing to do on the CPU.
Status CopyCheckedRun(const Buffers& b, size_t bytes, bool to_device) {
  if (b.device == CONCORD_DEVICE_CPU) return Status::Ok();
#ifdef CONCORD_PERF_NCCL
  const auto copy = [&](void* device_buffer, void* host_buffer) {
    return to_device ? CopyHostToDevice(b.device, device_buffer, host_buffer, bytes)
                     : CopyDeviceToHost(b.device, host_buffer, device_buffer, bytes);
  };
  Status s = copy(b.in, b.check_in);
  return s.ok() ? copy(b.out, b.check_out) : s;
#else
  (void)bytes;
  (void)to_device;
  return Internal("device buffers in a build without CUDA");
#endif
}

// Point to point: this rank and rank ^ 1 exchange `t` (received into `out`): recv posted, send,
// both waited for. What the raw rows time too.
concord_status_t SendRecvOnce(concord_comm_t comm, const concord_tensor_t& t, void* out) {
  int rank = 0;
  concord_comm_rank(comm, &rank);
  concord_tensor_t in = t;
  in.data = out;
  concord_request_t r = nullptr, w = nullptr;
  concord_status_t s = concord_recv_async(comm, &in, rank ^ 1, 1, nullptr, nullptr, &r);
  if (s != CONCORD_SUCCESS) return s;
  s = concord_send_async(comm, &t, rank ^ 1, 1, nullptr, nullptr, &w);
  if (s == CONCORD_SUCCESS) s = concord_wait(w, -1);
  const concord_status_t rs = concord_wait(r, -1);
  concord_request_free(w);
  concord_request_free(r);
  return s != CONCORD_SUCCESS ? s : rs;
}

// Every timing below takes the --percentile (the median by default) of each rank's times per
// iteration, then the maximum across ranks.

// One Concord op of `bytes` on comm, waited for.
concord_status_t RunConcordOp(concord_comm_t comm, const Options& o, int size, size_t bytes,
                              const Buffers& b, const std::string& name) {
  const int64_t count = static_cast<int64_t>(bytes / DTypeSize(o.dtype));
  int64_t per_rank = o.op == "allgather" ? count / size : count;
  concord_tensor_t t{b.in, static_cast<concord_dtype_t>(o.dtype), 1, &per_rank, b.device};
  concord_allreduce_opts_t ao;
  concord_allreduce_opts_init(&ao);
  ao.op = static_cast<concord_reduce_op_t>(o.redop);
  if (o.op == "allreduce") return concord_allreduce(comm, name.c_str(), &t, nullptr, &ao);
  if (o.op == "allgather") return concord_allgather(comm, name.c_str(), &t, b.out, b.capacity);
  if (o.op == "reducescatter") {
    // `bytes` is the input; each rank receives its 1/size share.
    int64_t share = count / size;
    concord_tensor_t out{b.out, static_cast<concord_dtype_t>(o.dtype), 1, &share, b.device};
    concord_reducescatter_opts_t ro;
    concord_reducescatter_opts_init(&ro);
    ro.op = ao.op;
    return concord_reducescatter(comm, name.c_str(), &t, &out, &ro);
  }
  if (o.op == "alltoall") {
    // `bytes` is each rank's input, 1/size of it to every rank (the even split).
    return concord_alltoall(comm, name.c_str(), &t, b.out, b.capacity, nullptr, nullptr, 0);
  }
  if (o.op == "sendrecv") return SendRecvOnce(comm, t, b.out);
  return concord_broadcast(comm, name.c_str(), &t, nullptr, 0);
}

// The known data (bench_common.h) of o.op over `bytes` in b.in, b.out zeroed: what a checked run
// starts from. Host buffers only (a GPU's: HostSide).
void FillKnownData(const Options& o, int rank, int size, size_t bytes, const Buffers& b) {
  const size_t count = bytes / DTypeSize(o.dtype);
  const bool reduces = o.op == "allreduce" || o.op == "reducescatter";
  const auto redop = static_cast<concord_reduce_op_t>(o.redop);
  for (size_t i = 0; i < count; ++i) {
    double v = reduces                            ? bench::ReductionInput(redop, rank, size, i)
               : o.op == "broadcast" && rank != 0 ? 0
                                                  : bench::MoveInput(rank, i);
    StoreElement(b.in, o.dtype, i, v);
  }
  if (b.out != nullptr) std::memset(b.out, 0, b.capacity);
}

// After o.op ran once on FillKnownData's data (in place for allreduce and broadcast, into b.out
// for the others): "" when this rank's result is right, else its first wrong element.
std::string FirstWrongResult(const Options& o, int rank, int size, size_t bytes, const Buffers& b) {
  const size_t count = bytes / DTypeSize(o.dtype);
  const size_t block = count / static_cast<size_t>(size);  // per rank: allgather and the others
  const void* got = b.out;
  size_t n = count;
  std::function<double(size_t)> want;
  if (o.op == "allreduce" || o.op == "broadcast") {
    got = b.in;  // in place
    want = o.op == "allreduce"
               ? bench::ReductionExpected
               : std::function<double(size_t)>([](size_t i) { return bench::MoveInput(0, i); });
  } else if (o.op == "reducescatter") {
    n = block;
    want = [&](size_t j) { return bench::ReductionExpected(rank * block + j); };
  } else if (o.op == "allgather") {
    want = [&](size_t i) { return bench::MoveInput(static_cast<int>(i / block), i % block); };
  } else if (o.op == "alltoall") {  // block r of the output is rank r's block `rank`
    want = [&](size_t i) {
      return bench::MoveInput(static_cast<int>(i / block), rank * block + i % block);
    };
  } else {  // sendrecv
    want = [&](size_t i) { return bench::MoveInput(rank ^ 1, i); };
  }
  return bench::FirstWrongElement(
      n, [&](size_t i) { return LoadElement(got, o.dtype, i); }, want, Tolerance(o.dtype));
}

// Runs the op once on known data (written on the host; on a GPU copied in, and the result copied
// back) and checks this rank's result: "" when right, else the first wrong element, or why it
// could not be checked.
std::string CheckConcordOp(concord_comm_t comm, const Options& o, int rank, int size, size_t bytes,
                           const Buffers& b, const std::string& name) {
  const Buffers host = HostSide(b);
  FillKnownData(o, rank, size, bytes, host);
  Status copied = CopyCheckedRun(b, bytes, /*to_device=*/true);
  // Every rank runs the op, whatever its copy gave, so that no peer waits for it alone.
  Check(comm, RunConcordOp(comm, o, size, bytes, b, name), o.op + " (checked run)");
  if (copied.ok()) copied = CopyCheckedRun(b, bytes, /*to_device=*/false);
  if (!copied.ok()) return "not checked: " + copied.ToString();
  return FirstWrongResult(o, rank, size, bytes, host);
}

// Benchmarks one Concord op at one size on each of `comms` (communicators of the same ranks),
// iterations alternating between them, the order of each round reversed in the next; returns
// each one's seconds per op (max over ranks), and in *right whether its checked run gave every
// rank the right result.
std::vector<double> TimeConcordOp(const std::vector<concord_comm_t>& comms, const Options& o,
                                  int rank, int size, size_t bytes, const Buffers& b,
                                  std::vector<bool>* right) {
  const std::string name = "perf." + o.op + "." + std::to_string(bytes);
  std::vector<std::vector<double>> times(comms.size());
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    for (size_t k = 0; k < comms.size(); ++k) {
      const size_t c = i % 2 == 0 ? k : comms.size() - 1 - k;
      if (i == 0 || i == o.warmup) Check(comms[c], concord_barrier(comms[c]), "barrier");
      const double t0 = Now();
      Check(comms[c], RunConcordOp(comms[c], o, size, bytes, b, name), o.op);
      if (i >= o.warmup) times[c].push_back(Now() - t0);
    }
  }
  std::vector<double> seconds;
  right->clear();
  for (size_t c = 0; c < comms.size(); ++c) {
    seconds.push_back(MaxAcrossRanks(comms[0], Percentile(times[c], o.percentile),
                                     name + ".time." + std::to_string(c)));
    const std::string what = c == 0 ? "concord" : "concord deterministic";
    right->push_back(RightOnEveryRank(comms[0], rank, what + " " + o.op,
                                      CheckConcordOp(comms[c], o, rank, size, bytes, b, name),
                                      name + ".right." + std::to_string(c)));
  }
  return seconds;
}

// A store prefix no earlier raw row of this run used (every rank numbers its raw rows alike): a
// size met twice once reused the first one's keys, and its Gloo pairs failed to connect or
// connected to stale addresses.
std::string FreshPrefix(const std::string& what) {
  static int rows = 0;
  return "perf/raw/" + std::to_string(rows++) + "/" + what;
}

// The raw rows' times and checks, reduced over the ranks: the time (-1 when it could not run on
// some rank: why is printed) and, in *right, whether every rank's checked run was right (a
// MISMATCH from perf/gloo_raw; the rank's message is printed).
double RawResult(concord_comm_t comm, int rank, const std::string& what,
                 const StatusOr<std::vector<double>>& times, double percentile,
                 const std::string& name, bool* right) {
  double t = -1;
  if (times.ok()) {
    t = Percentile(*times, percentile);
  } else if (times.status().code() == Code::kInvalidArgument) {  // every rank: said once
    if (rank == 0) {
      std::fprintf(stderr, "concord-perf: %s skipped: %s\n", what.c_str(),
                   times.status().message().c_str());
    }
  } else {
    std::fprintf(stderr, "concord-perf: %s failed on rank %d: %s\n", what.c_str(), rank,
                 times.status().ToString().c_str());
  }
  const bool wrong = !times.ok() && times.status().code() == Code::kMismatch;
  *right = MaxAcrossRanks(comm, wrong ? 1 : 0, name + ".right") == 0;
  // A rank that failed makes the row -1, whatever the others measured.
  const double worst = MaxAcrossRanks(comm, t < 0 ? 1 : 0, name + ".failed");
  t = MaxAcrossRanks(comm, t, name);
  return worst > 0 ? -1 : t;
}

// Seconds per raw Gloo allreduce of `count` floats with one algorithm (max over ranks);
// -1 when it could not run; *right as RawResult.
double TimeRawGloo(concord_comm_t comm, Store* store, const Options& o, int rank, int size,
                   const std::string& algo, size_t count, const std::string& tag, bool* right) {
  RawGlooOptions ro;
  ro.rank = rank;
  ro.size = size;
  if (const char* iface = std::getenv("CONCORD_IFACE")) ro.iface = iface;
  ro.prefix = FreshPrefix(tag + "/" + algo + "/" + std::to_string(count));
  ro.algorithm = algo;
  ro.count = count;
  ro.iterations = o.iters;
  ro.warmup = o.warmup;
  ro.timeout = o.raw_timeout;
  const bool exchange = o.op != "allreduce";
  auto times = exchange ? RunRawGlooExchange(ro, store) : RunRawGlooAllreduce(ro, store);
  return RawResult(comm, rank, "raw gloo " + algo, times, o.percentile,
                   "perf.raw." + tag + "." + algo + "." + std::to_string(count), right);
}

// Seconds per raw Gloo pair exchange of `count` floats (max over ranks); -1 when it failed;
// *right as RawResult.
double TimeRawGlooSendRecv(concord_comm_t comm, Store* store, const Options& o, int rank, int size,
                           size_t count, bool* right) {
  RawGlooOptions ro;
  ro.rank = rank;
  ro.size = size;
  if (const char* iface = std::getenv("CONCORD_IFACE")) ro.iface = iface;
  ro.prefix = FreshPrefix("p2p/" + std::to_string(count));
  ro.count = count;
  ro.iterations = o.iters;
  ro.warmup = o.warmup;
  ro.timeout = o.raw_timeout;
  return RawResult(comm, rank, "raw gloo send/recv", RunRawGlooSendRecv(ro, store), o.percentile,
                   "perf.raw_p2p." + std::to_string(count), right);
}

// Why this build or this MPI cannot run raw MPI rows ("" when it can); said once, on rank 0.
std::string NoRawMpi(int rank) {
#ifdef CONCORD_PERF_MPI
  const std::string why = RawMpiUnavailableReason();
#else
  const std::string why = "concord-perf was built without MPI";
#endif
  static bool told = false;
  if (!why.empty() && rank == 0 && !told) {
    std::fprintf(stderr, "concord-perf: no raw MPI rows: %s\n", why.c_str());
    told = true;
  }
  return why;
}

// The raw MPI row of o.op (float32; a sum where it reduces) over `bytes` of b, on MPI_COMM_WORLD:
// in-place MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Alltoallv, MPI_Allgather, in-place
// MPI_Bcast or MPI_Sendrecv, as perf/mpi_raw.h. Returns its seconds per op (max over ranks), -1
// when MPI cannot run it here; then runs it once on known data: *right says whether every rank's
// result was right.
double TimeRawMpiRow(concord_comm_t comm, const Options& o, int rank, int size, const Buffers& b,
                     size_t bytes, bool* right) {
  *right = true;
  if (!NoRawMpi(rank).empty()) return -1;
#ifdef CONCORD_PERF_MPI
  const size_t count = bytes / sizeof(float), block = count / static_cast<size_t>(size);
  auto* in = static_cast<float*>(b.in);
  auto* out = static_cast<float*>(b.out);
  const auto run = [&](int warmup, int iters) {
    if (o.op == "reducescatter") return TimeRawMpiReduceScatterBlock(in, out, block, warmup, iters);
    if (o.op == "alltoall") return TimeRawMpiAlltoallv(in, out, block, warmup, iters);
    if (o.op == "allgather") return TimeRawMpiAllgather(in, out, block, warmup, iters);
    if (o.op == "broadcast") return TimeRawMpiBcast(in, count, warmup, iters);
    if (o.op == "sendrecv") return TimeRawMpiSendrecv(in, out, bytes, warmup, iters);
    return TimeRawMpiAllreduce(in, count, warmup, iters);
  };
  const std::string name = "perf.raw.mpi." + o.op + "." + std::to_string(bytes);
  const double t = MaxAcrossRanks(comm, Percentile(run(o.warmup, o.iters), o.percentile), name);
  FillKnownData(o, rank, size, bytes, b);
  run(0, 1);
  *right = RightOnEveryRank(comm, rank, "raw MPI " + o.op,
                            FirstWrongResult(o, rank, size, bytes, b), name + ".right");
  return t;
#else
  (void)comm;
  (void)o;
  (void)size;
  (void)b;
  (void)bytes;
  return -1;
#endif
}

#ifdef CONCORD_PERF_NCCL
// Seconds per raw ncclAllReduce of `count` floats on the sweep's device buffer (max over
// ranks); -1 when it could not run; *right as RawResult.
double TimeRawNccl(concord_comm_t comm, Store* store, const Options& o, int rank, int size,
                   const Buffers& b, size_t count, bool* right) {
  RawNcclOptions ro;
  ro.rank = rank;
  ro.size = size;
  ro.device = b.device;
  ro.prefix = "perf/raw_nccl/" + std::to_string(count);
  ro.count = count;
  ro.iterations = o.iters;
  ro.warmup = o.warmup;
  ro.timeout = o.raw_timeout;
  return RawResult(comm, rank, "raw nccl", RunRawNcclAllreduce(ro, b.in, store), o.percentile,
                   "perf.raw_nccl." + std::to_string(count), right);
}
#endif

// `s` as a JSON string literal (a workload file's name may hold quotes or backslashes).
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// Whether the file was written whole.
bool WriteJson(const std::string& path, const std::vector<Row>& rows, double percentile) {
  std::ofstream f(path);
  f << "[\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    f << "  {\"op\": " << JsonString(r.op) << ", \"implementation\": " << JsonString(r.impl)
      << ", \"backend\": " << JsonString(r.backend) << ", \"ranks\": " << r.ranks
      << ", \"bytes\": " << r.bytes << ", \"workload\": " << JsonString(r.workload)
      << ", \"time_us\": " << r.seconds * 1e6 << ", \"percentile\": " << percentile
      << ", \"algbw_gbps\": " << r.algbw << ", \"busbw_gbps\": " << r.busbw
      << ", \"checked\": " << (r.checked ? "true" : "false") << "}"
      << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  f << "]\n";
  f.close();
  if (!f) std::fprintf(stderr, "concord-perf: could not write %s\n", path.c_str());
  return static_cast<bool>(f);
}

std::unique_ptr<Store> OpenRawStore(int size, std::chrono::milliseconds timeout) {
  if (size == 1) return std::make_unique<HashStore>();
  const char* url = std::getenv("CONCORD_STORE");
  const char* token = std::getenv("CONCORD_TOKEN");
  if (url == nullptr) return nullptr;
  auto store = OpenStore(url, token ? token : "", Deadline::After(timeout), timeout);
  if (!store.ok()) {
    std::fprintf(stderr, "concord-perf: raw rows disabled: %s\n",
                 store.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*store);
}

// `deterministic`: null, or a communicator of the same ranks in deterministic mode
// (--versus-deterministic) whose rows run beside Concord's.
// One size's rows: Concord's (and the deterministic twin's), then the raw ones.
int RunSweep(concord_comm_t comm, concord_comm_t deterministic, const Options& o, int rank,
             int size, Store* store, const Buffers& b, std::vector<Row>* rows) {
  const bool float_sum =
      o.op == "allreduce" && o.dtype == DType::kFloat32 && o.redop == ReduceOp::kSum;
  // The other collectives' raw rows: Gloo's own and MPI's reduce-scatter, all-to-all, allgather
  // and broadcast (float32; a reduce-scatter sums).
  const bool moves_only = o.op == "alltoall" || o.op == "allgather" || o.op == "broadcast";
  const bool exchange = (moves_only || o.op == "reducescatter") && o.dtype == DType::kFloat32 &&
                        (moves_only || o.redop == ReduceOp::kSum) && size > 1;
  const bool raw = o.raw && store != nullptr && (float_sum || exchange);
  // Raw MPI runs on MPI_COMM_WORLD: beside a sub-communicator's rows it would time other ranks
  // (and with group:..., wait for ranks that never call it).
  const bool raw_mpi = o.raw && o.backend == "mpi" && o.comm == "world" && (float_sum || exchange);
  const bool sendrecv_raw =
      o.raw && o.op == "sendrecv" && o.dtype == DType::kFloat32 && o.comm == "world";
  if (o.op == "sendrecv" && size % 2 != 0) {
    if (rank == 0)
      std::fprintf(stderr, "concord-perf: --op sendrecv needs an even number of ranks\n");
    return 2;
  }
  const size_t elem = DTypeSize(o.dtype);
  // Sizes are rounded down to whole elements, per rank where the op splits its buffer by rank.
  const bool per_rank = o.op == "allgather" || o.op == "reducescatter" || o.op == "alltoall";
  const size_t unit = per_rank ? elem * static_cast<size_t>(size) : elem;
  if (o.max_bytes / unit * unit < o.min_bytes && o.min_bytes > 0) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "concord-perf: --bytes %zu:%zu holds no size of whole %s elements%s (%zu bytes "
                   "each)\n",
                   o.min_bytes, o.max_bytes, DTypeName(o.dtype), per_rank ? " per rank" : "", unit);
    }
    return 2;
  }
  if (rank == 0) {
    const std::string where = b.device == CONCORD_DEVICE_CPU
                                  ? std::string("CPU buffers")
                                  : "CUDA device " + std::to_string(b.device) + " buffers";
    std::printf("# concord-perf %s, %s, %s, %d ranks, %d iterations after %d warm-up, %s, %s%s\n",
                o.op.c_str(), DTypeName(o.dtype), ReduceOpName(o.redop), size, o.iters, o.warmup,
                where.c_str(), o.backend.c_str(), StatName(o).c_str());
    std::printf("%12s  %-26s %12s %10s %10s\n", "bytes", "implementation", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)");
  }
  bool all_right = true;
  // Adds a row (printed on rank 0); `compare`: the Concord row it is set beside, with `label`.
  const auto add = [&](Row r, const Row* compare, const char* label) {
    all_right = all_right && r.checked;
    rows->push_back(r);
    if (rank != 0) return;
    PrintRow(r);
    if (compare != nullptr) {
      std::printf("%12s  %s: time x%.2f, busbw x%.2f\n", "", label, compare->seconds / r.seconds,
                  r.seconds / compare->seconds);
    }
  };
  size_t last = 0;
  bool first = true;
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes;) {
    const size_t rounded = bytes / unit * unit;
    // The next size, computed in double: the product may pass what a size_t holds.
    const double next = static_cast<double>(bytes) * o.factor;
    bytes = next <= static_cast<double>(o.max_bytes)
                ? std::max(static_cast<size_t>(next), bytes + 1)
                : o.max_bytes + 1;
    if (rounded < o.min_bytes && o.min_bytes > 0) continue;  // below MIN once rounded
    if (!first && rounded == last) continue;                 // already run
    first = false;
    last = rounded;
    std::vector<concord_comm_t> comms = {comm};
    if (deterministic != nullptr) comms.push_back(deterministic);
    std::vector<bool> right;
    const std::vector<double> seconds = TimeConcordOp(comms, o, rank, size, rounded, b, &right);
    Row concord_row = MakeRow(o.op, "concord", size, rounded, seconds[0], o.backend);
    concord_row.checked = right[0];
    add(concord_row, nullptr, "");
    if (deterministic != nullptr) {
      Row r = MakeRow(o.op, "concord deterministic", size, rounded, seconds[1], o.backend);
      r.checked = right[1];
      add(r, nullptr, "");
      if (rank == 0) {
        std::printf("%12s  deterministic/default: time x%.3f (%+.1f%%)\n", "",
                    seconds[1] / seconds[0], 100 * (seconds[1] / seconds[0] - 1));
      }
    }
    if (rounded == 0) continue;  // raw rows need an element (per rank)
    if (raw_mpi || (sendrecv_raw && o.backend == "mpi")) {
      const char* what = o.op == "reducescatter" ? "raw MPI_Reduce_scatter_block"
                         : o.op == "alltoall"    ? "raw MPI_Alltoallv"
                         : o.op == "allgather"   ? "raw MPI_Allgather"
                         : o.op == "broadcast"   ? "raw MPI_Bcast"
                         : o.op == "sendrecv"    ? "raw MPI_Sendrecv"
                                                 : "raw MPI_Allreduce";
      bool checked = true;
      const double t = TimeRawMpiRow(comm, o, rank, size, b, rounded, &checked);
      if (t > 0) {
        Row r = MakeRow(o.op, what, size, rounded, t);
        r.checked = checked;
        add(r, &concord_row, "concord/raw MPI");
      }
    }
#ifdef CONCORD_PERF_NCCL
    if (raw && float_sum && o.backend == "nccl") {  // ncclAllReduce: beside allreduces only
      bool checked = true;
      const double t = TimeRawNccl(comm, store, o, rank, size, b, rounded / 4, &checked);
      if (t > 0 || !checked) {
        Row r = MakeRow(o.op, "raw nccl", size, rounded, std::max(t, 0.0), "nccl");
        r.checked = checked;
        add(r, checked ? &concord_row : nullptr, "concord/raw nccl");
      }
    }
#endif
    if (sendrecv_raw && o.backend == "gloo" && store != nullptr) {
      bool checked = true;
      const double t = TimeRawGlooSendRecv(comm, store, o, rank, size, rounded / 4, &checked);
      if (t > 0) {
        Row r = MakeRow(o.op, "raw gloo pair send/recv", size, rounded, t, o.backend);
        r.checked = checked;
        add(r, &concord_row, "concord/raw");
      }
    }
    if (raw && o.backend == "gloo") {
      double best = 0;
      const std::vector<std::string> exchange_algos =
          o.op == "reducescatter" ? std::vector<std::string>{"reduce_scatter_hd"}
          : o.op == "alltoall"    ? std::vector<std::string>{"alltoall", "alltoallv"}
                                  : std::vector<std::string>{o.op};
      for (const auto& algo : exchange ? exchange_algos : o.raw_algos) {
        bool checked = true;
        const double t =
            TimeRawGloo(comm, store, o, rank, size, algo, rounded / 4, "sweep", &checked);
        if (t < 0 && checked) continue;
        Row r = MakeRow(o.op, "raw gloo " + algo, size, rounded, std::max(t, 0.0));
        r.checked = checked;
        add(r, nullptr, "");
        if (checked && (best == 0 || t < best)) best = t;
      }
      if (rank == 0 && best > 0) {
        std::printf("%12s  concord/best raw: time x%.2f, busbw x%.2f\n", "",
                    concord_row.seconds / best, best / concord_row.seconds);
      }
    }
  }
  return all_right ? 0 : 1;
}

int RunWorkload(concord_comm_t comm, const Options& o, int rank, int size, Store* store,
                std::vector<Row>* rows) {
  auto loaded = LoadWorkload(o.workload);
  if (!loaded.ok()) {
    std::fprintf(stderr, "concord-perf: %s\n", loaded.status().ToString().c_str());
    return 2;
  }
  const Workload& w = *loaded;
  std::vector<std::vector<uint8_t>> buffers;
  for (const auto& t : w.tensors) buffers.emplace_back(t.bytes, 0);
  if (rank == 0) {
    std::printf(
        "# concord-perf workload %s: %zu tensors, %.1f MB, %d ranks, %d steps after %d "
        "warm-up%s; a row: the median over %d rounds\n",
        w.name.c_str(), w.tensors.size(), w.total_bytes / 1e6, size, o.steps, o.warmup,
        StatName(o).c_str(), o.rounds);
  }
  // Rounds alternate Concord's steps with the raw single allreduces, so both sides see the same
  // moments of a noisy machine; each round gives one ratio, and the spread of ratios is printed.
  std::vector<concord_request_t> requests(w.tensors.size());
  // One step: every tensor's allreduce enqueued in backward order, then all waited for. Returns
  // the seconds it took; adds the bytes this rank put on the wire to *wire.
  auto step_once = [&](const char* compression, uint64_t* wire) {
    concord_allreduce_opts_t opts;
    concord_allreduce_opts_init(&opts);
    opts.compression = compression;
    Check(comm, concord_barrier(comm), "barrier");
    const double t0 = Now();
    for (size_t i = 0; i < w.tensors.size(); ++i) {
      const auto& t = w.tensors[i];
      concord_tensor_t ct{buffers[i].data(), static_cast<concord_dtype_t>(t.dtype),
                          static_cast<int>(t.shape.size()), t.shape.data(), CONCORD_DEVICE_CPU};
      Check(comm,
            concord_allreduce_async(comm, t.name.c_str(), &ct, nullptr, &opts, nullptr, nullptr,
                                    &requests[i]),
            "allreduce of " + t.name);
    }
    for (auto* r : requests) {
      Check(comm, concord_wait(r, -1), "allreduce");
      uint64_t bytes = 0;
      Check(comm, concord_request_wire_bytes(r, &bytes), "wire bytes");
      *wire += bytes;
      concord_request_free(r);
    }
    return Now() - t0;
  };
  const bool raw = o.raw && o.backend == "gloo" && store != nullptr;
  const bool raw_mpi = o.raw && o.backend == "mpi" && o.comm == "world";
  // The raw rows: one float32 sum allreduce of the step's bytes.
  Options raw_opts = o;
  raw_opts.op = "allreduce";
  raw_opts.dtype = DType::kFloat32;
  raw_opts.redop = ReduceOp::kSum;
  raw_opts.iters = o.steps;
  raw_opts.warmup = 1;
  std::vector<float> raw_mpi_buffer(raw_mpi ? w.total_bytes / 4 : 0);
  Buffers raw_mpi_buffers;
  raw_mpi_buffers.in = raw_mpi_buffer.data();
  bool all_right = true;
  std::vector<double> raw_mpi_rounds;
  std::vector<double> concord_rounds, ratios;
  std::vector<std::vector<double>> raw_rounds(o.raw_algos.size());
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<double> step_times;
    const int warmup = round == 0 ? o.warmup : 0;
    for (int step = 0; step < warmup + o.steps; ++step) {
      uint64_t wire = 0;
      const double t = step_once(nullptr, &wire);
      if (step >= warmup) step_times.push_back(t);
    }
    concord_rounds.push_back(
        MaxAcrossRanks(comm, Percentile(step_times, o.percentile), "perf.workload.time"));
    if (raw_mpi) {
      bool right = true;
      const double t = TimeRawMpiRow(comm, raw_opts, rank, size, raw_mpi_buffers,
                                     raw_mpi_buffer.size() * sizeof(float), &right);
      all_right = all_right && right;
      if (t > 0 && right) {
        raw_mpi_rounds.push_back(t);
        ratios.push_back(concord_rounds.back() / t);
      }
    }
    if (!raw) continue;
    // The same bytes as one raw Gloo allreduce: what a step costs with no per-tensor work at all.
    double best = 0;
    for (size_t a = 0; a < o.raw_algos.size(); ++a) {
      bool right = true;
      const double t = TimeRawGloo(comm, store, raw_opts, rank, size, o.raw_algos[a],
                                   w.total_bytes / 4, "workload" + std::to_string(round), &right);
      all_right = all_right && right;
      if (t < 0 || !right) continue;
      raw_rounds[a].push_back(t);
      if (best == 0 || t < best) best = t;
    }
    if (best > 0) ratios.push_back(concord_rounds.back() / best);
  }
  // One checked step: every tensor filled with known data, its sum compared.
  std::string wrong;
  for (size_t i = 0; i < w.tensors.size(); ++i) {
    for (size_t e = 0; e < static_cast<size_t>(w.tensors[i].elements); ++e) {
      StoreElement(buffers[i].data(), w.tensors[i].dtype, e,
                   bench::ReductionInput(CONCORD_SUM, rank, size, e));
    }
  }
  uint64_t checked_wire = 0;
  step_once(nullptr, &checked_wire);
  for (size_t i = 0; i < w.tensors.size() && wrong.empty(); ++i) {
    const WorkloadTensor& t = w.tensors[i];
    wrong = bench::FirstWrongElement(
        static_cast<size_t>(t.elements),
        [&](size_t e) { return LoadElement(buffers[i].data(), t.dtype, e); },
        bench::ReductionExpected, Tolerance(t.dtype));
    if (!wrong.empty()) wrong = t.name + ": " + wrong;
  }
  Row row = MakeRow("allreduce", "concord step", size, w.total_bytes, Median(concord_rounds));
  row.workload = w.name;
  row.checked = RightOnEveryRank(comm, rank, "concord step", wrong, "perf.workload.right");
  all_right = all_right && row.checked;
  rows->push_back(row);
  if (rank == 0) {
    std::printf("%12s  %-26s %12s %10s %10s\n", "bytes", "implementation", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)");
    PrintRow(row);
  }
  for (size_t a = 0; a < o.raw_algos.size(); ++a) {
    if (raw_rounds[a].empty()) continue;
    Row r = MakeRow("allreduce", "raw gloo " + o.raw_algos[a] + " (1 msg)", size, w.total_bytes,
                    Median(raw_rounds[a]));
    r.workload = w.name;
    rows->push_back(r);
    if (rank == 0) PrintRow(r);
  }
  if (!raw_mpi_rounds.empty()) {
    Row r = MakeRow("allreduce", "raw MPI_Allreduce (1 msg)", size, w.total_bytes,
                    Median(raw_mpi_rounds));
    r.workload = w.name;
    rows->push_back(r);
    if (rank == 0) PrintRow(r);
  }
  if (rank == 0 && !ratios.empty()) {
    std::printf("%12s  concord step / best raw single allreduce, per round:", "");
    for (double x : ratios) std::printf(" x%.2f", x);
    std::printf("  (median x%.2f)\n", Median(ratios));
  }
  if (!all_right) {
    if (rank == 0 && row.checked) {
      std::printf(
          "%12s  WRONG RESULT: a raw row's checked run was wrong (the rank's message is on "
          "stderr); its times are left out\n",
          "");
    }
    return 1;
  }
  if (o.compressions.empty()) return 0;
  // Compression: the same steps with each compressor (none first, as the reference), each rank's
  // bytes on the wire per step (the most of any rank), and the ratio to none.
  std::vector<std::string> specs = {"none"};
  for (const auto& s : o.compressions) {
    if (s != "none") specs.push_back(s);
  }
  if (rank == 0) {
    std::printf(
        "# compression (results not checked: lossy)%s, and the bytes one rank puts on the "
        "wire per step\n",
        StatName(o).c_str());
    std::printf("%-40s %12s %14s %10s\n", "compression", "time(us)", "wire(MB/step)", "vs none");
  }
  double none_wire = 0;
  for (const auto& spec : specs) {
    std::vector<double> times;
    double wire_step = 0;
    for (int step = 0; step < o.warmup + o.steps; ++step) {
      uint64_t wire = 0;
      const double t = step_once(spec.c_str(), &wire);
      if (step >= o.warmup) times.push_back(t);
      wire_step = static_cast<double>(wire);
    }
    const double t =
        MaxAcrossRanks(comm, Percentile(times, o.percentile), "perf.compression.time." + spec);
    wire_step = MaxAcrossRanks(comm, wire_step, "perf.compression.wire." + spec);
    if (spec == "none") none_wire = wire_step;
    Row r = MakeRow("allreduce", "concord step (" + spec + ")", size, w.total_bytes, t);
    r.workload = w.name;
    rows->push_back(r);
    if (rank == 0) {
      std::printf("%-40s %12.1f %14.2f %9.3fx\n", spec.c_str(), t * 1e6, wire_step / 1e6,
                  none_wire > 0 ? wire_step / none_wire : 0.0);
    }
  }
  return 0;
}

}  // namespace
// --comm split:K or group:...: the sub-communicator of this rank (timing its creation), or null.
concord_comm_t SubCommunicator(concord_comm_t world, const Options& o) {
  const std::vector<int>& ranks = o.comm_ranks;
  int rank = 0;
  concord_comm_rank(world, &rank);
  concord_comm_t sub = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  concord_status_t s;
  if (o.comm.rfind("split:", 0) == 0) {
    s = concord_comm_split(world, rank / ranks.front(), rank, &sub);
  } else {
    s = concord_comm_create_group(world, ranks.data(), static_cast<int>(ranks.size()), &sub);
  }
  Check(world, s, "--comm " + o.comm);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const double slowest = MaxAcrossRanks(world, ms, "comm.created");
  if (rank == 0) {
    std::printf("# --comm %s: sub-communicators created in %.1f ms (the slowest rank)\n",
                o.comm.c_str(), slowest);
    int world_size = 1;
    concord_comm_size(world, &world_size);
    // Each sub-communicator's rank 0 prints its own table (its header gives its ranks); --json
    // holds world rank 0's.
    if (o.comm.rfind("split:", 0) == 0 && world_size % ranks.front() != 0) {
      std::printf("# --comm %s on %d ranks: the last sub-communicator has %d ranks, not %d\n",
                  o.comm.c_str(), world_size, world_size % ranks.front(), ranks.front());
    }
  }
  return sub;
}

// --versus-deterministic: a second world communicator in deterministic mode, under a job id of
// its own (rank 0's random token, broadcast on `world`) so that its rendezvous does not meet the
// first's; null (saying why) when it cannot be made.
concord_comm_t DeterministicTwin(concord_comm_t world, const Options& o) {
  int64_t token = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
  int64_t one = 1;
  concord_tensor_t t{&token, CONCORD_INT64, 1, &one, CONCORD_DEVICE_CPU};
  Check(world, concord_broadcast(world, "perf.twin.token", &t, nullptr, 0), "broadcast");
  const std::string job = "concord-perf.deterministic." + std::to_string(token);
  concord_config_t config;
  concord_config_init(&config);
  config.backend = o.backend.c_str();
  config.job_id = job.c_str();
  config.deterministic = 1;
  concord_comm_t twin = nullptr;
  if (concord_init_config(&config, &twin) != CONCORD_SUCCESS) {
    std::fprintf(stderr, "concord-perf: --versus-deterministic: init failed: %s\n",
                 concord_comm_last_error(nullptr));
    return nullptr;
  }
  return twin;
}

}  // namespace concord

int main(int argc, char** argv) {
  using namespace concord;
  const Options o = ParseOptions(argc, argv);
  if (o.backend == "nccl") {
#ifdef CONCORD_PERF_NCCL
    // Every rank asks for the same backend (CONCORD_BACKEND must agree across ranks).
    setenv("CONCORD_BACKEND", "nccl", 1);
    if (auto count = cuda::DeviceCount(); !count.ok()) {
      std::printf("concord-perf: --backend nccl skipped: no usable GPU: %s [NCCL %s]\n",
                  count.status().message().c_str(), cuda::NcclVersion().c_str());
      return 0;
    }
#else
    std::fprintf(stderr,
                 "concord-perf: --backend nccl: this build has no NCCL backend (it needs CUDA and "
                 "NCCL at configure time)\n");
    return 1;
#endif
  }
  concord_comm_t comm = nullptr;
  concord_config_t config;
  concord_config_init(&config);
  config.backend = o.backend.c_str();
  // Beside its deterministic twin, the default mode whatever CONCORD_DETERMINISTIC says.
  if (o.versus_deterministic) config.deterministic = 0;
  if (concord_init_config(&config, &comm) != CONCORD_SUCCESS) {
    std::fprintf(stderr, "concord-perf: init failed: %s\n", concord_comm_last_error(nullptr));
    return 1;
  }
  concord_comm_t world = comm;
  const bool on_world = o.comm == "world";
  int world_rank = 0;
  concord_comm_rank(world, &world_rank);
  if (!on_world) {
    comm = SubCommunicator(world, o);
    if (comm == nullptr) {  // not a member: idle until the members are done (a barrier waits
      // past finalize's timeout, up to the stall shutdown: CONCORD_STALL_SHUTDOWN_S, 600 s)
      Check(world, concord_barrier(world), "the closing barrier");
      concord_finalize(world);
      return 0;
    }
  }
  int rank = 0, size = 1, local_rank = 0;
  concord_comm_rank(comm, &rank);
  concord_comm_size(comm, &size);
  concord_comm_local_rank(comm, &local_rank);
  // Raw rows rendezvous among the whole job: on sub-communicators only Concord's rows run.
  // Gloo's raw rows run over TCP: beside gloo-ibverbs they would measure another transport.
  if (o.raw && o.backend == "gloo-ibverbs" && rank == 0) {
    std::printf("# --backend gloo-ibverbs: Concord rows only (the raw Gloo rows use TCP)\n");
  }
  std::unique_ptr<Store> store = o.raw && on_world && (o.backend == "gloo" || o.backend == "nccl")
                                     ? OpenRawStore(size, o.raw_timeout)
                                     : nullptr;
  std::vector<Row> rows;
  Buffers b;
  b.capacity = std::max(o.max_bytes, DTypeSize(o.dtype));
  std::vector<uint8_t> host_in, host_out;
#ifdef CONCORD_PERF_NCCL
  cuda::DeviceBuffer device_in, device_out;
  if (o.backend == "nccl") {
    b.device = local_rank % *cuda::DeviceCount();  // the device Concord's NCCL backend uses
    auto in = cuda::DeviceBuffer::Allocate(b.device, b.capacity);
    auto out = cuda::DeviceBuffer::Allocate(b.device, b.capacity);
    Status ready = !in.ok() ? in.status() : !out.ok() ? out.status() : in->Fill(0);
    if (!ready.ok()) {
      std::fprintf(stderr, "concord-perf: device buffers: %s\n", ready.ToString().c_str());
      if (comm != world) concord_finalize(comm);
      concord_finalize(world);
      return 1;
    }
    device_in = std::move(*in);
    device_out = std::move(*out);
    b.in = device_in.data();
    b.out = device_out.data();
  }
#endif
  // The sweep's buffers on the CPU; on a GPU, where the checked runs' data is written and read.
  try {
    host_in.resize(b.capacity);
    host_out.resize(b.capacity);
  } catch (const std::exception&) {  // --bytes beyond this host's memory: said, not a crash
    std::fprintf(stderr, "concord-perf: cannot allocate two buffers of %zu bytes (--bytes MAX)\n",
                 b.capacity);
    if (comm != world) concord_finalize(comm);
    concord_finalize(world);
    return 1;
  }
  if (b.device == CONCORD_DEVICE_CPU) {
    b.in = host_in.data();
    b.out = host_out.data();
  } else {
    b.check_in = host_in.data();
    b.check_out = host_out.data();
  }
  concord_comm_t deterministic = o.versus_deterministic ? DeterministicTwin(world, o) : nullptr;
  if (o.versus_deterministic && deterministic == nullptr) {
    if (comm != world) concord_finalize(comm);
    concord_finalize(world);
    return 1;
  }
  const int rc = o.workload.empty()
                     ? RunSweep(comm, deterministic, o, rank, size, store.get(), b, &rows)
                     : RunWorkload(comm, o, rank, size, store.get(), &rows);
  for (Row& r : rows) r.backend = o.backend;
  // One file per job: world rank 0's; with --comm split:K the rows of its sub-communicator (each
  // group's rank 0 prints its own table), with group:... the group's rank 0's.
  const bool writer = on_world || o.comm.rfind("split:", 0) == 0 ? world_rank == 0 : rank == 0;
  // Rows with a wrong result (rc 1) are written too, "checked": false.
  const bool written =
      rc == 2 || !writer || o.json.empty() || WriteJson(o.json, rows, o.percentile);
  if (deterministic != nullptr) concord_finalize(deterministic);
  if (comm != world) {
    concord_finalize(comm);
    Check(world, concord_barrier(world), "the closing barrier");
  }
  concord_finalize(world);
  return rc != 0 ? rc : written ? 0 : 1;
}
