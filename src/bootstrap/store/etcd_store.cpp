// The etcd:// store: every Store operation on etcd v3's JSON gateway (HTTP/1.1 POSTs to
// /v3/kv/range, /v3/kv/txn, /v3/watch, /v3/auth/*) through libcurl (etcd_client.hpp), the JSON
// by nlohmann-json.
//
// - Keys live under the job's prefix ("commgrid/<job id>" unless the URI names one), which the
//   job claims (<prefix>/commgrid-job: the id and a keyed hash of the token, as on Redis).
// - Every request of a process with an identity (StoreOptions::process) is a transaction whose
//   first comparison is "my fence key does not exist": once the job fences the identity
//   (<prefix>/commgrid-fence/<identity>), etcd itself refuses its every write and read, and
//   the process learns why (FencedError with the fence's message).
// - A write is a transaction "the key does not exist -> put", so keys are written once as the
//   Store contract says, and set_if_absent is decided by etcd's raft log. A write whose reply
//   was lost after it may have been applied, and that finds the key holding exactly its value
//   when sent again, is the write's own.
// - A wait is one range read (what is there, at which revision) and then one watch from the
//   next revision on the keys' common prefix: no polling, and no event is missed between
//   them.
// - Reads ask the member first without a round of raft ("serializable": the member answers
//   from what it has applied, no trip to the leader and a quorum). Keys are written once and
//   never removed, so a key such a read finds is there with that value; only an answer
//   "absent" may be stale, and get and has confirm it with a linearizable read (a wait
//   watches from the revision read instead, which a stale member reaches). Across hosts,
//   this makes a read of a present key local: over links 200 ms each way a linearizable read
//   costs a trip to the leader and its heartbeat to a quorum, about 0.8 s.
// - Authentication: the URI's user and password, else, with a token, the job's user
//   "commgrid-<job id>" with a password derived from the token (etcd_user.hpp).
#include "etcd_store.hpp"

#include <set>
#include <string>
#include <vector>

#include "etcd_client.hpp"
#include "etcd_json.hpp"
#include "etcd_uri.hpp"
#include "etcd_user.hpp"
#include "job_claim.hpp"

namespace commgrid::bootstrap {

using namespace etcd;  // this file is the etcd store

namespace {

#if COMMGRID_HAVE_CURL

class EtcdStore final : public Store {
 public:
  EtcdStore(const EtcdUri& uri, const StoreOptions& o)
      : prefix_(uri.prefix.empty() ? "commgrid/" + o.job_id : uri.prefix),
        where_("etcd://" + uri.hosts() + "/" + prefix_), identity_(o.process),
        client_(uri, where_, uri.user.empty() && !o.token.empty() ? job_user(o.job_id) : uri.user,
                uri.user.empty() && !o.token.empty() ? job_password(o) : uri.password, o.timeout,
                &abort_flag()) {}

  [[nodiscard]] std::string uri() const override { return where_; }
  [[nodiscard]] std::string local_address() const override { return client_.local_address(); }

  /// Claims the prefix for the job (or checks the claim), and sets the job secret.
  void claim(const StoreOptions& o) {
    const std::string mine = new_claim(o);
    std::string found;
    if (put_if_absent(full("commgrid-job"), mine, &found)) {
      set_job_secret(parse_claim(mine).secret);
      return;
    }
    set_job_secret(accept_claim(where_, found, o));
  }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    if (!put_if_absent(full(key), std::string(value.begin(), value.end()), nullptr))
      throw BackendError("store set on " + where_ + ": key '" + key + "' is already set");
  }
  bool do_set_if_absent(const std::string& key, const std::vector<char>& value) override {
    return put_if_absent(full(key), std::string(value.begin(), value.end()), nullptr);
  }
  std::vector<char> do_get(const std::string& key) override {
    json kvs;
    for (const bool serializable : {true, false}) {
      kvs = kvs_of(
          guarded(json::array({{{"request_range", {{"key", b64(full(key))}}}}}), serializable), 0);
      if (!kvs.empty()) break;  // (absent from the member's copy: ask the cluster)
    }
    if (kvs.empty())
      throw BackendError("store get on " + where_ + ": key '" + key + "' is not set");
    const std::string v = unb64(text_of(kvs[0], "value"));
    return {v.begin(), v.end()};
  }
  bool do_has(const std::string& key) override { return has_in(key, true) || has_in(key, false); }
  bool do_has_nearby(const std::string& key) override { return has_in(key, true); }
  // What is there now (one range read over the keys' common prefix), then a watch from the
  // next revision for the rest of the slice.
  std::vector<std::string> do_wait(std::vector<std::string> keys, Ms slice) override {
    if (keys.empty()) return keys;
    std::set<std::string> missing;
    for (const auto& k : keys) missing.insert(full(k));
    std::string common = *missing.begin();
    for (const auto& k : missing) {
      size_t i = 0;
      while (i < common.size() && i < k.size() && common[i] == k[i]) ++i;
      common.resize(i);
    }
    const std::string end = prefix_end(common);
    const json r = guarded(
        json::array({{{"request_range",
                       {{"key", b64(common)}, {"range_end", b64(end)}, {"keys_only", true}}}}}),
        true);
    for (const json& kv : kvs_of(r, 0)) missing.erase(unb64(text_of(kv, "key")));
    if (!missing.empty() && slice > Ms(0))
      client_.watch(common, end, number(field(r, "header"), "revision") + 1, missing, slice);
    std::erase_if(keys, [&](const std::string& k) { return missing.count(full(k)) == 0; });
    return keys;
  }
  [[nodiscard]] bool waits_in_slices() const override { return true; }
  // The fence key: every later request of `process` compares it absent, so etcd refuses them.
  bool do_fence(const std::string& process, const std::string& message) override {
    (void)put_if_absent(fence_key(process), message, nullptr);
    return true;
  }

 private:
  [[nodiscard]] std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  [[nodiscard]] std::string fence_key(const std::string& identity) const {
    return prefix_ + "/commgrid-fence/" + identity;
  }

  // Whether `key` is present: as the member has it (`serializable`), or as the cluster has.
  bool has_in(const std::string& key, bool serializable) {
    const json r =
        guarded(json::array({{{"request_range", {{"key", b64(full(key))}, {"count_only", true}}}}}),
                serializable);
    return number(field(item(field(r, "responses"), 0), "response_range"), "count") > 0;
  }

  // A transaction: if this process is not fenced, `ops`; else FencedError with the fence's
  // message. Returns the reply of a transaction that succeeded. `serializable` (ops that are
  // all range reads): the member answers from its own copy, without a round of raft (etcd
  // serves a read-only transaction so when each of its reads asks for it); the fence is then
  // seen once that member has applied it.
  json guarded(json ops, bool serializable = false) {
    if (serializable)
      for (json& op : ops) op["request_range"]["serializable"] = true;
    json txn{{"success", ops}};
    if (!identity_.empty()) {
      txn["compare"] = json::array({fence_absent()});
      json fence_read{{"key", b64(fence_key(identity_))}};
      if (serializable) fence_read["serializable"] = true;
      txn["failure"] = json::array({{{"request_range", fence_read}}});
    }
    json r = client_.call("/v3/kv/txn", txn);
    if (field(r, "succeeded") != true) throw_fenced(kvs_of(r, 0));
    return r;
  }

  [[nodiscard]] json fence_absent() const {
    return {{"key", b64(fence_key(identity_))},
            {"target", "VERSION"},
            {"result", "EQUAL"},
            {"version", "0"}};
  }

  [[noreturn]] void throw_fenced(const json& kvs) {
    const std::string message = kvs.empty() ? "" : unb64(text_of(kvs[0], "value"));
    throw FencedError(message.empty() ? "etcd store " + where_ + ": " + identity_ + " is fenced"
                                      : message);
  }

  // Puts `value` at `key` unless the key exists (one transaction, guarded by this process's
  // fence): true when this call put it. `found` receives the value that was there. After an
  // attempt that may have been applied without a reply, a key holding exactly this value
  // counts as this call's.
  bool put_if_absent(const std::string& key, const std::string& value, std::string* found) {
    json compare = json::array();
    json failure = json::array({{{"request_range", {{"key", b64(key)}}}}});
    if (!identity_.empty()) {
      compare.push_back(fence_absent());
      failure.push_back({{"request_range", {{"key", b64(fence_key(identity_))}}}});
    }
    compare.push_back(
        {{"key", b64(key)}, {"target", "VERSION"}, {"result", "EQUAL"}, {"version", "0"}});
    const json txn{
        {"compare", compare},
        {"success", json::array({{{"request_put", {{"key", b64(key)}, {"value", b64(value)}}}}})},
        {"failure", failure}};
    bool ambiguous = false;
    const json r = client_.call("/v3/kv/txn", txn, &ambiguous);
    if (field(r, "succeeded") == true) return true;
    if (!identity_.empty() && !kvs_of(r, 1).empty()) throw_fenced(kvs_of(r, 1));
    const json kvs = kvs_of(r, 0);
    const std::string there = kvs.empty() ? "" : unb64(text_of(kvs[0], "value"));
    if (found != nullptr) *found = there;
    return ambiguous && there == value;
  }

  std::string prefix_, where_, identity_;
  EtcdClient client_;
};

#endif  // COMMGRID_HAVE_CURL

}  // namespace

bool is_etcd_uri(std::string_view uri) { return uri.starts_with(kScheme); }

std::shared_ptr<Store> make_etcd_store(std::string_view uri, const StoreOptions& options) {
  const EtcdUri parsed = parse_uri(uri);
#if !COMMGRID_HAVE_CURL
  (void)options;
  throw ConfigError("store", "store '" + shown_uri(uri) +
                                 "': this build of commgrid has no etcd support (libcurl was not "
                                 "found when it was built: libcurl4-openssl-dev)");
#else
  auto store = std::make_shared<EtcdStore>(parsed, options);
  store->claim(options);
  join_as_rank(*store, options);
  return store;
#endif
}

}  // namespace commgrid::bootstrap
