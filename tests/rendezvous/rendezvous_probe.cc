// A rank program for concordrun_test.sh: reads the launcher's environment, opens the store it
// names, builds a TCP control plane across the job and exchanges one message with every peer.
// Prints "probe ok rank R of N" and exits 0, or prints the error and exits 1.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/control_plane.h"
#include "rendezvous/store_factory.h"

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

int Fail(const concord::Status& s) {
  std::fprintf(stderr, "probe failed: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  using concord::Deadline;
  const Deadline deadline = Deadline::After(std::chrono::seconds(20));
  auto store = concord::OpenStore(Env("CONCORD_STORE"), Env("CONCORD_TOKEN"), deadline);
  if (!store.ok()) return Fail(store.status());
  concord::TcpControlPlaneOptions o;
  o.rank = std::atoi(Env("CONCORD_RANK").c_str());
  o.size = std::atoi(Env("CONCORD_SIZE").c_str());
  o.prefix = Env("CONCORD_JOB_ID") + "/probe";
  o.connect_timeout = std::chrono::seconds(20);
  auto plane = concord::CreateTcpControlPlane(o, store->get());
  if (!plane.ok()) return Fail(plane.status());
  concord::ControlPlane* p = plane->get();
  concord::ControlMessage m;
  if (o.rank == 0) {
    for (int r = 1; r < o.size; ++r) {
      concord::Status s = p->Send(r, "ping");
      if (!s.ok()) return Fail(s);
    }
    for (int n = 1; n < o.size; ++n) {
      auto got = p->Receive(&m, deadline);
      if (!got.ok()) return Fail(got.status());
      if (!*got || m.bytes != "pong " + std::to_string(m.from)) {
        return Fail(concord::Internal("unexpected reply"));
      }
    }
  } else {
    auto got = p->Receive(&m, deadline);
    if (!got.ok()) return Fail(got.status());
    if (!*got || m.bytes != "ping") return Fail(concord::Internal("no ping"));
    concord::Status s = p->Send(0, "pong " + std::to_string(o.rank));
    if (!s.ok()) return Fail(s);
  }
  // Everyone checks in before anyone leaves, so no rank sees another's exit as a failure.
  std::vector<std::string> keys;
  concord::Status s = (*store)->Set(o.prefix + "/left/" + std::to_string(o.rank), "1");
  if (!s.ok()) return Fail(s);
  for (int r = 0; r < o.size; ++r) keys.push_back(o.prefix + "/left/" + std::to_string(r));
  s = (*store)->Wait(keys, deadline);
  if (!s.ok()) return Fail(s);
  std::printf("probe ok rank %d of %d\n", o.rank, o.size);
  return 0;
}
