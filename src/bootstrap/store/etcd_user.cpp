// The job's own etcd user and its grant (etcd_user.hpp; grant_etcd_job in commgrid/store.hpp).
#include "etcd_user.hpp"

#include "etcd_client.hpp"
#include "etcd_store.hpp"
#include "etcd_uri.hpp"
#include "secrets.hpp"

namespace commgrid {
namespace bootstrap::etcd {

std::string job_user(const std::string& job_id) { return "commgrid-" + job_id; }

std::string job_password(const StoreOptions& options) {
  return token_proof(options.token, "commgrid etcd password\n" + options.job_id);
}

}  // namespace bootstrap::etcd

bool grant_etcd_job(const std::string& uri, const std::string& root_user,
                    const std::string& root_password, const StoreOptions& options) {
  using namespace bootstrap::etcd;
  if (!bootstrap::is_etcd_uri(uri)) bad_uri(uri, "not an etcd:// URI");
  const EtcdUri parsed = parse_uri(uri);
  if (options.token.empty())
    throw ConfigError("token",
                      "grant_etcd_job: the job has no token (its user's password is "
                      "derived from COMMGRID_TOKEN)");
#if !COMMGRID_HAVE_CURL
  (void)root_user;
  (void)root_password;
  throw ConfigError("store", "store '" + shown_uri(uri) +
                                 "': this build of commgrid has no etcd support (libcurl)");
#else
  const std::string prefix = parsed.prefix.empty() ? "commgrid/" + options.job_id : parsed.prefix;
  const std::string where = "etcd://" + parsed.hosts() + "/" + prefix;
  // Granted already (by another node's launch, or an earlier run): change nothing, so that
  // the ranks' tokens stay valid (etcd refuses tokens older than a change of users).
  {
    EtcdClient job(parsed, where, job_user(options.job_id), job_password(options), options.timeout,
                   nullptr);
    try {
      if (job.login()) return true;
    } catch (const AuthenticationError&) {}  // not there yet (or another token's: below)
  }
  EtcdClient root(parsed, where, root_user, root_password, options.timeout, nullptr);
  if (!root.login()) return false;  // authentication is off: nothing to grant
  const std::string user = job_user(options.job_id);
  const std::string& role = user;  // the job's role has the user's name
  auto tolerate_exists = [&](const std::string& path, const json& body) {
    try {
      (void)root.call(path, body);
    } catch (const BackendError& e) {
      if (std::string(e.what()).find("already exists") == std::string::npos) throw;
    }
  };
  tolerate_exists("/v3/auth/role/add", {{"name", role}});
  (void)root.call("/v3/auth/role/grant", {{"name", role},
                                          {"perm",
                                           {{"permType", "READWRITE"},
                                            {"key", b64(prefix + "/")},
                                            {"range_end", b64(prefix_end(prefix + "/"))}}}});
  tolerate_exists("/v3/auth/user/add", {{"name", user}, {"password", job_password(options)}});
  (void)root.call("/v3/auth/user/grant", {{"user", user}, {"role", role}});
  // A user that existed already may hold another job's password: proven by logging in.
  EtcdClient job(parsed, where, user, job_password(options), options.timeout, nullptr);
  try {
    (void)job.login();
  } catch (const AuthenticationError&) {
    throw JobConflictError("etcd store " + where + ": user '" + user +
                           "' exists with another password: another job has the id '" +
                           options.job_id + "' and a different token");
  }
  return true;
#endif
}

}  // namespace commgrid
