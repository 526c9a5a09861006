// ProcessGroups' check that every rank was given the same config and options: one
// allreduce of field hashes, and on a mismatch a gather that names the field and who holds
// which value.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "commgrid/process_groups.hpp"
#include "fingerprint.hpp"

namespace commgrid {
namespace {

// ---- fingerprint ---------------------------------------------------------------------

std::string opt_text(const std::optional<std::int64_t>& v) {
  return v ? std::to_string(*v) : "none";
}

std::string policy_fingerprint(const ParallelConfig& config, const EmbeddingPolicies& p,
                               GroupKind k) {
  const EmbeddingPolicy& policy = k == GroupKind::embd ? p.embedding : p.position_embedding;
  if (!policy) return "default";
  // A function cannot be compared across processes, so compare what it returns on every
  // pipeline group. The groups are streamed one at a time from a layout without policies
  // (O(pp) memory, no list of the world's groups); the Layout that initialize makes after
  // the fingerprint checks the results themselves (rule 13), alike on every rank.
  try {
    const Layout plain(config);
    const std::int64_t groups = plain.num_groups(GroupKind::pp);
    const std::int64_t size = plain.group_size(GroupKind::pp).value_or(config.pp);
    std::vector<Rank> pp_group(static_cast<std::size_t>(size));
    detail::Fingerprint fp;
    for (std::int64_t g = 0; g < groups; ++g) {
      plain.members(GroupKind::pp, 0, g * size, pp_group);
      const std::vector<Rank> chosen = policy(pp_group);
      const auto n = static_cast<std::int64_t>(chosen.size());
      fp.bytes(&n, sizeof n).bytes(chosen.data(), chosen.size() * sizeof(Rank));
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fp.value()));
    return std::string("custom, results hash ") + hex;
  } catch (const std::exception& e) { return std::string("custom, fails: ") + e.what(); }
}

std::vector<std::pair<std::string, std::string>> fingerprint_fields(const ParallelConfig& c,
                                                                    const InitOptions& o,
                                                                    bool world_shared) {
  std::string hcp;
  for (std::size_t i = 0; i < c.hcp.size(); ++i) hcp += (i ? "," : "") + std::to_string(c.hcp[i]);
  std::string kinds;
  for (std::size_t i = 0; i < o.kinds.size(); ++i)
    kinds += (i ? "," : "") + std::string(kind_name(o.kinds[i]));
  return {
      {"world_size", std::to_string(c.world_size)},
      {"tp", std::to_string(c.tp)},
      {"pp", std::to_string(c.pp)},
      {"cp", std::to_string(c.cp)},
      {"ep", std::to_string(c.ep)},
      {"etp", opt_text(c.etp)},
      {"hcp", hcp.empty() ? "none" : hcp},
      {"dist_opt_instances", std::to_string(c.dist_opt_instances)},
      {"vpp", opt_text(c.vpp)},
      {"order", "\"" + c.order + "\""},
      {"kinds", kinds.empty() ? "all" : kinds},
      {"strategy", std::string(strategy_name(o.strategy))},
      {"share_identical_groups", o.share_identical_groups ? "true" : "false"},
      {"world ownership (initialize overload)", world_shared ? "shared" : "borrowed"},
      {"embedding policy", policy_fingerprint(c, o.policies, GroupKind::embd)},
      {"position-embedding policy", policy_fingerprint(c, o.policies, GroupKind::pos_embd)},
      // Catches any field added to ParallelConfig later but not listed above.
      {"config", c.canonical()},
  };
}

// "0-3,6,8-9", at most `limit` runs.
std::string rank_ranges(const std::vector<int>& ranks, std::size_t limit = 8) {
  std::string s;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (runs == limit) {
      s += ",... (" + std::to_string(ranks.size()) + " ranks)";
      break;
    }
    s += (runs ? "," : "") + std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    ++runs;
    i = j + 1;
  }
  return s;
}

}  // namespace

namespace {
std::uint64_t hash_of(const std::vector<std::pair<std::string, std::string>>& fields) {
  detail::Fingerprint fp;
  for (const auto& [name, value] : fields) fp.text(name).text("\x1f").text(value).text("\x1e");
  return fp.value();
}
}  // namespace

std::uint64_t ProcessGroups::fingerprint(const ParallelConfig& config, const InitOptions& options) {
  return hash_of(fingerprint_fields(config, options, true));
}

void ProcessGroups::exchange_fingerprint(Communicator& world, const ParallelConfig& config,
                                         const InitOptions& options) {
  const auto fields = fingerprint_fields(config, options, shared_world_ != nullptr);
  if (options.proven_fingerprint) {
    const std::uint64_t mine = hash_of(fields);
    if (*options.proven_fingerprint == mine) return;  // every rank holds it: nothing to ask
    char text[80];
    std::snprintf(text, sizeof text, "%016llx, this rank's is %016llx",
                  static_cast<unsigned long long>(*options.proven_fingerprint),
                  static_cast<unsigned long long>(mine));
    throw ConfigMismatchError("proven_fingerprint",
                              std::string("initialize: InitOptions::proven_fingerprint is ") +
                                  text + " (config and options differ from the proven ones)");
  }
  const std::size_t F = fields.size();
  // One max-allreduce gives every field's max and min hash: all ranks agree iff they are
  // equal. That costs O(F) whatever the world size; only a mismatch gathers more.
  std::vector<std::int64_t> buf(2 * F);
  for (std::size_t i = 0; i < F; ++i) {
    // 63 bits, so that negating it (for the min in the max-allreduce) cannot overflow.
    buf[i] = detail::Fingerprint().text(fields[i].second).value63();
    buf[F + i] = -buf[i];
  }
  world.allreduce(buf.data(), buf.data(), buf.size(), DataType::int64, ReduceOp::max)->wait();
  bool agree = true;
  for (std::size_t i = 0; i < F; ++i) agree = agree && buf[i] == -buf[F + i];
  if (agree) return;

  // Mismatch: gather every rank's values (padded to the longest) to name the first
  // differing field and who holds what. Every rank reaches this point, so nobody hangs.
  std::string mine;
  for (const auto& f : fields) mine += f.second + '\x1f';
  std::int64_t len = static_cast<std::int64_t>(mine.size());
  world.allreduce(&len, &len, 1, DataType::int64, ReduceOp::max)->wait();
  const std::size_t words = (static_cast<std::size_t>(len) + 7) / 8;
  std::vector<std::int64_t> send(words, 0);
  std::memcpy(send.data(), mine.data(), mine.size());
  const auto W = static_cast<std::size_t>(world.size());
  std::vector<std::int64_t> all(words * W, 0);
  world.allgather(send.data(), all.data(), words, DataType::int64)->wait();
  std::vector<std::vector<std::string>> values(W);
  for (std::size_t r = 0; r < W; ++r) {
    const char* p = reinterpret_cast<const char*>(all.data() + r * words);
    std::string_view text(p, strnlen(p, words * 8));
    std::size_t start = 0;
    for (std::size_t i = 0; i < F; ++i) {
      const std::size_t end = text.find('\x1f', start);
      values[r].emplace_back(
          text.substr(start, end == std::string_view::npos ? text.npos : end - start));
      start = end == std::string_view::npos ? text.size() : end + 1;
    }
  }
  for (std::size_t i = 0; i < F; ++i) {
    std::vector<std::pair<std::string, std::vector<int>>> holders;  // in order of first rank
    for (std::size_t r = 0; r < W; ++r) {
      auto it = std::find_if(holders.begin(), holders.end(),
                             [&](const auto& h) { return h.first == values[r][i]; });
      if (it == holders.end()) holders.push_back({values[r][i], {static_cast<int>(r)}});
      else it->second.push_back(static_cast<int>(r));
    }
    if (holders.size() < 2) continue;
    std::string msg = "config mismatch: ranks were given different " + fields[i].first + ": ";
    const std::size_t shown = std::min<std::size_t>(holders.size(), 6);
    for (std::size_t h = 0; h < shown; ++h)
      msg += (h ? "; " : "") + fields[i].first + " = " + holders[h].first + " on rank" +
             (holders[h].second.size() > 1 ? "s " : " ") + rank_ranges(holders[h].second);
    if (shown < holders.size())
      msg += "; and " + std::to_string(holders.size() - shown) + " more values";
    msg += " (every rank must get the same config and options)";
    throw ConfigMismatchError(fields[i].first, msg);
  }
  // Hashes differed but the texts agree: a hash is computed differently somewhere.
  COMMGRID_ENFORCE(false, "fingerprint hashes differ across ranks but every field agrees");
}

}  // namespace commgrid
