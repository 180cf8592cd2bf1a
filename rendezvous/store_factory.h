// Opens the Store that a URL names: the launcher hands ranks CONCORD_STORE and CONCORD_TOKEN.
#pragma once

#include <memory>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "rendezvous/store.h"

namespace concord {

// "tcp://host:port" (host may be a [v6] literal): a TcpStore authenticated with token, connected
// before the deadline. "file:///abs/dir": a FileStore over that directory (created if missing;
// token unused). Anything else: kInvalidArgument naming the accepted forms. Thread-safe.
StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& url, const std::string& token,
                                           Deadline deadline);

}  // namespace concord
