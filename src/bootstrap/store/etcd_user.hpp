// The job's own etcd user: "commgrid-<job id>", whose password is derived from the job's token
// (so etcd never sees the token), with a role that may use the job's prefix only
// (grant_etcd_job in commgrid/store.hpp creates both).
#pragma once

#include <string>

#include "commgrid/store.hpp"

namespace commgrid::bootstrap::etcd {

/// The job's etcd user name.
std::string job_user(const std::string& job_id);
/// The job's etcd password: a keyed hash (HMAC-SHA256) of the job id under options.token.
std::string job_password(const StoreOptions& options);

}  // namespace commgrid::bootstrap::etcd
