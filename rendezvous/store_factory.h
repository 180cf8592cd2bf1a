// Opens the Store that a URL names: the launcher hands ranks CONCORD_STORE and CONCORD_TOKEN.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "rendezvous/store.h"

namespace concord {

// "tcp://host:port" (host may be a [v6] literal): a TcpStore authenticated with token, connected
// before the deadline. "file:///abs/dir": a FileStore over that directory (created if missing;
// token unused; the directory is used as given, FileStore::Access::kAsGiven). Anything else:
// kInvalidArgument naming the accepted forms. The store's Set and Add wait at most op_timeout
// (the TCP store's request, the file store's counter lock): pass the job's timeout
// (CONCORD_TIMEOUT_S). Thread-safe.
StatusOr<std::unique_ptr<Store>> OpenStore(
    const std::string& url, const std::string& token, Deadline deadline,
    std::chrono::milliseconds op_timeout = std::chrono::seconds(60));

}  // namespace concord
