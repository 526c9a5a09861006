// Creation traffic of a Gloo group (issue 24, item 7): a member of a group of n reads only the
// n-1 pair addresses meant for it (O(n) bytes, not every peer's whole list: O(n^2)), makes n
// sets, and no store value grows with the group.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

thread_local int tl_rank = -1;  // the rank this thread plays, for the store's hooks

struct Read {
  int rank;
  std::string key;
};

TEST(GlooCreationTraffic, AMemberReadsOnlyTheAddressesMeantForIt) {
  constexpr int kW = 12;
  std::mutex m;
  std::map<std::string, size_t> sizes;  // every value set, by key
  std::vector<Read> reads;
  auto store = std::make_shared<HookedMemoryStore>(
      StoreHooks{.on_set =
                     [&](const std::string& key, const std::vector<char>& value) {
                       std::lock_guard lock(m);
                       sizes[key] = value.size();
                       return true;
                     },
                 .on_get =
                     [&](const std::string& key) {
                       std::lock_guard lock(m);
                       reads.push_back({tl_rank, key});
                     }});
  const std::vector<int> group_sizes{3, 6, 12};
  std::string error;
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < kW; ++r)
      ranks.emplace_back([&, r] {
        tl_rank = r;
        try {
          auto world = make_gloo_world(placed(store, r, kW, test_options()));
          for (int n : group_sizes) {
            if (r >= n) continue;
            std::vector<Rank> members(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i) members[static_cast<size_t>(i)] = i;
            auto g = world->create_group(members, "g" + std::to_string(n));
            ASSERT_EQ(g->size(), n);
            g->barrier()->wait();
          }
        } catch (const std::exception& e) {
          std::lock_guard lock(m);
          if (error.empty()) error = "rank " + std::to_string(r) + ": " + e.what();
          store->abort("a rank failed");
        }
      });
  }
  ASSERT_EQ(error, "");
  // Per (group, reader): the pair keys read, their bytes.
  std::map<std::pair<std::string, int>, std::vector<std::string>> by_reader;
  for (const Read& rd : reads) {
    const size_t at = rd.key.find("/pair/");
    if (at == std::string::npos) continue;
    by_reader[{rd.key.substr(0, at), rd.rank}].push_back(rd.key.substr(at + 6));
  }
  size_t largest = 0;
  for (const auto& [key, size] : sizes) largest = std::max(largest, size);
  // A pair address is one Gloo record (sockaddr_storage and a sequence number) and a gate
  // mark, whatever the group's size; Gloo's own exchange set (n-1) records in one value.
  constexpr size_t kRecord = sizeof(sockaddr_storage) + 8 + 1;
  EXPECT_LE(largest, kRecord) << "a store value grows with the group";
  int groups_seen = 0;
  for (const auto& [who, keys] : by_reader) {
    const auto& [prefix, rank] = who;
    int n = kW;  // the world's prefix is the world's
    for (int s : group_sizes)
      if (prefix.find("/g" + std::to_string(s) + "/") != std::string::npos) n = s;
    ++groups_seen;
    EXPECT_EQ(static_cast<int>(keys.size()), n - 1) << prefix << " rank " << rank;
    size_t bytes = 0;
    std::set<std::string> distinct;
    for (const std::string& k : keys) {
      // "<from>/<to>": only addresses meant for this member, each once.
      EXPECT_TRUE(k.ends_with("/" + std::to_string(rank)))
          << prefix << " rank " << rank << " read " << k;
      distinct.insert(k);
      bytes += sizes.at(prefix + "/pair/" + k);
    }
    EXPECT_EQ(distinct.size(), keys.size()) << prefix << " rank " << rank << " read a key twice";
    EXPECT_EQ(bytes, static_cast<size_t>(n - 1) * kRecord) << prefix << " rank " << rank;
  }
  // The world (12 readers) and the groups (3 + 6 + 12 readers).
  EXPECT_EQ(groups_seen, kW + 3 + 6 + 12);
}

}  // namespace
}  // namespace commgrid::test
