// pack_bench: bandwidth of the batched CUDA pack/unpack kernels over a model's gradient tensors (a
// perf/workloads file), beside cudaMemcpy device-to-device of the same total bytes and beside
// one cudaMemcpyAsync per tensor (what packing costs without a batched kernel). Tensors live in one
// device arena at 256-byte boundaries, as a caching allocator places them. GB/s is payload bytes
// (the tensors' bytes, padding excluded) over the time of one operation, averaged over --iters
// back-to-back launches after --warmup ones.
//
//   pack_bench --check-device               exit 0 when a GPU is usable, 2 (saying why) when not
//   pack_bench --workload FILE [--workload FILE ...] [--iters N] [--warmup N] [--dtype T]
//              [--scale S]
// A bad option or value is a usage error (exit 2), and a workload file that cannot be read an
// error naming it (exit 1), before any device is touched.
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_packer.h"
#include "perf/bench_common.h"
#include "perf/workload.h"

namespace concord {
namespace {

struct Options {
  std::vector<std::string> workloads;
  int iters = 20;
  int warmup = 3;
  bool override_dtype = false;
  DType dtype = DType::kFloat32;
  double scale = 0.5;
};

// Seconds per call of `op`, averaged over `iters` calls after `warmup` ones.
StatusOr<double> Time(const std::function<Status()>& op, const Options& o) {
  for (int i = 0; i < o.warmup; ++i) CONCORD_RETURN_IF_ERROR(op());
  CONCORD_RETURN_IF_ERROR(cuda::SynchronizeStream(nullptr));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) CONCORD_RETURN_IF_ERROR(op());
  CONCORD_RETURN_IF_ERROR(cuda::SynchronizeStream(nullptr));
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / o.iters;
}

void PrintRow(const char* what, double seconds, size_t bytes, double memcpy_seconds) {
  std::printf("| %-34s | %10.1f | %8.1f | %6.2fx |\n", what, seconds * 1e6,
              static_cast<double>(bytes) / seconds / 1e9, memcpy_seconds / seconds);
}

Status RunWorkload(Workload w, cuda::CudaPacker& packer, const Options& o) {
  std::vector<size_t> offsets;
  size_t arena_bytes = 0;
  for (WorkloadTensor& t : w.tensors) {
    if (o.override_dtype) t.dtype = o.dtype;
    t.bytes = static_cast<size_t>(t.elements) * DTypeSize(t.dtype);
    offsets.push_back(arena_bytes);
    arena_bytes += (t.bytes + 255) / 256 * 256;
  }
  CONCORD_ASSIGN_OR_RETURN(cuda::DeviceBuffer arena, cuda::DeviceBuffer::Allocate(0, arena_bytes));
  CONCORD_RETURN_IF_ERROR(arena.Fill(0x3C));  // finite values in every floating type
  std::vector<cuda::PackTensor> tensors;
  for (size_t i = 0; i < w.tensors.size(); ++i) {
    tensors.push_back({static_cast<char*>(arena.data()) + offsets[i], w.tensors[i].dtype,
                       static_cast<size_t>(w.tensors[i].elements)});
  }
  CONCORD_ASSIGN_OR_RETURN(cuda::PackPlan plan, cuda::PlanPack(tensors));
  CONCORD_ASSIGN_OR_RETURN(cuda::DeviceBuffer fusion,
                           cuda::DeviceBuffer::Allocate(0, plan.total_bytes));
  CONCORD_ASSIGN_OR_RETURN(cuda::DeviceBuffer copy_src,
                           cuda::DeviceBuffer::Allocate(0, plan.payload_bytes));
  CONCORD_ASSIGN_OR_RETURN(cuda::DeviceBuffer copy_dst,
                           cuda::DeviceBuffer::Allocate(0, plan.payload_bytes));
  CONCORD_RETURN_IF_ERROR(copy_src.Fill(0x3C));

  std::map<uint32_t, size_t> widths;
  for (const cuda::PackEntry& e : plan.entries) ++widths[e.vector_bytes];
  std::string width_text;
  for (const auto& [width, n] : widths) {
    width_text += " " + std::to_string(n) + "x" + std::to_string(width) + "B";
  }
  std::printf(
      "\n### %s: %zu tensors, %.1f MB payload, %.1f MB fusion buffer, %zu blocks,"
      " load widths:%s%s\n\n",
      w.name.c_str(), w.tensors.size(), plan.payload_bytes / 1e6, plan.total_bytes / 1e6,
      plan.chunks.size(), width_text.c_str(),
      o.override_dtype ? (std::string(", all as ") + DTypeName(o.dtype)).c_str() : "");
  std::printf("| %-34s | %10s | %8s | %7s |\n", "operation", "time (us)", "GB/s", "vs D2D");
  std::printf("|%s|%s|%s|%s|\n", std::string(36, '-').c_str(), std::string(12, '-').c_str(),
              std::string(10, '-').c_str(), std::string(9, '-').c_str());

  const size_t bytes = plan.payload_bytes;
  auto memcpy_all = [&] {
    return cuda::CopyDeviceToDevice(copy_dst.data(), copy_src.data(), bytes, nullptr);
  };
  auto memcpy_each = [&]() -> Status {
    char* slots = static_cast<char*>(fusion.data());
    for (size_t i = 0; i < tensors.size(); ++i) {
      CONCORD_RETURN_IF_ERROR(cuda::CopyDeviceToDevice(
          slots + plan.entries[i].offset, tensors[i].data, plan.entries[i].bytes, nullptr));
    }
    return Status::Ok();
  };
  CONCORD_ASSIGN_OR_RETURN(double memcpy_s, Time(memcpy_all, o));
  PrintRow("cudaMemcpy D2D, all bytes at once", memcpy_s, bytes, memcpy_s);
  CONCORD_ASSIGN_OR_RETURN(double per_tensor_s, Time(memcpy_each, o));
  PrintRow("pack, one cudaMemcpyAsync per tensor", per_tensor_s, bytes, memcpy_s);

  const std::string scaled = std::to_string(o.scale).substr(0, 6);
  struct Row {
    std::string name;
    bool unpack;
    double scale;
  };
  const Row rows[] = {{"pack kernel (copy)", false, 1.0},
                      {"unpack kernel (copy)", true, 1.0},
                      {"pack kernel (prescale " + scaled + ")", false, o.scale},
                      {"unpack kernel (postscale " + scaled + ")", true, o.scale}};
  for (const Row& row : rows) {
    StatusOr<double> s = Time(
        [&] {
          return row.unpack ? packer.Unpack(plan, fusion.data(), fusion.size(), row.scale, nullptr)
                            : packer.Pack(plan, fusion.data(), fusion.size(), row.scale, nullptr);
        },
        o);
    if (!s.ok() && s.status().code() == Code::kInvalidArgument) {
      std::printf("| %-34s | %10s | %8s | %7s |\n", row.name.c_str(), "n/a", "n/a", "n/a");
      std::printf("  (%s)\n", s.status().message().c_str());
      continue;
    }
    if (!s.ok()) return s.status();
    PrintRow(row.name.c_str(), s.value(), bytes, memcpy_s);
  }
  return Status::Ok();
}

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr,
               "pack_bench: %s\nusage: pack_bench --check-device\n"
               "       pack_bench --workload FILE [--workload FILE ...] [--iters N] [--warmup N]"
               " [--dtype T] [--scale S]\n",
               error.c_str());
  std::exit(2);
}

int Main(int argc, char** argv) {
  Options o;
  bool check_device = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (arg == "--check-device") {
      check_device = true;
      continue;
    }
    if (value == nullptr) Usage("missing value or unknown option " + arg);
    ++i;
    if (arg == "--workload") {
      o.workloads.push_back(value);
    } else if (arg == "--iters") {
      o.iters = static_cast<int>(bench::ParseInteger(arg, value, 1, 100000000, Usage));
    } else if (arg == "--warmup") {
      o.warmup = static_cast<int>(bench::ParseInteger(arg, value, 0, 100000000, Usage));
    } else if (arg == "--dtype") {
      StatusOr<DType> d = ParseDTypeName(value);
      if (!d.ok()) Usage(d.status().message());
      o.override_dtype = true;
      o.dtype = d.value();
    } else if (arg == "--scale") {
      // The whole value, a finite number (strtod alone skips leading blanks and takes "nan").
      char* end = nullptr;
      o.scale = std::strtod(value, &end);
      if (end == value || *end != '\0' || std::isspace(static_cast<unsigned char>(value[0])) ||
          !std::isfinite(o.scale)) {
        Usage("--scale takes a finite number, not '" + std::string(value) + "'");
      }
    } else {
      Usage("unknown option " + arg);
    }
  }
  if (!check_device && o.workloads.empty()) Usage("no --workload given");
  // Every file is read before the device is looked for: a bad path is named on any machine.
  std::vector<Workload> workloads;
  for (const std::string& path : o.workloads) {
    StatusOr<Workload> w = LoadWorkload(path);
    if (!w.ok()) {
      std::fprintf(stderr, "pack_bench: %s: %s\n", path.c_str(), w.status().ToString().c_str());
      return 1;
    }
    workloads.push_back(std::move(w.value()));
  }
  const StatusOr<int> devices = cuda::DeviceCount();
  if (!devices.ok()) {
    std::printf("no usable CUDA device: %s; NCCL %s\n", devices.status().message().c_str(),
                cuda::NcclVersion().c_str());
    return check_device ? 2 : 1;
  }
  StatusOr<std::string> description = cuda::DeviceDescription(0);
  std::printf(
      "device 0: %s; %d device(s); NCCL %s\n",
      description.ok() ? description.value().c_str() : description.status().ToString().c_str(),
      devices.value(), cuda::NcclVersion().c_str());
  if (check_device) return 0;
  StatusOr<std::unique_ptr<cuda::CudaPacker>> packer = cuda::CudaPacker::Create(0);
  if (!packer.ok()) {
    std::fprintf(stderr, "pack_bench: %s\n", packer.status().ToString().c_str());
    return 1;
  }
  std::printf("iters %d, warmup %d; GB/s = payload bytes / time of one operation\n", o.iters,
              o.warmup);
  for (size_t i = 0; i < workloads.size(); ++i) {
    const Status s = RunWorkload(std::move(workloads[i]), *packer.value(), o);
    if (!s.ok()) {
      std::fprintf(stderr, "pack_bench: %s: %s\n", o.workloads[i].c_str(), s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace concord

int main(int argc, char** argv) {
  return concord::Main(argc, argv);
}
