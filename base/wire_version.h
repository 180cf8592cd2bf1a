// The version of what Concord's ranks exchange with each other. Ranks of one job must all speak
// it alike: bootstrap compares it among the job settings (core/job_settings.h) and refuses a start
// that mixes builds, naming both, where it would otherwise wait at the first key or frame that
// the builds lay out differently until the timeout, or misread it.
#pragma once

namespace concord {

// Bump with any change to what crosses between ranks: store keys and their values (the Gloo mesh's
// addresses, the control plane's), control-plane messages, point-to-point frames, shared-memory
// segment layouts, and the algorithms' schedules (which rank sends which part when). What the
// comparison itself rests on never changes: the store's protocol, the communicator number's key
// and the settings key (`<prefix>/settings`, "NAME=value" lines).
//   1: the first numbered layout (a Gloo mesh's addresses under one key per pair, "r/p"; an MPI
//      communicator's name broadcast from rank 0 after the settings).
inline constexpr int kWireVersion = 1;

}  // namespace concord
