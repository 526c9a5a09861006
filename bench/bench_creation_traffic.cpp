// Creation traffic: the store operations, bytes and Gloo connections each rank makes to
// create the world and every group, per strategy, measured with a counting store on
// rank-threads at small worlds (where it also checks the model of
// creation_traffic_model.hpp, rank by rank), and counted from that model at 10^3 ... 10^6
// ranks side by side with Megatron-core's pattern on torch.distributed.
//
//   bench_creation_traffic [--measure 16,32,64] [--count 1024,8192,131072,1048576]
//
// Exit 1 when a measured count differs from the model.
#include <dirent.h>

#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commgrid/commgrid.hpp"
#include "commgrid/creation_order.hpp"
#include "creation_traffic_model.hpp"

namespace {

using commgrid::CreationStrategy;
using commgrid::Layout;
using commgrid::ParallelConfig;
using commgrid::bench::Traffic;

// Each rank's own view of the job's store (as each rank of a real job has its own
// connection), counting what it asks.
class CountingStore final : public commgrid::Store {
 public:
  explicit CountingStore(std::shared_ptr<commgrid::Store> inner) : inner_(std::move(inner)) {
    set_job_secret(inner_->job_secret());
  }
  std::string uri() const override { return inner_->uri(); }
  Traffic counts() const {
    Traffic t;
    t.sets = sets_;
    t.gets = gets_;
    t.waits = waits_;
    t.has = has_ - gets_;  // Store::get asks do_has first
    t.set_bytes = set_bytes_;
    t.get_bytes = get_bytes_;
    return t;
  }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    ++sets_;
    set_bytes_ += static_cast<std::int64_t>(value.size());
    inner_->set(key, value);
  }
  std::vector<char> do_get(const std::string& key) override {
    ++gets_;
    std::vector<char> v = inner_->get(key);
    get_bytes_ += static_cast<std::int64_t>(v.size());
    return v;
  }
  bool do_has(const std::string& key) override {
    ++has_;
    return inner_->has(key);
  }
  // One request per wait (a tcp:// store waits at its server), whatever the number of keys.
  std::vector<std::string> do_wait(std::vector<std::string> keys,
                                   std::chrono::milliseconds slice) override {
    ++waits_;
    return inner_->wait_for(keys, slice);
  }
  bool waits_in_slices() const override { return true; }

 private:
  std::shared_ptr<commgrid::Store> inner_;
  std::int64_t sets_ = 0, gets_ = 0, waits_ = 0, has_ = 0, set_bytes_ = 0, get_bytes_ = 0;
};

int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n - 2;  // . and ..
}

std::vector<std::int64_t> parse_list(const std::string& text) {
  std::vector<std::int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}

// 1234567 -> "1.23 M" (unit "") or "1.23 MB" (unit "B").
std::string scaled(double v, const char* unit) {
  struct Step {
    double at;
    const char* prefix;
  };
  static constexpr Step kSteps[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}};
  char buf[32];
  for (const Step& s : kSteps) {
    if (v >= s.at && (s.at > 1e3 || v >= 1e4 || *unit != '\0')) {
      std::snprintf(buf, sizeof buf, "%.*f %s%s", s.at > 1e3 ? 2 : 1, v / s.at, s.prefix, unit);
      return buf;
    }
  }
  std::snprintf(buf, sizeof buf, *unit ? "%.0f %s" : "%.0f%s", v, unit);
  return buf;
}
std::string count_text(double v) { return scaled(v, ""); }
std::string bytes_text(double v) { return scaled(v, "B"); }

std::int64_t requests(const Traffic& t) { return t.sets + t.gets + t.waits + t.has; }

ParallelConfig config(std::int64_t w, std::int64_t tp, std::int64_t pp, std::int64_t cp,
                      std::int64_t ep) {
  ParallelConfig c;
  c.world_size = w;
  c.tp = tp;
  c.pp = pp;
  c.cp = cp;
  c.ep = ep;
  return c;
}

const CreationStrategy kStrategies[] = {CreationStrategy::member, CreationStrategy::split,
                                        CreationStrategy::per_group};

// Runs the world and every group on W rank-threads; returns false when a count differs
// from the model.
bool measure(std::int64_t w, CreationStrategy strategy) {
  const ParallelConfig cfg = config(w, 2, 2, 2, 2);
  const Layout layout(cfg);
  auto inner = commgrid::make_memory_store();
  std::vector<std::shared_ptr<CountingStore>> stores;
  for (std::int64_t r = 0; r < w; ++r) stores.push_back(std::make_shared<CountingStore>(inner));
  std::vector<Traffic> counted(static_cast<size_t>(w));
  std::barrier sync(static_cast<std::ptrdiff_t>(w + 1));
  std::mutex errors_mutex;
  std::string error;
  const int fds0 = open_fds();
  {
    std::vector<std::jthread> ranks;
    for (std::int64_t r = 0; r < w; ++r) {
      ranks.emplace_back([&, r] {
        std::unique_ptr<commgrid::Communicator> world;
        commgrid::ProcessGroups pg;
        try {
          commgrid::GlooOptions o;
          o.timeout = std::chrono::seconds(300);
          o.store = stores[static_cast<size_t>(r)];
          o.rank = static_cast<commgrid::Rank>(r);
          o.size = static_cast<commgrid::Rank>(w);
          world = commgrid::make_gloo_world(o);
          commgrid::InitOptions io;
          io.strategy = strategy;
          pg.initialize(*world, cfg, io);
          counted[static_cast<size_t>(r)] = stores[static_cast<size_t>(r)]->counts();
        } catch (const std::exception& e) {
          std::lock_guard lock(errors_mutex);
          if (error.empty()) error = "rank " + std::to_string(r) + ": " + e.what();
          inner->abort("another rank failed");
        }
        sync.arrive_and_wait();  // the main thread counts descriptors
        sync.arrive_and_wait();
      });
    }
    sync.arrive_and_wait();
    const int fds = open_fds() - fds0;
    sync.arrive_and_wait();
    if (!error.empty()) {
      std::cerr << "error: W " << w << " " << commgrid::strategy_name(strategy) << ": " << error
                << "\n";
      return false;
    }
    Traffic per_rank_max, total, model_total;
    bool same = true;
    for (std::int64_t r = 0; r < w; ++r) {
      const Traffic& m = counted[static_cast<size_t>(r)];
      Traffic model = commgrid::bench::commgrid_rank(layout, r, strategy);
      model_total += model;
      total += m;
      per_rank_max.sets = std::max(per_rank_max.sets, m.sets);
      per_rank_max.gets = std::max(per_rank_max.gets, m.gets);
      per_rank_max.waits = std::max(per_rank_max.waits, m.waits);
      per_rank_max.has = std::max(per_rank_max.has, m.has);
      per_rank_max.set_bytes = std::max(per_rank_max.set_bytes, m.set_bytes);
      per_rank_max.get_bytes = std::max(per_rank_max.get_bytes, m.get_bytes);
      // Waits and rank 0's polls may repeat on a slow machine: the model is their minimum.
      if (m.sets != model.sets || m.gets != model.gets || m.set_bytes != model.set_bytes ||
          m.get_bytes != model.get_bytes || m.waits < model.waits || m.has < model.has) {
        if (same)
          std::cerr << "error: W " << w << " " << commgrid::strategy_name(strategy) << " rank " << r
                    << ": measured sets/gets/waits/has/set bytes/get bytes " << m.sets << "/"
                    << m.gets << "/" << m.waits << "/" << m.has << "/" << m.set_bytes << "/"
                    << m.get_bytes << ", the model says " << model.sets << "/" << model.gets << "/"
                    << model.waits << "/" << model.has << "/" << model.set_bytes << "/"
                    << model.get_bytes << "\n";
        same = false;
      }
    }
    std::cout << "| " << w << " | " << commgrid::strategy_name(strategy) << " | "
              << per_rank_max.sets << " / " << per_rank_max.gets << " / " << per_rank_max.waits
              << " | " << bytes_text(static_cast<double>(per_rank_max.set_bytes)) << " / "
              << bytes_text(static_cast<double>(per_rank_max.get_bytes)) << " | "
              << count_text(static_cast<double>(requests(total))) << " | "
              << bytes_text(static_cast<double>(total.set_bytes + total.get_bytes)) << " | "
              << model_total.pairs << " | " << fds << " | " << (same ? "yes" : "NO") << " |\n";
    return same;
  }
}

// Totals over every rank, from the model: every group's members, once.
struct Totals {
  Traffic commgrid_member, commgrid_split, commgrid_per_group, megatron;
  Traffic commgrid_member_no_w;  // member, without the W-sized intra_dist_opt
  std::int64_t groups = 0, kind_levels = 0, megatron_calls = 0;
};

Totals totals(const Layout& layout) {
  using namespace commgrid::bench;
  const std::int64_t w = layout.world_size();
  Totals t;
  Traffic world = gloo_world(w, 0);
  Traffic others = gloo_world(w, 1);
  for (std::int64_t r = 1; r < w; ++r) world += others;
  commgrid::for_each_creation(
      layout, {},
      [&](commgrid::GroupKind k, int, std::int64_t, std::span<const commgrid::Rank> members) {
        const auto n = static_cast<std::int64_t>(members.size());
        Traffic g = gloo_group(n);
        for (std::int64_t i = 0; i < n; ++i) t.commgrid_member += g;
        if (k != commgrid::GroupKind::intra_dist_opt)
          for (std::int64_t i = 0; i < n; ++i) t.commgrid_member_no_w += g;
        ++t.groups;
        ++t.megatron_calls;
        if (n > 1) {  // the NCCL group's unique id: set by its rank 0, read by the others
          t.megatron.sets += 1;
          t.megatron.set_bytes += 128;
          t.megatron.waits += n - 1;
          t.megatron.gets += n - 1;
          t.megatron.get_bytes += 128 * (n - 1);
        }
        if (k == commgrid::GroupKind::dp || k == commgrid::GroupKind::dp_cp ||
            k == commgrid::GroupKind::expt_dp) {
          ++t.megatron_calls;
          if (n > 1) {
            const std::int64_t rec = 136;
            t.megatron.sets += n;
            t.megatron.set_bytes += n * (n - 1) * rec;
            t.megatron.waits += n * (n - 1);
            t.megatron.gets += n * (n - 1);
            t.megatron.get_bytes += n * (n - 1) * (n - 1) * rec;
            t.megatron.pairs += n * (n - 1);
          }
        }
      });
  for (commgrid::GroupKind k : layout.kinds()) t.kind_levels += layout.levels(k);
  t.commgrid_member += world;
  t.commgrid_member_no_w += world;
  t.commgrid_split = t.commgrid_member;
  t.commgrid_split.world_collectives = t.kind_levels * w;
  t.commgrid_split.world_collective_bytes = t.kind_levels * w * (w - 1) * 24;
  t.commgrid_per_group = t.commgrid_member;
  t.commgrid_per_group.world_collectives = t.groups * w;
  t.commgrid_per_group.world_collective_bytes = t.groups * w * (w - 1) * 8;
  // Megatron: init_process_group's barrier and one per new_group, on every rank.
  t.megatron.sets += 2 * w * (t.megatron_calls + 1);
  t.megatron.set_bytes += 16 * w * (t.megatron_calls + 1);
  t.megatron.get_bytes += 16 * w * (t.megatron_calls + 1);
  return t;
}

void count_row(std::int64_t w) {
  using namespace commgrid::bench;
  const Layout layout(config(w, 8, 8, 2, 8));
  const Totals t = totals(layout);
  // Rank 1: a rank in no embedding group, not the world check's rank 0 (whose size check
  // reads W-1 sizes); the largest per-rank row of commgrid's is rank 0's, given apart.
  auto row = [&](const std::string& who, const Traffic& r, const Traffic& all) {
    std::cout << "| " << w << " | " << who << " | " << count_text(static_cast<double>(requests(r)))
              << " | " << bytes_text(static_cast<double>(r.set_bytes + r.get_bytes)) << " | "
              << count_text(static_cast<double>(r.pairs)) << " | "
              << count_text(static_cast<double>(r.world_collectives)) << " / "
              << bytes_text(static_cast<double>(r.world_collective_bytes)) << " | "
              << count_text(static_cast<double>(requests(all))) << " | "
              << bytes_text(static_cast<double>(all.set_bytes + all.get_bytes)) << " | "
              << count_text(static_cast<double>(all.pairs)) << " |\n";
  };
  const Traffic r0 = commgrid_rank(layout, 0, CreationStrategy::member);
  const Traffic m = commgrid_rank(layout, 1, CreationStrategy::member);
  const Traffic s = commgrid_rank(layout, 1, CreationStrategy::split);
  const Traffic p = commgrid_rank(layout, 1, CreationStrategy::per_group);
  const MegatronCount meg = megatron_rank(layout, 1);
  const commgrid::GroupKind wide[] = {commgrid::GroupKind::intra_dist_opt};
  const Traffic no_w = commgrid_rank(layout, 1, CreationStrategy::member, wide);
  row("commgrid member (rank 0)", r0, t.commgrid_member);
  row("commgrid member", m, t.commgrid_member);
  row("commgrid member, without intra_dist_opt (W-sized)", no_w, t.commgrid_member_no_w);
  row("commgrid split", s, t.commgrid_split);
  row("commgrid per-group", p, t.commgrid_per_group);
  row("Megatron on torch (" + count_text(static_cast<double>(meg.new_group_calls)) + " new_group)",
      meg.rank, t.megatron);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::int64_t> measured{16, 32, 64}, counted{1024, 8192, 131072, 1048576};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--measure" || a == "--count") && i + 1 < argc) {
      try {
        (a == "--measure" ? measured : counted) = parse_list(argv[++i]);
      } catch (const std::exception&) {
        std::cerr << "error: " << a << ": expected a comma-separated list of world sizes, got '"
                  << argv[i] << "'\n";
        return 2;
      }
    } else {
      std::cerr << "error: unknown argument '" << a
                << "' (usage: bench_creation_traffic [--measure W,...] [--count W,...])\n";
      return 2;
    }
  }
  bool ok = true;
  try {
    if (!measured.empty()) {
      std::cout
          << "Measured: rank-threads, Gloo, counting store; tp 2, pp 2, cp 2, ep 2, every kind\n\n"
          << "| W | strategy | per rank (max): sets / gets / waits | per rank (max): bytes set / read "
             "| all ranks: store requests | all ranks: store bytes | Gloo pairs (model) "
             "| sockets open (measured) | model = measured |\n"
          << "|---:|---|---|---|---:|---:|---:|---:|---|\n";
      for (std::int64_t w : measured)
        for (CreationStrategy s : kStrategies) ok = measure(w, s) && ok;
      std::cout << "\n";
    }
    if (!counted.empty()) {
      std::cout
          << "Counted from the model: tp 8, pp 8, cp 2, ep 8, every kind; per rank: rank 1\n\n"
          << "| W | engine / strategy | per rank: store requests | per rank: store bytes "
             "| per rank: connections | per rank: world collectives / bytes in "
             "| all ranks: store requests | all ranks: store bytes | all ranks: connections |\n"
          << "|---:|---|---:|---:|---:|---:|---:|---:|---:|\n";
      for (std::int64_t w : counted) count_row(w);
    }
  } catch (const commgrid::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return ok ? 0 : 1;
}
