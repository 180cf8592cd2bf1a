// The TCP point-to-point transport's connections and frames (backends/tcp_p2p_transport.cc).
//
// Setup (collective over the communicator's ranks). Each rank listens on options.host (port 0),
// writes a random nonce and "host:port" under prefix + "/nonce/<rank>" and "/addr/<rank>", connects
// to every lower rank and accepts every higher one. A connecting rank sends a HELLO (integers
// little-endian): u32 magic 'CP2H' | i32 rank | 32 bytes: the acceptor's nonce, in hex; the
// acceptor answers u32 'CP2A' once the nonce and rank check out, and closes the connection if not.
//
// Stream, in both directions: messages of
//   u32 magic 'CP2M' | u32 ndim (<= kP2pMaxDims) | i64 tag | i32 dtype | u32 flags | u64 bytes |
//   ndim x i64 shape | bytes of payload
// or, with flags kDirectRead (to a peer on the same host that can read the sender's memory), no
// payload but three u64 after the shape: the payload's address in the sender, the address of the
// sender's state word for the link, and the value that word holds while the link is open (random
// per link, so that a word of a later link at the same address, once this one is freed, never
// passes for it). The receiver reads the payload from there (process_vm_readv), then the state
// word, and answers with a receipt, 32 bytes:
//   u32 magic 'CP2R' | 28 zero bytes
// which completes the send (receipts come back in the order of their messages). A state word that
// no longer holds the open value (the sender withdrew the message: its link failed or closed)
// fails that message alone, without a receipt, and the receiver reads on. A rank whose
// communicator finalizes ends each link on which no message is half written with a goodbye,
//   u32 magic 'CP2B' | 28 zero bytes
// after everything it sent, shuts its sending side down, and closes the link once the peer has
// ended its side (reading and dropping what still comes, for 2 s at most: a socket closed with
// bytes unread resets the connection, which drops what was not yet transmitted, the goodbye
// included): the peer fails the link with kPeerFailure saying that
// the rank finalized (what arrived whole before it stays for the recvs that come for it), and
// holds nothing for a cause (P2pTransport::PeerFinalized). A receiver that finds anything else (a
// bad magic, dtype or flag, a negative tag, a size that is not the shape's, a receipt or goodbye
// with a non-zero byte after its magic, a receipt nothing waits for) fails the link with
// kProtocol. Messages for which no recv is posted yet are kept whole (unexpected
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
constexpr uint32_t kReceiptMagic = 0x52325043;  // "CP2R"
constexpr uint32_t kGoodbyeMagic = 0x42325043;  // "CP2B"
constexpr size_t kFixedHead = 32;               // a message's header without its shape; a receipt
constexpr uint32_t kDirectRead = 1;             // flags: the receiver reads the payload itself

// Where a directly read payload is in the sender.
struct DirectSource {
  uint64_t data = 0;   // the payload's address
  uint64_t state = 0;  // the link's state word's address
  uint64_t open = 0;   // the state word's value while the link is open (anything else: closed)
};

// A message's header (its shape included) for `tag` and `meta`; with `direct`, for a payload the
// receiver reads from there.
std::string EncodeHead(int64_t tag, const P2pMeta& meta, const DirectSource* direct = nullptr);
// A receipt for one directly read message.
std::string EncodeReceipt();
// Checks a receipt at `p` (kFixedHead bytes, its magic included): kProtocol unless the 28 bytes
// after the magic are zero.
Status DecodeReceipt(const unsigned char* p);
// A goodbye: this rank finalized, nothing follows.
std::string EncodeGoodbye();
// Checks a goodbye at `p` (kFixedHead bytes, its magic included), as DecodeReceipt.
Status DecodeGoodbye(const unsigned char* p);
// A message's header from `p` (at least kFixedHead bytes): tag, dtype, ndim, bytes and flags (the
// shape's entries are filled by CheckShape, the direct source by DecodeDirect); *head_size
// becomes the header's whole size. kProtocol for a bad magic, ndim, dtype or flag, or a negative
// tag.
Status DecodeFixed(const unsigned char* p, int64_t* tag, P2pMeta* meta, uint32_t* flags,
                   size_t* head_size);
// The direct source after a header's shape of `ndim` entries.
DirectSource DecodeDirect(const unsigned char* head, size_t ndim);
// Reads meta->shape from `shape` (ndim entries) and checks that its elements times the dtype's
// size are meta->bytes (kProtocol otherwise).
Status CheckShape(P2pMeta* meta, const unsigned char* shape);

// The setup above, collective over options.size ranks: a connected, non-blocking socket to every
// other rank (this rank's entry invalid), before options.timeout.
StatusOr<std::vector<net::Fd>> ConnectMesh(const BackendOptions& options, Store* store);

}  // namespace tcp_p2p
}  // namespace concord
