// The TCP point-to-point transport's connections and frames (backends/tcp_p2p_transport.cc).
//
// Setup (collective over the communicator's ranks). Each rank listens on options.host (port 0),
// writes a random nonce and "host:port" under prefix + "/nonce/<rank>" and "/addr/<rank>", connects
// to every lower rank and accepts every higher one. A connecting rank sends a HELLO (integers
// little-endian): u32 magic 'CP2H' | i32 rank | 32 bytes: the acceptor's nonce, in hex; the
// acceptor answers u32 'CP2A' once the nonce and rank check out, and closes the connection if not.
//
// Stream, in both directions: messages of
//   u32 magic 'CP2M' | u32 ndim (<= kP2pMaxDims) | i64 tag | i32 dtype | u32 zero | u64 bytes |
//   ndim x i64 shape | bytes of payload
// A receiver that finds anything else (a bad magic, dtype, a size that is not the shape's) fails
// the link with kProtocol. Messages for which no recv is posted yet are kept whole (unexpected
// messages) until one is (a large one after waiting a few milliseconds in the socket for its
// recv); a posted recv's payload is read straight into its destination.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/p2p_transport.h"
#include "rendezvous/net.h"

namespace concord {
namespace tcp_p2p {

constexpr uint32_t kMessageMagic = 0x4D325043;  // "CP2M" on the wire
constexpr size_t kFixedHead = 32;               // a message's header without its shape

// A message's header (its shape included) for `tag` and `meta`.
std::string EncodeHead(int64_t tag, const P2pMeta& meta);
// A message's header from `p` (at least kFixedHead bytes): tag, dtype, ndim and bytes (the
// shape's entries are filled by CheckShape); *head_size becomes the header's whole size.
// kProtocol for a bad magic, ndim or dtype.
Status DecodeFixed(const unsigned char* p, int64_t* tag, P2pMeta* meta, size_t* head_size);
// Reads meta->shape from `shape` (ndim entries) and checks that its elements times the dtype's
// size are meta->bytes (kProtocol otherwise).
Status CheckShape(P2pMeta* meta, const unsigned char* shape);

// The setup above, collective over options.size ranks: a connected, non-blocking socket to every
// other rank (this rank's entry invalid), before options.timeout.
StatusOr<std::vector<net::Fd>> ConnectMesh(const BackendOptions& options, Store* store);

}  // namespace tcp_p2p
}  // namespace concord
