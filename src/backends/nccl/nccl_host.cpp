// Host-side parts of the NCCL backend: exchanges over the bootstrap communicator, device
// choice and error texts. Nothing here touches a GPU.
#include "nccl_host.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "commgrid/error.hpp"
#include "commgrid/nccl.hpp"
#include "commgrid/rank_map.hpp"
#include "engine_int.hpp"
#include "fingerprint.hpp"
#include "time_text.hpp"

namespace commgrid::nccl_host {
namespace {

// The bootstrap may be any backend, and int64 is the element type every backend has reduced
// and gathered since the start, so the exchanges below pack bytes into int64 words.
constexpr std::size_t kWord = sizeof(std::int64_t);
constexpr std::size_t kIdWords = kUniqueIdBytes / kWord;
constexpr std::size_t kTextBytes = 200;
constexpr std::size_t kTextWords = kTextBytes / kWord;
// A tag of its own for unique ids on the bootstrap, so that they are not mistaken for a
// user's messages with small tags.
constexpr int kIdTag = kUniqueIdTag;

void put_bytes(std::int64_t* words, std::size_t nwords, const void* data, std::size_t bytes) {
  std::memset(words, 0, nwords * kWord);
  std::memcpy(words, data, std::min(bytes, nwords * kWord));
}

// A string cut so that it always ends with at least one NUL in its field.
void put_text(std::int64_t* words, std::size_t nwords, const std::string& s) {
  put_bytes(words, nwords, s.data(), std::min(s.size(), nwords * kWord - 1));
}

std::string get_text(const std::int64_t* words, std::size_t nwords) {
  const char* p = reinterpret_cast<const char*>(words);
  return std::string(p, strnlen(p, nwords * kWord));
}

// One message carrying an id or the reason there is none: [ok, hash, id..., text...].
struct IdMessage {
  static constexpr std::size_t kWords = 2 + kIdWords + kTextWords;
  static_assert(kWords == kIdMessageWords);
  std::array<std::int64_t, kWords> w{};

  void make(const MakeUniqueId& make_id, std::uint64_t hash) {
    w[1] = static_cast<std::int64_t>(hash);
    try {
      const UniqueId id = make_id();
      put_bytes(&w[2], kIdWords, id.data(), id.size());
      w[0] = 1;
    } catch (const std::exception& e) {
      put_text(&w[2 + kIdWords], kTextWords, e.what());
      w[0] = 0;
    }
  }
  [[nodiscard]] bool ok() const { return w[0] == 1; }
  [[nodiscard]] std::uint64_t hash() const { return static_cast<std::uint64_t>(w[1]); }
  [[nodiscard]] UniqueId id() const {
    UniqueId id{};
    std::memcpy(id.data(), &w[2], id.size());
    return id;
  }
  [[nodiscard]] std::string text() const { return get_text(&w[2 + kIdWords], kTextWords); }
};

}  // namespace

UniqueId broadcast_unique_id(Communicator& bootstrap, Rank root, const MakeUniqueId& make,
                             const std::string& what) {
  IdMessage m;
  if (bootstrap.rank() == root) m.make(make, 0);
  bootstrap.broadcast(m.w.data(), m.w.size(), DataType::int64, root)->wait();
  if (!m.ok())
    throw BackendError("nccl " + what + ": rank " + std::to_string(root) + " of " +
                       bootstrap.name() + " could not make the NCCL unique id: " + m.text());
  return m.id();
}

UniqueId distribute_unique_id(Communicator& bootstrap, std::span<const Rank> members,
                              const std::string& name, const MakeUniqueId& make) {
  COMMGRID_ENFORCE(
      !members.empty() && std::binary_search(members.begin(), members.end(), bootstrap.rank()),
      "distribute_unique_id for " + name + ": this rank is not a member");
  const Rank leader = members.front();
  const std::uint64_t hash = detail::fingerprint(name);
  IdMessage m;
  if (bootstrap.rank() == leader) {
    m.make(make, hash);
    std::vector<P2POp> sends;
    for (Rank peer : members.subspan(1))
      sends.push_back(P2POp::send(m.w.data(), m.w.size(), DataType::int64, peer, kIdTag));
    if (!sends.empty()) bootstrap.batch_isend_irecv(sends)->wait();
  } else {
    bootstrap.recv(m.w.data(), m.w.size(), DataType::int64, leader, kIdTag)->wait();
  }
  if (m.hash() != hash)
    throw BackendError("nccl create_group for " + name + ": rank " + std::to_string(leader) +
                       " of " + bootstrap.name() +
                       " (the first member) sent the id of a group with another name; members "
                       "must create their groups under the same names and in the same order");
  if (!m.ok())
    throw BackendError("nccl create_group for " + name + ": rank " + std::to_string(leader) +
                       " of " + bootstrap.name() +
                       " could not make the NCCL unique id: " + m.text());
  return m.id();
}

std::vector<HostInfo> exchange_host_info(Communicator& bootstrap, const HostInfo& mine) {
  constexpr std::size_t kHostWords = 8, kBusWords = 4;
  constexpr std::size_t kWords = kHostWords + 2 + kBusWords + kTextWords;
  std::array<std::int64_t, kWords> w{};
  put_text(&w[0], kHostWords, mine.host);
  w[kHostWords] = mine.device_count;
  w[kHostWords + 1] = mine.device;
  put_text(&w[kHostWords + 2], kBusWords, mine.bus_id);
  put_text(&w[kHostWords + 2 + kBusWords], kTextWords, mine.problem);
  const auto n = static_cast<std::size_t>(bootstrap.size());
  std::vector<std::int64_t> all(kWords * n);
  bootstrap.allgather(w.data(), all.data(), kWords, DataType::int64)->wait();
  std::vector<HostInfo> out(n);
  for (std::size_t r = 0; r < n; ++r) {
    const std::int64_t* p = &all[r * kWords];
    out[r].host = get_text(p, kHostWords);
    out[r].device_count = static_cast<int>(p[kHostWords]);
    out[r].device = static_cast<int>(p[kHostWords + 1]);
    out[r].bus_id = get_text(p + kHostWords + 2, kBusWords);
    out[r].problem = get_text(p + kHostWords + 2 + kBusWords, kTextWords);
  }
  return out;
}

LocalRank local_rank_of(const std::vector<HostInfo>& all, Rank rank) {
  LocalRank l{0, 0};
  const std::string& host = all.at(static_cast<std::size_t>(rank)).host;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].host != host) continue;
    if (static_cast<Rank>(r) < rank) ++l.rank;
    ++l.size;
  }
  return l;
}

int choose_device(std::optional<int> requested, LocalRank local, int device_count,
                  const std::string& host, const std::string& why) {
  if (device_count <= 0) throw BackendError(why.empty() ? "no CUDA device" : why);
  if (requested) {
    if (*requested < 0 || *requested >= device_count)
      throw InvalidValueError("device", "device " + std::to_string(*requested) + " is not in [0, " +
                                            std::to_string(device_count) +
                                            "): the CUDA devices this process sees on host " +
                                            host);
    return *requested;
  }
  if (device_count == 1) return 0;
  if (local.rank < device_count) return local.rank;
  throw InvalidValueError(
      "device", "local rank " + std::to_string(local.rank) + " of " + std::to_string(local.size) +
                    " on host " + host + " has no CUDA device of its own (this process sees " +
                    std::to_string(device_count) + "); start at most " +
                    std::to_string(device_count) +
                    " ranks per host, or give each process one device with CUDA_VISIBLE_DEVICES");
}

namespace {

std::string own_problem(const std::vector<HostInfo>& all, std::size_t r) {
  return "rank " + std::to_string(r) + " (host " + all[r].host + "): " + all[r].problem;
}

std::string shared_device(const std::vector<HostInfo>& all, std::size_t a, std::size_t b) {
  return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " on host " + all[a].host +
         " both chose CUDA device " + std::to_string(all[a].device) + " (bus " + all[a].bus_id +
         "); NCCL needs one GPU per rank";
}

}  // namespace

std::string world_problem(const std::vector<HostInfo>& all) {
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].problem.empty()) return own_problem(all, r);
  // One 64-bit hash of (host, bus id) per rank with a device, sorted by hash, then host, bus
  // id and rank: ranks on one device become neighbours, in ascending rank order, and names
  // are compared only where hashes are equal. The pair to report is the first two ranks of
  // the device whose lowest rank is lowest, as the pairwise scan (ascending a, then b) found.
  struct Entry {
    std::uint64_t hash;
    std::size_t rank;
  };
  std::vector<Entry> e;
  e.reserve(all.size());
  const std::hash<std::string> h;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].bus_id.empty()) continue;
    const std::uint64_t a = h(all[r].host), b = h(all[r].bus_id);
    e.push_back({a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2)), r});
  }
  auto same = [&](const Entry& x, const Entry& y) {
    return x.hash == y.hash && all[x.rank].host == all[y.rank].host &&
           all[x.rank].bus_id == all[y.rank].bus_id;
  };
  std::sort(e.begin(), e.end(), [&](const Entry& x, const Entry& y) {
    if (x.hash != y.hash) return x.hash < y.hash;
    if (const int c = all[x.rank].host.compare(all[y.rank].host); c != 0) return c < 0;
    if (const int c = all[x.rank].bus_id.compare(all[y.rank].bus_id); c != 0) return c < 0;
    return x.rank < y.rank;
  });
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t best_a = kNone, best_b = kNone;
  for (std::size_t i = 0; i + 1 < e.size(); ++i) {
    const bool first_of_device = i == 0 || !same(e[i - 1], e[i]);
    if (first_of_device && same(e[i], e[i + 1]) && e[i].rank < best_a) {
      best_a = e[i].rank;
      best_b = e[i + 1].rank;
    }
  }
  return best_a == kNone ? "" : shared_device(all, best_a, best_b);
}

std::string world_problem_pairwise(const std::vector<HostInfo>& all) {
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].problem.empty()) return own_problem(all, r);
  for (std::size_t a = 0; a < all.size(); ++a)
    for (std::size_t b = a + 1; b < all.size(); ++b)
      if (all[a].host == all[b].host && !all[a].bus_id.empty() && all[a].bus_id == all[b].bus_id)
        return shared_device(all, a, b);
  return "";
}

bool use_in_place(MemoryKind kind, int buffer_device, int comm_device, const std::string& op,
                  const std::string& group, const std::string& what) {
  switch (kind) {
    case MemoryKind::host:
    case MemoryKind::pinned_host: return false;
    case MemoryKind::managed: return true;
    case MemoryKind::device:
      if (buffer_device == comm_device) return true;
      throw ConfigError(
          what, "nccl " + op + " on " + group + ": " + what + " buffer is memory of CUDA device " +
                    std::to_string(buffer_device) + ", and this communicator's device is " +
                    std::to_string(comm_device));
  }
  return false;
}

WorkVerdict judge(const WorkLook& look) noexcept {
  if (look.event_error) return WorkVerdict::cuda_error;
  if (look.aborted) return WorkVerdict::aborted;
  if (look.nccl_error) return WorkVerdict::nccl_error;
  if (look.nccl_unknown) return WorkVerdict::pending;
  if (look.event_done) return WorkVerdict::complete;
  if (look.past_deadline) return WorkVerdict::timed_out;
  return WorkVerdict::pending;
}

bool nccl_flag_on(const char* value) noexcept {
  if (value == nullptr || *value == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value, &end, 0);
  return errno != 0 || end == value || *end != '\0' || v != 0;
}

void check_nccl_environment(const std::string& what, bool shrink) {
  struct Refused {
    const char* name;
    const char* breaks;
  };
  static constexpr Refused kRefused[] = {
      {"NCCL_COMM_BLOCKING",
       "makes NCCL's creation and calls blocking, and commgrid bounds each of them by its "
       "timeout only on nonblocking communicators"},
      {"NCCL_COMM_SPLIT_SHARE_RESOURCES",
       "makes a split's child share its parent's resources and abort flag, so that one "
       "group's abort (on a timeout) would abort the other"},
  };
  static constexpr Refused kRefusedForShrink = {
      "NCCL_COMM_SHRINK_SHARE_RESOURCES",
      "makes a shrunk world share the old world's resources and abort flag, and the old "
      "world is aborted once the shrink is done"};
  auto refuse = [&](const Refused& r) {
    const char* v = std::getenv(r.name);
    if (nccl_flag_on(v))
      throw ConfigError(
          r.name, what + ": " + r.name + "=" + v + " " + r.breaks + "; unset it or set it to 0");
  };
  for (const Refused& r : kRefused) refuse(r);
  if (shrink) refuse(kRefusedForShrink);
}

std::size_t size_class(std::size_t bytes) noexcept {
  std::size_t c = 4096;
  while (c < bytes) c *= 2;
  return c;
}

BlockCache::Block BlockCache::take_or_make(std::size_t cls, const Make& make) {
  {
    std::lock_guard lock(mutex_);
    for (auto it = free_.lower_bound(cls); it != free_.end(); ++it) {
      if (it->second.empty()) continue;
      void* p = it->second.back();
      it->second.pop_back();
      return {p, it->first};
    }
  }
  void* p = make(cls);
  std::lock_guard lock(mutex_);
  ++owned_[cls];
  ++made_;
  return {p, cls};
}

void BlockCache::give(void* block, std::size_t cls) {
  std::lock_guard lock(mutex_);
  free_[cls].push_back(block);
}

void BlockCache::lose(std::size_t cls) noexcept {
  std::lock_guard lock(mutex_);
  auto it = owned_.find(cls);
  if (it != owned_.end() && it->second > 0) --it->second;
}

void BlockCache::attach(std::span<const Seed> seed, const Make& make) {
  // What is missing is counted as owned at once, so that users attaching together do not
  // both make it; what could not be made is taken back.
  std::vector<std::pair<std::size_t, std::size_t>> missing;
  {
    std::lock_guard lock(mutex_);
    ++users_;
    for (const Seed& s : seed) {
      const std::size_t want = s.per_user * static_cast<std::size_t>(users_);
      std::size_t& owned = owned_[s.cls];
      if (owned < want) {
        missing.emplace_back(s.cls, want - owned);
        owned = want;
      }
    }
  }
  std::size_t i = 0;
  try {
    for (; i < missing.size(); ++i) {
      for (; missing[i].second > 0; --missing[i].second) {
        void* p = make(missing[i].first);
        std::lock_guard lock(mutex_);
        free_[missing[i].first].push_back(p);
        ++made_;
      }
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    for (; i < missing.size(); ++i) owned_[missing[i].first] -= missing[i].second;
    --users_;
    throw;
  }
}

void BlockCache::detach() noexcept {
  std::lock_guard lock(mutex_);
  if (users_ > 0) --users_;
}

std::size_t BlockCache::free_blocks(std::size_t cls) const {
  std::lock_guard lock(mutex_);
  auto it = free_.find(cls);
  return it == free_.end() ? 0 : it->second.size();
}

std::size_t BlockCache::owned_blocks(std::size_t cls) const {
  std::lock_guard lock(mutex_);
  auto it = owned_.find(cls);
  return it == owned_.end() ? 0 : it->second;
}

int BlockCache::users() const {
  std::lock_guard lock(mutex_);
  return users_;
}

std::size_t BlockCache::made() const {
  std::lock_guard lock(mutex_);
  return made_;
}

WorldShrink plan_world_shrink(Rank size, Rank rank, std::span<const Rank> exclude,
                              const std::string& what) {
  // Checked as ranks, then narrowed to NCCL's ints: a rank outside the world never wraps
  // into it.
  std::vector<Rank> sorted(exclude.begin(), exclude.end());
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const Rank r = sorted[i];
    if (r < 0 || r >= size)
      throw RankOutOfRangeError("exclude", what + ": excluded rank " + std::to_string(r) +
                                               " is not in [0, " + std::to_string(size) + ")");
    if (i > 0 && sorted[i - 1] == r)
      throw InvalidValueError("exclude",
                              what + ": rank " + std::to_string(r) + " is excluded twice");
  }
  if (std::binary_search(sorted.begin(), sorted.end(), rank))
    throw InvalidValueError("exclude", what + ": this rank (" + std::to_string(rank) +
                                           ") is excluded; an excluded rank takes no part in "
                                           "the shrink, only the survivors call it");
  WorldShrink plan;
  plan.exclude = detail::engine_ints(sorted);
  plan.size = size - static_cast<Rank>(sorted.size());
  plan.survivors.reserve(static_cast<std::size_t>(plan.size));
  for (Rank r = 0; r < size; ++r) {
    if (std::binary_search(sorted.begin(), sorted.end(), r)) continue;
    if (r == rank) plan.rank = static_cast<Rank>(plan.survivors.size());
    plan.survivors.push_back(r);
  }
  return plan;
}

std::string members_text(std::span<const std::int64_t> members) {
  constexpr std::size_t kShown = 16;
  std::string s = "[";
  for (std::size_t i = 0; i < members.size() && i < kShown; ++i)
    s += (i ? "," : "") + std::to_string(members[i]);
  if (members.size() > kShown) s += ",... (" + std::to_string(members.size()) + " ranks)";
  return s + "]";
}

std::string timeout_message(const std::string& op, const std::string& group,
                            const std::string& target, std::chrono::milliseconds timeout,
                            const std::string& aborted, std::span<const std::int64_t> members) {
  return "nccl " + op + " on " + group + (target.empty() ? "" : " for " + target) +
         ": did not complete within " + seconds_text(timeout) + "; " + aborted +
         " aborted (members " + members_text(members) + ")";
}

}  // namespace commgrid::nccl_host

namespace commgrid {

std::vector<Rank> nccl_excluded_ranks(const RankMap& previous, std::span<const Rank> dead) {
  std::vector<Rank> out;
  for (const Rank p : dead) {
    // role() throws RankOutOfRangeError ("process") for a process the map does not have.
    if (const std::optional<Rank> r = previous.logical_rank(p)) out.push_back(*r);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<std::vector<Rank>> nccl_shrink_exclusion(const RankMap& previous,
                                                       const RankMap& next) {
  std::vector<bool> kept(static_cast<std::size_t>(previous.world_size()), false);
  std::optional<Rank> last;
  for (Rank r = 0; r < next.world_size(); ++r) {
    const std::optional<Rank> old = previous.logical_rank(next.process_of(r));
    if (!old || (last && *old <= *last))
      return std::nullopt;  // a spare joins, or the order changes
    kept[static_cast<std::size_t>(*old)] = true;
    last = old;
  }
  std::vector<Rank> exclude;
  for (std::size_t r = 0; r < kept.size(); ++r)
    if (!kept[r]) exclude.push_back(static_cast<Rank>(r));
  return exclude;
}

}  // namespace commgrid
