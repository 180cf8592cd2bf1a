// Writes the fuzz targets' seed corpora, valid inputs made with Concord's own encoders, so that
// each fuzzer starts inside its format rather than at its first check:
//   fuzz_corpus DIR   writes DIR/messages, DIR/tcp_store, DIR/compressed, DIR/c_api and
//                     DIR/tcp_p2p_wire
// The committed corpus (tests/fuzz/corpus) is this program's output plus the regression inputs
// of bugs the fuzzers found (named regression-*); rerun it when a format changes.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/tcp_p2p_wire.h"
#include "compression/registry.h"
#include "core/entry_validation.h"
#include "core/message.h"
#include "rendezvous/tcp_store_wire.h"

namespace {

using namespace concord;

void Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  ::mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() ||
      std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
}

TensorRequest MakeRequest(const std::string& name, OpType op, DType dtype,
                          std::vector<int64_t> shape) {
  TensorRequest r;
  r.name = name;
  r.op = op;
  r.dtype = dtype;
  r.shape = std::move(shape);
  return r;
}

// The operations that carry splits, a root or joined ranks: reducescatter, alltoall, reduce,
// gather and a join, as requests (with inline data) and as the responses that answer them.
void Sharded(const std::string& dir) {
  RequestMessage m;
  m.step = 3;
  m.cache_generation = 2;
  TensorRequest rs = MakeRequest("shard/grad", OpType::kReducescatter, DType::kBFloat16, {5, 3});
  rs.reduce_op = ReduceOp::kAverage;
  rs.splits = {3, 2};
  rs.postscale = 0.25;
  rs.compression = "fp16";
  m.requests.push_back(rs);
  TensorRequest a2a = MakeRequest("moe/tokens", OpType::kAlltoall, DType::kFloat16, {4, 8});
  a2a.splits = {0, 1, 3};
  m.requests.push_back(a2a);
  TensorRequest reduce = MakeRequest("loss", OpType::kReduce, DType::kFloat64, {1});
  reduce.reduce_op = ReduceOp::kMax;
  reduce.root = 2;
  m.requests.push_back(reduce);
  TensorRequest gather = MakeRequest("metrics", OpType::kGather, DType::kInt32, {2, 2});
  gather.root = 1;
  gather.group = "eval#1";
  gather.group_size = 2;
  m.requests.push_back(gather);
  m.requests.push_back(MakeRequest(JoinName(1), OpType::kBarrier, DType::kUint8, {}));
  Write(dir, "request-sharded", SerializeRequestMessage(m));
  m.request_data[2] = std::string(8, '\6');  // the reduce's float64 and the gather's rows
  m.request_data[3] = std::string(16, '\7');
  Write(dir, "request-sharded-inline", SerializeRequestMessage(m));

  ResponseMessage r;
  ResponseItem scatter;
  scatter.response.request = rs;
  scatter.response.joined = {2};
  scatter.last_rank = 0;
  scatter.last_wait_us = 40;
  r.items.push_back(scatter);
  ResponseItem exchange;
  exchange.response.request = a2a;
  exchange.response.first_dims = {4, 2, 6};
  exchange.response.splits = {0, 1, 3, 2, 0, 0, 1, 1, 4};
  r.items.push_back(exchange);
  ResponseItem gathered;
  gathered.response.request = gather;
  gathered.response.first_dims = {2, 0, 1};
  gathered.response.joined = {1};
  gathered.data = std::string(24, '\7');
  r.items.push_back(gathered);
  ResponseItem joined;
  joined.response.request = m.requests[4];
  joined.response.joined = {1, 0, 2};
  r.items.push_back(joined);
  r.evictions = {1, 4};
  Write(dir, "response-sharded", SerializeResponseMessage(r));
}

void Messages(const std::string& dir) {
  RequestMessage m;
  Write(dir, "request-empty", SerializeRequestMessage(m));
  m.step = 7;
  m.cached_mask = {0x5, 0};
  m.requests.push_back(MakeRequest("grad/w", OpType::kAllreduce, DType::kFloat32, {4, 2}));
  m.requests.push_back(MakeRequest("gather", OpType::kAllgather, DType::kInt64, {3, 1}));
  TensorRequest b = MakeRequest("bcast", OpType::kBroadcast, DType::kUint8, {16});
  b.root = 1;
  m.requests.push_back(b);
  TensorRequest c = MakeRequest("topk", OpType::kAllreduce, DType::kFloat32, {1000});
  c.compression = "topk:density=0.01,method=sampled,values=fp32";
  c.group = "topk#2";
  c.group_size = 2;
  c.prescale = 0.5;
  m.requests.push_back(c);
  Write(dir, "request-ops", SerializeRequestMessage(m));
  m.request_data[0] = std::string(32, '\1');
  m.request_data[1] = std::string(24, '\4');  // an allgather's and a broadcast's inputs
  m.request_data[2] = std::string(16, '\5');
  m.cached_data[0] = std::string(8, '\2');
  Write(dir, "request-inline", SerializeRequestMessage(m));

  ResponseMessage r;
  Write(dir, "response-empty", SerializeResponseMessage(r));
  ResponseItem cached;
  cached.cached = true;
  cached.bit = 3;
  cached.last_rank = 1;
  cached.last_wait_us = 1500;
  r.items.push_back(cached);
  ResponseItem full;
  full.response.request = m.requests[1];
  full.response.first_dims = {3, 5};
  r.items.push_back(full);
  ResponseItem inlined;
  inlined.response.request = m.requests[0];
  inlined.data = std::string(32, '\3');
  r.items.push_back(inlined);
  ResponseItem failed;
  failed.response.request = m.requests[2];
  failed.response.error = Code::kMismatch;
  failed.response.error_message = "rank 1 has dtype int32";
  failed.response.error_ranks = {0, 1};
  r.items.push_back(failed);
  r.warnings = {"stalled: rank 2 has not submitted 'grad/w'"};
  Write(dir, "response-items", SerializeResponseMessage(r));
  ResponseMessage abort;
  abort.abort = true;
  abort.abort_code = Code::kPeerFailure;
  abort.abort_reason = "rank 3 exited";
  Write(dir, "response-abort", SerializeResponseMessage(abort));
  Sharded(dir);
}

void TcpStore(const std::string& dir) {
  using namespace store_wire;
  const std::string hello = Frame(kHello, "0123456789abcdef");
  Request set{kSet, "rank/0/addr", "127.0.0.1:4242", 0, {}, 0};
  Request get{kGet, "rank/1/addr", "", 30000, {}, 0};
  Request forever{kGet, "k", "", kNoTimeout, {}, 0};
  Request wait{kWait, "", "", 1000, {"a", "b", ""}, 0};
  Request add{kAdd, "counter", "", 0, {}, 1};
  Request sub{kAdd, "counter", "", 0, {}, ~uint64_t{0}};
  const std::string session = hello + Frame(kSet, EncodeRequest(set)) +
                              Frame(kGet, EncodeRequest(get)) + Frame(kWait, EncodeRequest(wait)) +
                              Frame(kAdd, EncodeRequest(add)) + Frame(kAdd, EncodeRequest(sub));
  Write(dir, "session", session);
  Write(dir, "hello", hello);
  Write(dir, "get-forever", hello + Frame(kGet, EncodeRequest(forever)));
  Write(dir, "set-number", hello + Frame(kSet, EncodeRequest({kSet, "n", "-42", 0, {}, 0})));
  Write(dir, "replies",
        Frame(kReply, EncodeReply(Code::kOk, "")) +
            Frame(kReply, EncodeReply(Code::kOk, "127.0.0.1:4242")) +
            Frame(kReply, EncodeReply(Code::kTimeout, "store: key 'k' missing")) +
            Frame(kReply, EncodeReply(Code::kOk, std::string(8, '\x7f'))));
  Write(dir, "reply-auth", Frame(kReply, EncodeReply(Code::kAuthFailed, "wrong token")));
  Request first{kGetFirst, "", "", 250, {"job/comm1/settings", "job/comm1/failed"}, 0};
  Write(dir, "get-first", hello + Frame(kGetFirst, EncodeRequest(first)));
  Write(dir, "get-first-replies",
        Frame(kReply, EncodeReply(Code::kOk, EncodeFirstPayload(1, "rank 2 failed to start"))) +
            Frame(kReply, EncodeReply(Code::kTimeout,
                                      "store: none of the keys 'a', 'b' "
                                      "appeared before the deadline")));
}

// spec '\n' | u8 dtype | u8 flags | u32 count | payload (fuzz_compressed.cc).
std::string CompressedInput(const std::string& spec, DType dtype, uint8_t flags, uint32_t count,
                            const std::string& payload) {
  std::string s = spec + "\n";
  s.push_back(static_cast<char>(dtype));
  s.push_back(static_cast<char>(flags));
  s.append(reinterpret_cast<const char*>(&count), 4);
  return s + payload;
}

void Compressed(const std::string& dir) {
  const char* const kSpecs[] = {"topk:density=0.1,method=exact,values=fp32",
                                "topk:density=0.25,method=sampled,values=fp16",
                                "topk:density=0.001",
                                "fp16",
                                "bf16",
                                "none"};
  int n = 0;
  for (const char* spec : kSpecs) {
    auto c = compression::CreateCompressor(spec);
    if (!c.ok()) std::abort();
    for (uint32_t count : {0u, 1u, 40u, 3000u}) {
      std::vector<float> dense(count);
      for (uint32_t i = 0; i < count; ++i) dense[i] = static_cast<float>((i * 37) % 101) - 50.0f;
      std::string encoded((*c)->EncodedBytes(DType::kFloat32, count), '\0');
      compression::CompressionState state;
      compression::EncodeInput in;
      in.name = "t";
      in.count = count;
      in.data = dense.data();
      if (!(*c)->Encode(in, encoded.data(), &state).ok()) std::abort();
      const uint8_t flags = static_cast<uint8_t>(n % 4) | (count == 40 ? 4 : 0);
      Write(dir, "valid-" + std::to_string(n++),
            CompressedInput(spec, DType::kFloat32, flags, count, encoded));
    }
  }
  Write(dir, "int32-none", CompressedInput("none", DType::kInt32, 1, 4, std::string(16, '\7')));
  Write(dir, "huge-count", CompressedInput(kSpecs[0], DType::kFloat32, 8, 10, ""));
}

// A program for fuzz_c_api.cc: op bytes followed by their arguments, in its reading order.
void CApi(const std::string& dir) {
  // allreduce, async (how=1), name "g" (len 1), tensor float32 [4] with data (how=0, dtype 6,
  // ndim 1, dims 5...), in place, options (struct size default, op SUM, scales 1, spec "fp16"),
  // no device options; then wait for it (request calls on request 0) and a barrier.
  std::string p;
  auto u8 = [&p](int v) { p.push_back(static_cast<char>(v)); };
  auto name = [&](const std::string& s) {
    u8(4);  // a fuzzed name
    u8(static_cast<int>(s.size()));
    p += s;
  };
  auto tensor = [&](int dtype_index, int ndim_index, int dim_index) {
    u8(0);  // allocated data
    u8(dtype_index);
    u8(ndim_index);
    for (int i = 0; i < CONCORD_MAX_DIMS + 2; ++i) u8(dim_index);
    u8(0);  // device -1
  };
  auto allreduce = [&](int how, const std::string& n, int spec_index) {
    u8(0);
    u8(how);
    name(n);
    tensor(6, 1, 4);
    u8(1);                              // in place
    u8(1);                              // options given
    for (int i = 0; i < 4; ++i) u8(0);  // struct_size, op, prescale, postscale: the first entries
    u8(spec_index);
    u8(1);  // no device options
  };
  allreduce(1, "g", 1);
  u8(8);  // request calls
  u8(1 | 2 | 4 | 8 | 16);
  u8(0);
  u8(1);  // wait without limit
  u8(4);  // barrier, blocking
  u8(0);
  name("b");
  tensor(0, 0, 0);
  Write(dir, "allreduce-wait", p);
  p.clear();
  u8(5);  // group_start
  allreduce(1, "a", 3);
  allreduce(1, "b", 0);
  u8(2);  // allgather, async
  u8(1);
  name("c");
  tensor(2, 3, 2);
  u8(3);  // capacity 1024
  u8(0);  // an output buffer
  u8(1);  // no device options
  u8(6);  // group_end
  Write(dir, "group", p);
  p.clear();
  allreduce(0, "blocking", 4);
  u8(3);  // broadcast, blocking
  u8(0);
  name("bc");
  tensor(1, 2, 3);
  u8(0);   // root 0
  u8(7);   // end_step
  u8(11);  // NULL calls
  u8(0);
  u8(0);
  Write(dir, "blocking", p);
  p.clear();
  // init_config: a version and size from concord_config_init, rank and the rest unset (-1, NULL),
  // backend gloo, then a barrier on the new communicator.
  u8(10);
  for (int v : {0, 0, 0, 0, 0, 0, 5, 3, 3, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 1, 8, 0, 1, 1}) u8(v);
  Write(dir, "init-config", p);
}

// A link's stream as a receiver reads it: messages (payloads on the socket, one of size 0, one
// read directly), receipts and the goodbye that ends it.
void TcpP2pWire(const std::string& dir) {
  auto meta = [](DType dtype, std::vector<int64_t> shape) {
    P2pMeta m;
    m.dtype = dtype;
    m.shape = std::move(shape);
    m.bytes = DTypeSize(dtype);
    for (int64_t d : m.shape) m.bytes *= static_cast<uint64_t>(d);
    return m;
  };
  const std::string small =
      tcp_p2p::EncodeHead(7, meta(DType::kFloat32, {2, 3})) + std::string(24, '\1');
  const std::string empty = tcp_p2p::EncodeHead(0, meta(DType::kInt64, {0}));
  const tcp_p2p::DirectSource source{0x7f0012345000ull, 0x5600000010ull, 0x0123456789abcdefull};
  const std::string direct =
      tcp_p2p::EncodeHead(3, meta(DType::kUint8, {1, 2, 3, 4, 5, 6, 7, 8}), &source);
  Write(dir, "message", small);
  Write(dir, "empty", empty);
  Write(dir, "direct", direct);
  Write(dir, "receipt", tcp_p2p::EncodeReceipt());
  Write(dir, "goodbye", tcp_p2p::EncodeGoodbye());
  Write(dir, "stream",
        small + direct + empty + tcp_p2p::EncodeReceipt() + small + tcp_p2p::EncodeGoodbye());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  ::mkdir(dir.c_str(), 0755);
  Messages(dir + "/messages");
  TcpStore(dir + "/tcp_store");
  Compressed(dir + "/compressed");
  CApi(dir + "/c_api");
  TcpP2pWire(dir + "/tcp_p2p_wire");
  return 0;
}
