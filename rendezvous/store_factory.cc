#include "rendezvous/store_factory.h"

#include "rendezvous/file_store.h"
#include "rendezvous/net.h"
#include "rendezvous/tcp_store.h"

namespace concord {

StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& url, const std::string& token,
                                           Deadline deadline,
                                           std::chrono::milliseconds op_timeout) {
  static const std::string kTcp = "tcp://";
  static const std::string kFile = "file://";
  if (url.compare(0, kTcp.size(), kTcp) == 0) {
    std::string host;
    int port = 0;
    Status s = net::SplitHostPort(url.substr(kTcp.size()), &host, &port);
    if (!s.ok()) return s.WithContext("store URL '" + url + "'");
    CONCORD_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store,
                             TcpStore::Connect(host, port, token, deadline, op_timeout));
    return std::unique_ptr<Store>(std::move(store));
  }
  if (url.compare(0, kFile.size(), kFile) == 0) {
    const std::string dir = url.substr(kFile.size());
    if (dir.empty() || dir[0] != '/') {
      return InvalidArgument("store URL '" + url +
                             "': a file store needs an absolute path, as in file:///tmp/job");
    }
    CONCORD_ASSIGN_OR_RETURN(std::unique_ptr<FileStore> store, FileStore::Create(dir, op_timeout));
    return std::unique_ptr<Store>(std::move(store));
  }
  return InvalidArgument("store URL '" + url +
                         "' is not supported (expected tcp://host:port or file:///abs/dir)");
}

}  // namespace concord
