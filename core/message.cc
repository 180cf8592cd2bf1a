#include "core/message.h"

#include <algorithm>
#include <cstring>

namespace concord {
namespace {

constexpr uint8_t kRequestTag = 0xC1;
constexpr uint8_t kResponseTag = 0xC2;
constexpr uint8_t kVersion = 9;
constexpr uint32_t kMaxString = 1 << 20;

class Writer {
 public:
  // `expected` bytes are reserved up front, so that a message with inline data is not regrown
  // (and copied) several times while it is written.
  explicit Writer(size_t expected) { out_.reserve(expected); }
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void I32(int32_t v) { Raw(&v, 4); }
  void I64(int64_t v) { Raw(&v, 8); }
  void F64(double v) { Raw(&v, 8); }
  void Str(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string Take() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

// Bounds-checked reader: the first failure sticks and every later read returns zeros.
class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  uint8_t U8() {
    uint8_t v = 0;
    Raw(&v, 1);
    return v;
  }
  uint32_t U32() {
    uint32_t v = 0;
    Raw(&v, 4);
    return v;
  }
  int32_t I32() {
    int32_t v = 0;
    Raw(&v, 4);
    return v;
  }
  int64_t I64() {
    int64_t v = 0;
    Raw(&v, 8);
    return v;
  }
  double F64() {
    double v = 0;
    Raw(&v, 8);
    return v;
  }
  std::string Str() {
    const uint32_t n = U32();
    if (n > kMaxString || n > Left()) {
      Fail("string length " + std::to_string(n));
      return "";
    }
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  // A count of items each at least min_item_bytes long: rejects counts the input cannot hold.
  uint32_t Count(size_t min_item_bytes) {
    const uint32_t n = U32();
    if (min_item_bytes > 0 && n > Left() / min_item_bytes) {
      Fail("count " + std::to_string(n) + " exceeds the message");
      return 0;
    }
    return n;
  }
  void Fail(const std::string& why) {
    if (error_.empty()) error_ = why + " at byte " + std::to_string(pos_);
    pos_ = in_.size();
  }
  bool ok() const { return error_.empty(); }
  bool done() const { return pos_ == in_.size(); }
  const std::string& error() const { return error_; }

 private:
  size_t Left() const { return in_.size() - pos_; }
  void Raw(void* p, size_t n) {
    if (!ok()) return;
    if (Left() < n) return Fail("truncated message");
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  const std::string& in_;
  size_t pos_ = 0;
  std::string error_;
};

// Upper bounds of the bytes the writers below produce (RequestWireBytes too).
size_t DataBytes(const std::map<uint32_t, std::string>& data) {
  size_t n = 4;
  for (const auto& entry : data) n += 8 + entry.second.size();
  return n;
}

// A vector of counts: u32 n | n x i64.
void WriteCounts(Writer& w, const std::vector<int64_t>& counts) {
  w.U32(static_cast<uint32_t>(counts.size()));
  for (int64_t c : counts) w.I64(c);
}

// Reads counts that must each be >= 0 (`what` names them in the error).
std::vector<int64_t> ReadCounts(Reader& rd, const char* what) {
  std::vector<int64_t> counts;
  const uint32_t n = rd.Count(8);
  for (uint32_t i = 0; i < n && rd.ok(); ++i) {
    counts.push_back(rd.I64());
    if (counts.back() < 0) rd.Fail(std::string("negative ") + what);
  }
  return counts;
}

void WriteRequest(Writer& w, const TensorRequest& r) {
  w.Str(r.name);
  w.U8(static_cast<uint8_t>(r.op));
  w.U8(static_cast<uint8_t>(r.dtype));
  w.U8(static_cast<uint8_t>(r.reduce_op));
  w.U32(static_cast<uint32_t>(r.shape.size()));
  for (int64_t d : r.shape) w.I64(d);
  w.I32(r.root);
  w.F64(r.prescale);
  w.F64(r.postscale);
  w.I32(r.device);
  w.Str(r.compression);
  w.Str(r.group);
  w.I32(r.group_size);
  WriteCounts(w, r.splits);
}

TensorRequest ReadRequest(Reader& rd) {
  TensorRequest r;
  r.name = rd.Str();
  const uint8_t op = rd.U8(), dtype = rd.U8(), reduce = rd.U8();
  if (op >= kNumOpTypes) rd.Fail("unknown op " + std::to_string(op));
  if (!IsValidDType(dtype)) rd.Fail("unknown dtype " + std::to_string(dtype));
  if (!IsValidReduceOp(reduce)) rd.Fail("unknown reduce op " + std::to_string(reduce));
  r.op = static_cast<OpType>(op);
  r.dtype = static_cast<DType>(dtype);
  r.reduce_op = static_cast<ReduceOp>(reduce);
  const uint32_t ndim = rd.Count(8);
  if (ndim > kMaxDims) rd.Fail("more than " + std::to_string(kMaxDims) + " dimensions");
  int64_t elements = 1;
  bool overflow = false;
  for (uint32_t i = 0; i < ndim && rd.ok(); ++i) {
    r.shape.push_back(rd.I64());
    if (r.shape.back() < 0) rd.Fail("negative dimension");
    overflow = __builtin_mul_overflow(elements, r.shape.back(), &elements) || overflow;
  }
  // The tensor's bytes must fit int64 (NumElements and NumBytes compute them unchecked); a zero
  // dimension makes any other harmless.
  const bool empty = std::find(r.shape.begin(), r.shape.end(), 0) != r.shape.end();
  if (rd.ok() && !empty &&
      (overflow || elements > INT64_MAX / static_cast<int64_t>(DTypeSize(r.dtype)))) {
    rd.Fail("a shape whose bytes overflow int64");
  }
  r.root = rd.I32();
  r.prescale = rd.F64();
  r.postscale = rd.F64();
  r.device = rd.I32();
  r.compression = rd.Str();
  r.group = rd.Str();
  r.group_size = rd.I32();
  if (r.group_size < 0) rd.Fail("negative group size");
  r.splits = ReadCounts(rd, "split");
  return r;
}

void WriteResponse(Writer& w, const Response& r) {
  WriteRequest(w, r.request);
  WriteCounts(w, r.first_dims);
  WriteCounts(w, r.splits);
  w.I32(static_cast<int32_t>(r.error));
  w.Str(r.error_message);
  w.U32(static_cast<uint32_t>(r.error_ranks.size()));
  for (int32_t rank : r.error_ranks) w.I32(rank);
  w.U32(static_cast<uint32_t>(r.joined.size()));
  for (int32_t rank : r.joined) w.I32(rank);
}

Response ReadResponse(Reader& rd) {
  Response r;
  r.request = ReadRequest(rd);
  r.first_dims = ReadCounts(rd, "first dimension");
  r.splits = ReadCounts(rd, "split");
  const int32_t code = rd.I32();
  if (code < 0 || code > static_cast<int32_t>(Code::kProtocolError)) {
    rd.Fail("unknown status code " + std::to_string(code));
  }
  r.error = static_cast<Code>(code);
  r.error_message = rd.Str();
  const uint32_t nranks = rd.Count(4);
  for (uint32_t i = 0; i < nranks && rd.ok(); ++i) {
    r.error_ranks.push_back(rd.I32());
    if (r.error_ranks.back() < 0) rd.Fail("negative rank");
  }
  const uint32_t njoined = rd.Count(4);
  for (uint32_t i = 0; i < njoined && rd.ok(); ++i) {
    r.joined.push_back(rd.I32());
    if (r.joined.back() < 0) rd.Fail("negative joined rank");
  }
  // Each rank once: a rank counted twice would take a contributor from an average.
  for (const std::vector<int32_t>* ranks : {&r.error_ranks, &r.joined}) {
    std::vector<int32_t> sorted = *ranks;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      rd.Fail("a rank listed twice");
    }
  }
  return r;
}

// Whether the request's tensor has exactly `bytes` bytes; overflow-safe for untrusted shapes.
bool HasBytes(const TensorRequest& r, size_t bytes) {
  uint64_t n = DTypeSize(r.dtype);
  for (int64_t d : r.shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  return n == bytes;
}

void WriteData(Writer& w, const std::map<uint32_t, std::string>& data) {
  w.U32(static_cast<uint32_t>(data.size()));
  for (const auto& [key, bytes] : data) {
    w.U32(key);
    w.Str(bytes);
  }
}

std::map<uint32_t, std::string> ReadData(Reader& rd) {
  std::map<uint32_t, std::string> data;
  const uint32_t n = rd.Count(8);
  for (uint32_t i = 0; i < n && rd.ok(); ++i) {
    const uint32_t key = rd.U32();
    // Keys in increasing order, as WriteData writes them: one encoding per message.
    if (!data.empty() && key <= data.rbegin()->first) {
      rd.Fail("inline data for key " + std::to_string(key) + " after key " +
              std::to_string(data.rbegin()->first) + " (keys must increase)");
    }
    data.emplace_hint(data.end(), key, rd.Str());
  }
  return data;
}

Status Finish(const Reader& rd, const char* what) {
  if (!rd.ok()) return ProtocolError(std::string("malformed ") + what + ": " + rd.error());
  if (!rd.done()) return ProtocolError(std::string("malformed ") + what + ": trailing bytes");
  return Status::Ok();
}

Status CheckHeader(Reader& rd, uint8_t tag, const char* what) {
  const uint8_t got_tag = rd.U8(), version = rd.U8();
  if (!rd.ok()) return ProtocolError(std::string("malformed ") + what + ": " + rd.error());
  if (got_tag != tag) return ProtocolError(std::string("not a ") + what + " (bad tag)");
  if (version != kVersion) {
    return ProtocolError(std::string(what) + " version " + std::to_string(version) +
                         " is not supported (expected " + std::to_string(kVersion) + ")");
  }
  return Status::Ok();
}

}  // namespace

bool IsFailureReport(const std::string& bytes) {
  return !bytes.empty() && static_cast<uint8_t>(bytes[0]) == kResponseTag;
}

size_t RequestWireBytes(const TensorRequest& r) {
  return r.name.size() + r.compression.size() + r.group.size() + 8 * r.shape.size() +
         8 * r.splits.size() + 68;
}

std::string SerializeRequestMessage(const RequestMessage& m) {
  size_t expected =
      24 + 8 * m.cached_mask.size() + DataBytes(m.cached_data) + DataBytes(m.request_data);
  for (const auto& r : m.requests) expected += RequestWireBytes(r);
  Writer w(expected);
  w.U8(kRequestTag);
  w.U8(kVersion);
  w.I64(static_cast<int64_t>(m.step));
  w.I64(static_cast<int64_t>(m.cache_generation));
  w.U32(static_cast<uint32_t>(m.cached_mask.size()));
  for (uint64_t word : m.cached_mask) w.I64(static_cast<int64_t>(word));
  w.U32(static_cast<uint32_t>(m.requests.size()));
  for (const auto& r : m.requests) WriteRequest(w, r);
  WriteData(w, m.cached_data);
  WriteData(w, m.request_data);
  return w.Take();
}

StatusOr<RequestMessage> ParseRequestMessage(const std::string& bytes) {
  Reader rd(bytes);
  CONCORD_RETURN_IF_ERROR(CheckHeader(rd, kRequestTag, "request message"));
  RequestMessage m;
  m.step = static_cast<uint64_t>(rd.I64());
  m.cache_generation = static_cast<uint64_t>(rd.I64());
  const uint32_t nwords = rd.Count(8);
  for (uint32_t i = 0; i < nwords && rd.ok(); ++i) {
    m.cached_mask.push_back(static_cast<uint64_t>(rd.I64()));
  }
  const uint32_t nreq = rd.Count(44);
  for (uint32_t i = 0; i < nreq && rd.ok(); ++i) m.requests.push_back(ReadRequest(rd));
  m.cached_data = ReadData(rd);
  m.request_data = ReadData(rd);
  CONCORD_RETURN_IF_ERROR(Finish(rd, "request message"));
  // Inline data must belong to something in this message, with the size the request implies.
  for (const auto& [bit, bytes] : m.cached_data) {
    if (bit / 64 >= m.cached_mask.size() || ((m.cached_mask[bit / 64] >> (bit % 64)) & 1u) == 0) {
      return ProtocolError("malformed request message: inline data for cache entry " +
                           std::to_string(bit) + ", which it does not request");
    }
  }
  for (const auto& [index, bytes] : m.request_data) {
    if (index >= m.requests.size()) {
      return ProtocolError("malformed request message: inline data for request " +
                           std::to_string(index) + " of " + std::to_string(m.requests.size()));
    }
    const TensorRequest& r = m.requests[index];
    if (r.op == OpType::kBarrier || !HasBytes(r, bytes.size())) {
      return ProtocolError("malformed request message: inline data for tensor '" + r.name +
                           "' is not its input of its size");
    }
  }
  return m;
}

std::string SerializeResponseMessage(const ResponseMessage& m) {
  size_t expected = 20 + m.abort_reason.size() + 4 * m.evictions.size();
  for (const auto& warning : m.warnings) expected += 4 + warning.size();
  for (const auto& item : m.items) {
    expected += 24 + (item.data ? item.data->size() : 0);
    if (!item.cached) {
      const Response& r = item.response;
      expected += RequestWireBytes(r.request) + 8 * r.first_dims.size() + 8 * r.splits.size() +
                  r.error_message.size() + 4 * r.error_ranks.size() + 4 * r.joined.size() + 24;
    }
  }
  Writer w(expected);
  w.U8(kResponseTag);
  w.U8(kVersion);
  w.U8(m.abort ? 1 : 0);
  w.I32(static_cast<int32_t>(m.abort_code));
  w.Str(m.abort_reason);
  w.U32(static_cast<uint32_t>(m.warnings.size()));
  for (const auto& warning : m.warnings) w.Str(warning);
  w.U32(static_cast<uint32_t>(m.items.size()));
  for (const auto& item : m.items) {
    w.U8(item.cached ? 1 : 0);
    if (item.cached) {
      w.U32(item.bit);
    } else {
      WriteResponse(w, item.response);
    }
    w.U8(item.data ? 1 : 0);
    if (item.data) w.Str(*item.data);
    w.I32(item.last_rank);
    w.U32(item.last_wait_us);
  }
  w.U32(static_cast<uint32_t>(m.evictions.size()));
  for (uint32_t bit : m.evictions) w.U32(bit);
  return w.Take();
}

StatusOr<ResponseMessage> ParseResponseMessage(const std::string& bytes) {
  Reader rd(bytes);
  CONCORD_RETURN_IF_ERROR(CheckHeader(rd, kResponseTag, "response message"));
  ResponseMessage m;
  const uint8_t abort = rd.U8();
  if (abort > 1) rd.Fail("bad abort flag");
  m.abort = abort == 1;
  const int32_t code = rd.I32();
  if (code < 0 || code > static_cast<int32_t>(Code::kProtocolError)) rd.Fail("unknown abort code");
  m.abort_code = static_cast<Code>(code);
  m.abort_reason = rd.Str();
  const uint32_t nwarnings = rd.Count(4);
  for (uint32_t i = 0; i < nwarnings && rd.ok(); ++i) m.warnings.push_back(rd.Str());
  const uint32_t n = rd.Count(14);
  for (uint32_t i = 0; i < n && rd.ok(); ++i) {
    ResponseItem item;
    const uint8_t cached = rd.U8();
    if (cached > 1) rd.Fail("bad cached flag");
    item.cached = cached == 1;
    if (item.cached) {
      item.bit = rd.U32();
    } else {
      item.response = ReadResponse(rd);
    }
    const uint8_t has_data = rd.U8();
    if (has_data > 1) rd.Fail("bad inline data flag");
    if (has_data == 1) item.data = rd.Str();
    item.last_rank = rd.I32();
    if (item.last_rank < -1) rd.Fail("bad last rank");
    item.last_wait_us = rd.U32();
    m.items.push_back(std::move(item));
  }
  const uint32_t nevictions = rd.Count(4);
  for (uint32_t i = 0; i < nevictions && rd.ok(); ++i) {
    m.evictions.push_back(rd.U32());
    if (i > 0 && m.evictions[i] <= m.evictions[i - 1]) rd.Fail("evictions out of order");
  }
  CONCORD_RETURN_IF_ERROR(Finish(rd, "response message"));
  for (const auto& item : m.items) {
    if (item.cached && std::binary_search(m.evictions.begin(), m.evictions.end(), item.bit)) {
      return ProtocolError("malformed response message: cache entry " + std::to_string(item.bit) +
                           " is both run and evicted");
    }
  }
  return m;
}

}  // namespace concord
