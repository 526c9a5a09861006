// The etcd:// store: etcd v3's JSON gateway over HTTP (libcurl), several members, waits as
// watches, fencing enforced by etcd (every write of a process is a transaction comparing that
// its fence key is absent), the job's token as etcd's authentication. docs/launching.md.
#pragma once

#include <memory>
#include <string_view>

#include "commgrid/store.hpp"

namespace commgrid::bootstrap {

/// Opens `etcd://[user:password@]host:port[,host:port...][/prefix]` for options.job_id:
/// authenticates (the URI's user, else with a token the job's user), claims the prefix for the
/// job (JobConflictError when another job holds it) and, with options.process, refuses to open
/// for a fenced identity (FencedError). ConfigError (parameter "store") for a malformed URI or a
/// build without libcurl; TimeoutError when no member answers within options.timeout.
std::shared_ptr<Store> make_etcd_store(std::string_view uri, const StoreOptions& options);

/// Whether `uri` is an etcd:// URI.
bool is_etcd_uri(std::string_view uri);

}  // namespace commgrid::bootstrap
