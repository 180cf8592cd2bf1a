// Sub-communicators (process sets): MPI's and NCCL's split by color and key, and creation from a
// list of the parent's ranks.
//
// Protocol, collective over the parent (every rank calls, in the same order as its other splits
// of that parent):
//   1. Every rank's arguments (valid or not, color, key, a digest of its rank list, a digest of its
//      host name) go to every rank in one allgather on the parent, negotiated like any operation
//      under the reserved name of the parent's Nth split (Engine::ExchangeInternal). A rank that
//      does not take part within the timeout fails the split where it was called.
//   2. Every rank computes the same verdict from the same bytes: a bad argument anywhere (a
//      negative color other than UNDEFINED, a rank list that differs from rank 0's) fails the split
//      on every rank, naming the rank; else the members of each color, ordered by key, then by
//      parent rank, form one sub-communicator.
//   3. The members of a color start it: on the parent's store under "<parent prefix>/split<N>/
//      <color>" (a control plane, Gloo lanes and device plane with their own connections), or on
//      MPI over MPI_Comm_create_group of their MPI_COMM_WORLD ranks (tag N). Ranks of color
//      UNDEFINED get no communicator.
// A sub-communicator is a communicator like any other, with its own engine and threads; it shares
// only the rendezvous store with the parent, so finalizing or failing one never stops the other,
// and its failures name its members' parent ranks (Config::membership).
#pragma once

#include "core/bootstrap.h"

namespace concord {

// CONCORD_UNDEFINED: a color that joins no sub-communicator.
constexpr int kUndefinedColor = -1;

// Splits `parent`: ranks with the same color (>= 0) form one sub-communicator, ordered by key
// then parent rank. Returns a communicator without engine for color kUndefinedColor.
StatusOr<Communicator> SplitCommunicator(Engine& parent, CommOrigin& origin, int color, int key);

// A sub-communicator of the parent's `ranks`, in that order (rank i of it is parent rank
// ranks[i]); every rank of the parent calls with the same list, and those outside it get a
// communicator without engine. The n ranks must be distinct and in [0, parent size).
StatusOr<Communicator> CreateGroupCommunicator(Engine& parent, CommOrigin& origin, const int* ranks,
                                               int n);

}  // namespace concord
