// `commgrid bench layout|init|collectives`: the benchmarks of docs/benchmarks.md with the
// command's own timing loops (no Google Benchmark needed), printed as a table or JSON.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_errors.hpp"
#include "bench_layout.hpp"
#include "bench_runtime.hpp"
#if COMMGRID_HAS_BOOTSTRAP
#include "bench_store.hpp"
#endif
#include "command.hpp"
#include "commgrid/backends.hpp"
#include "commgrid/error.hpp"
#include "commgrid/process_groups.hpp"
#include "layout_flags.hpp"
#if COMMGRID_HAS_MPI
#include "commgrid/mpi.hpp"
#endif
#if COMMGRID_HAS_GLOO
#include <gloo/allgather.h>
#include <gloo/alltoallv.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "commgrid/gloo.hpp"
#include "commgrid/local_ranks.hpp"
#endif
#if COMMGRID_HAS_NCCL
#include "bench_nccl.hpp"
#include "commgrid/nccl.hpp"
#endif

namespace commgrid::cli {
namespace {

using Json = nlohmann::ordered_json;
using bench::DirectCollectives;

struct BenchLayoutOptions {
  std::string worlds, query_worlds, repeats = "5", queries = "100000", memory = "warm",
      format = "table", compat = "seed", gtp_remat = "1";
};

void check_format(const std::string& format) {
  if (format != "table" && format != "json")
    throw ConfigError("format", "format: unknown format \"" + format + "\" (valid: table, json)");
}

std::string bench_config_text(const bench::BenchEdition& e);

std::vector<std::int64_t> parse_worlds(const char* param, const std::string& text,
                                       std::span<const std::int64_t> defaults,
                                       const bench::BenchEdition& edition) {
  if (text.empty()) return {defaults.begin(), defaults.end()};
  if (text == "none") return {};
  std::vector<std::int64_t> worlds = parse_integer_list(param, text, 1);
  for (std::int64_t w : worlds) {
    try {
      (void)bench::bench_config(w, edition);
    } catch (const ConfigError& e) {
      throw ConfigError(param, std::string(param) + ": world " + std::to_string(w) +
                                   " does not fit " + bench_config_text(edition) + " (" + e.what() + ")");
    }
  }
  return worlds;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string mib(double bytes) { return fmt("%.1f", bytes / (1024.0 * 1024.0)); }

// "tp8 pp8 cp2 ep8 etp1, dp = W/128" (under head: ", compat head, gtp_remat 2, dp = W/256").
std::string bench_config_text(const bench::BenchEdition& e) {
  std::string s = "tp8 pp8 cp2 ep8 etp1";
  if (e.compat == Compat::head) s += " compat head gtp_remat" + std::to_string(e.gtp_remat);
  return s + ", dp = W/" + std::to_string(128 * e.gtp_remat);
}

Json layout_json(const std::vector<bench::EnumerationResult>& en,
                 const std::vector<bench::QueryResult>& qs, int repeats,
                 const std::string& memory, const bench::BenchEdition& edition) {
  Json j;
  j["benchmark"] = "layout";
  j["memory"] = memory;
  j["config"] = {{"tp", 8}, {"pp", 8}, {"cp", 2}, {"ep", 8}, {"etp", 1},
                 {"compat", compat_name(edition.compat)}, {"gtp_remat", edition.gtp_remat},
                 {"dp", "W/" + std::to_string(128 * edition.gtp_remat)}};
  j["repeats"] = repeats;
  j["timing"] = "process CPU time, fastest repetition; ratio = enumeration seconds / baseline seconds";
  Json ea = Json::array();
  for (const auto& e : en) {
    Json w;
    w["world_size"] = e.world_size;
    w["kinds"] = e.kinds.size();
    w["groups"] = e.groups;
    w["members"] = e.members;
    w["bytes"] = e.bytes;
    w["largest_list_bytes"] = e.largest_bytes;
    w["rss_growth_bytes"] = e.rss_growth;
    w["seconds"] = e.seconds;
    w["baseline_seconds"] = e.baseline_seconds;
    w["ratio"] = e.seconds / e.baseline_seconds;
    Json ka = Json::array();
    for (const auto& k : e.kinds)
      ka.push_back({{"kind", kind_name(k.kind)},
                    {"groups", k.groups},
                    {"members", k.members},
                    {"bytes", k.bytes},
                    {"seconds", k.seconds},
                    {"baseline_seconds", k.baseline_seconds},
                    {"ratio", k.seconds / k.baseline_seconds}});
    w["per_kind"] = std::move(ka);
    ea.push_back(std::move(w));
  }
  j["enumeration"] = std::move(ea);
  Json qa = Json::array();
  for (const auto& q : qs)
    qa.push_back({{"world_size", q.world_size},
                  {"kind", kind_name(q.kind)},
                  {"group_size", q.group_size},
                  {"ns_per_query", q.ns_per_query}});
  j["queries"] = std::move(qa);
  return j;
}

void layout_table(std::ostream& out, const std::vector<bench::EnumerationResult>& en,
                  const std::vector<bench::QueryResult>& qs, int repeats,
                  const std::string& memory, const bench::BenchEdition& edition) {
  out << "layout benchmark: " << bench_config_text(edition) << "; CPU time, fastest of " << repeats
      << " repetitions; " << memory << " memory\n\n";
  if (!en.empty()) {
    out << "enumeration of every kind (lists held together) vs writing as many int64:\n";
    char line[256];
    std::snprintf(line, sizeof line, "%10s %5s %10s %11s %9s %9s %10s %10s %7s\n",
                  "world", "kinds", "groups", "members", "MiB", "rss_MiB", "enum_ms",
                  "write_ms", "ratio");
    out << line;
    for (const auto& e : en) {
      std::snprintf(line, sizeof line,
                    "%10lld %5zu %10lld %11lld %9s %9s %10.3f %10.3f %7.2f\n",
                    static_cast<long long>(e.world_size), e.kinds.size(),
                    static_cast<long long>(e.groups), static_cast<long long>(e.members),
                    mib(static_cast<double>(e.bytes)).c_str(),
                    mib(static_cast<double>(e.rss_growth)).c_str(), e.seconds * 1e3,
                    e.baseline_seconds * 1e3, e.seconds / e.baseline_seconds);
      out << line;
    }
    const auto& big = en.back();
    out << "\nper kind at world " << big.world_size << ":\n";
    std::snprintf(line, sizeof line, "%-15s %9s %11s %9s %10s %10s %7s\n", "kind", "groups",
                  "members", "MiB", "enum_ms", "write_ms", "ratio");
    out << line;
    for (const auto& k : big.kinds) {
      std::snprintf(line, sizeof line, "%-15s %9lld %11lld %9s %10.3f %10.3f %7.2f\n",
                    std::string(kind_name(k.kind)).c_str(), static_cast<long long>(k.groups),
                    static_cast<long long>(k.members), mib(static_cast<double>(k.bytes)).c_str(),
                    k.seconds * 1e3, k.baseline_seconds * 1e3, k.seconds / k.baseline_seconds);
      out << line;
    }
  }
  if (!qs.empty()) {
    out << "\none rank's group (Layout::group_of), ns per query:\n";
    char b[32];
    std::snprintf(b, sizeof b, "%10s", "world");
    out << b;
    for (GroupKind k : bench::kQueryKinds) {
      std::snprintf(b, sizeof b, "%9s", std::string(kind_name(k)).c_str());
      out << b;
    }
    out << "\n";
    for (std::size_t i = 0; i < qs.size(); i += bench::kQueryKinds.size()) {
      std::snprintf(b, sizeof b, "%10lld", static_cast<long long>(qs[i].world_size));
      out << b;
      for (std::size_t j = i; j < i + bench::kQueryKinds.size() && j < qs.size(); ++j)
        out << fmt("%9.0f", qs[j].ns_per_query);
      out << "\n";
    }
  }
}

int run_bench_layout(const BenchLayoutOptions& o) {
  check_format(o.format);
  bench::LayoutBenchOptions opts;
  if (o.memory == "cold")
    opts.memory = bench::MemoryMode::cold;
  else if (o.memory != "warm")
    throw ConfigError("memory", "memory: unknown mode \"" + o.memory + "\" (valid: warm, cold)");
  if (o.compat == "head")
    opts.edition.compat = Compat::head;
  else if (o.compat != "seed")
    throw ConfigError("compat", "compat: expected seed or head, got \"" + o.compat + "\"");
  opts.edition.gtp_remat = parse_integer("gtp_remat", o.gtp_remat, 1, 1024);
  if (opts.edition.gtp_remat != 1 && opts.edition.compat != Compat::head)
    throw ConfigError("gtp_remat", "gtp_remat = " + std::to_string(opts.edition.gtp_remat) +
                                       " requires compat head");
  opts.worlds = parse_worlds("worlds", o.worlds, bench::kEnumerationWorlds, opts.edition);
  opts.query_worlds = parse_worlds("query_worlds", o.query_worlds, bench::kQueryWorlds, opts.edition);
  opts.repeats = static_cast<int>(parse_integer("repeats", o.repeats, 1, 1000));
  opts.queries = static_cast<std::size_t>(parse_integer("queries", o.queries, 1, 100000000));
  const auto en = bench::run_enumeration(opts);
  const auto qs = bench::run_queries(opts);
  if (o.format == "json")
    std::cout << layout_json(en, qs, opts.repeats, o.memory, opts.edition).dump(2) << "\n";
  else
    layout_table(std::cout, en, qs, opts.repeats, o.memory, opts.edition);
  std::cout.flush();
  if (!std::cout) throw Error("bench: writing the output failed");
  return 0;
}


// ---- init and collectives: real ranks ----------------------------------------------

/// Flags shared by `bench init` and `bench collectives`.
struct RuntimeFlags {
  std::string backend = "mpi", local, timeout = "600", format = "table", direct = "blocking";
};

struct BenchInitFlags {
  RuntimeFlags rt;
  LayoutFlags layout;
  std::string strategies = "split,member,per-group", repeats = "5";
};

struct BenchCollectivesFlags {
  RuntimeFlags rt;
  std::string sizes = "1KiB,64MiB", iterations = "1000";
};

/// What a runtime benchmark does once its world exists; returns the text rank 0 prints.
using WorldJob = std::function<std::string(Communicator& world, DirectCollectives* direct)>;

#if COMMGRID_HAS_MPI
/// MPI called directly on the same communicator that commgrid's world wraps.
class MpiDirect final : public DirectCollectives {
 public:
  /// nonblocking: MPI_Iallreduce + MPI_Wait, the same MPI algorithm that commgrid's MPI
  /// backend starts (it polls MPI_Test for its timeout), so that only commgrid's own cost
  /// differs; otherwise the blocking calls, which Open MPI may serve with another algorithm.
  MpiDirect(MPI_Comm comm, bool nonblocking) : comm_(comm), nonblocking_(nonblocking) {}
  void allreduce(const float* send, float* recv, std::size_t count) override {
    const int n = static_cast<int>(count);
    if (!nonblocking_) {
      check(MPI_Allreduce(send, recv, n, MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
      return;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(send, recv, n, MPI_FLOAT, MPI_SUM, comm_, &req), "MPI_Iallreduce");
    check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  void allgather(const float* send, float* recv, std::size_t count) override {
    const int n = static_cast<int>(count);
    if (!nonblocking_) {
      check(MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_), "MPI_Allgather");
      return;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Iallgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_, &req), "MPI_Iallgather");
    check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  void pingpong(float* buf, std::size_t count, int peer, bool initiator) override {
    const int n = static_cast<int>(count);
    for (int leg = 0; leg < 2; ++leg) {
      MPI_Request req = MPI_REQUEST_NULL;
      if ((leg == 0) == initiator)
        check(MPI_Isend(buf, n, MPI_FLOAT, peer, 0, comm_, &req), "MPI_Isend");
      else
        check(MPI_Irecv(buf, n, MPI_FLOAT, peer, 0, comm_, &req), "MPI_Irecv");
      check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
    }
  }
  void exchange(const float* send, float* recv, std::size_t count, int peer) override {
    const int n = static_cast<int>(count);
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    check(MPI_Isend(send, n, MPI_FLOAT, peer, 0, comm_, &reqs[0]), "MPI_Isend");
    check(MPI_Irecv(recv, n, MPI_FLOAT, peer, 0, comm_, &reqs[1]), "MPI_Irecv");
    check(MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE), "MPI_Waitall");
  }
  void alltoallv(const float* send, const std::vector<std::size_t>& send_counts, float* recv,
                 const std::vector<std::size_t>& recv_counts) override {
    std::vector<int> sc, sd, rc, rd;
    for (std::size_t i = 0, s = 0, r = 0; i < send_counts.size(); ++i) {
      sc.push_back(static_cast<int>(send_counts[i]));
      sd.push_back(static_cast<int>(s));
      rc.push_back(static_cast<int>(recv_counts[i]));
      rd.push_back(static_cast<int>(r));
      s += send_counts[i];
      r += recv_counts[i];
    }
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(),
                         MPI_FLOAT, comm_, &req),
          "MPI_Ialltoallv");
    check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  [[nodiscard]] std::string description() const override {
    return nonblocking_ ? "MPI_Iallreduce / MPI_Iallgather + MPI_Wait; MPI_Isend/Irecv; MPI_Ialltoallv"
                        : "MPI_Allreduce / MPI_Allgather; MPI_Isend/Irecv; MPI_Ialltoallv";
  }

 private:
  static void check(int rc, const char* op) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw BackendError(std::string("bench: direct ") + op + ": " + std::string(text, len));
  }
  MPI_Comm comm_;
  bool nonblocking_;
};
#endif

/// Runs `job` on every rank of an MPI world (this process is one rank of an mpirun job);
/// rank 0 prints. `prepare` checks the input once the world size is known, on every rank
/// alike, so that bad input ends every rank with exit 2 before any communication.
int run_on_mpi(const RuntimeFlags& rt, const std::function<void(int world_size)>& prepare,
               const WorldJob& job) {
#if COMMGRID_HAS_MPI
  const auto timeout = std::chrono::seconds(parse_integer("timeout", rt.timeout, 1, 7 * 24 * 3600));
  mpi::MpiEnvironment env;
  const std::unique_ptr<mpi::MpiCommunicator> world = make_mpi_world(timeout);
  const int rank = world->rank();
  try {
    prepare(world->size());
  } catch (const ConfigError& e) {
    if (rank == 0) print_error(e.what());
    return 2;
  }
  std::string text;
  try {
    MpiDirect direct(world->native(), rt.direct == "nonblocking");
    text = job(*world, &direct);
  } catch (const ConfigError& e) {  // a config mismatch: raised on every rank
    if (rank == 0) print_error(e.what());
    return 2;
  } catch (const Error& e) {
    // Possibly this rank's alone: end the job rather than leave the others waiting.
    print_error("rank " + std::to_string(rank) + ": " + e.what());
    mpi::MpiEnvironment::abort(1);
  }
  if (rank == 0) std::cout << text << std::flush;
  return 0;
#else
  (void)rt;
  (void)prepare;
  (void)job;
  throw ConfigError("backend",
                    "bench: this build of commgrid has no MPI backend; install an MPI (e.g. "
                    "libopenmpi-dev) and rebuild with -DCOMMGRID_WITH_MPI=ON, or use --backend gloo");
#endif
}


#if COMMGRID_HAS_GLOO
/// Gloo called directly: its own full-mesh context over the same TCP transport on
/// loopback, set up on first use (init does not need it), the algorithms called as Gloo's
/// documentation shows (separate input and output, Gloo's own vectorized sum).
class GlooDirect final : public DirectCollectives {
  static constexpr std::uint64_t kSlot = 0x7700;  // the direct context's own point to point

 public:
  GlooDirect(::gloo::rendezvous::Store& store, int rank, int size,
             std::chrono::milliseconds timeout)
      : store_(store), rank_(rank), size_(size), timeout_(timeout) {}
  void allreduce(const float* send, float* recv, std::size_t count) override {
    ::gloo::AllreduceOptions opts(context());
    opts.setInput(const_cast<float*>(send), count);
    opts.setOutput(recv, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&::gloo::sum<float>));
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    guard("allreduce", [&] { ::gloo::allreduce(opts); });
  }
  void allgather(const float* send, float* recv, std::size_t count) override {
    ::gloo::AllgatherOptions opts(context());
    opts.setInput(const_cast<float*>(send), count);
    opts.setOutput(recv, count * static_cast<std::size_t>(size_));
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    guard("allgather", [&] { ::gloo::allgather(opts); });
  }
  void pingpong(float* buf, std::size_t count, int peer, bool initiator) override {
    auto ub = context()->createUnboundBuffer(buf, count * sizeof(float));
    for (int leg = 0; leg < 2; ++leg) {
      if ((leg == 0) == initiator) {
        guard("send", [&] {
          ub->send(peer, kSlot);
          ub->waitSend(timeout_);
        });
      } else {
        guard("recv", [&] {
          ub->recv(peer, kSlot);
          ub->waitRecv(timeout_);
        });
      }
    }
  }
  void exchange(const float* send, float* recv, std::size_t count, int peer) override {
    auto out = context()->createUnboundBuffer(const_cast<float*>(send), count * sizeof(float));
    auto in = context()->createUnboundBuffer(recv, count * sizeof(float));
    guard("exchange", [&] {
      out->send(peer, kSlot);
      in->recv(peer, kSlot);
      out->waitSend(timeout_);
      in->waitRecv(timeout_);
    });
  }
  void alltoallv(const float* send, const std::vector<std::size_t>& send_counts, float* recv,
                 const std::vector<std::size_t>& recv_counts) override {
    ::gloo::AlltoallvOptions opts(context());
    opts.setInput(const_cast<float*>(send),
                  std::vector<std::int64_t>(send_counts.begin(), send_counts.end()));
    opts.setOutput(recv, std::vector<std::int64_t>(recv_counts.begin(), recv_counts.end()));
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    guard("alltoallv", [&] { ::gloo::alltoallv(opts); });
  }
  [[nodiscard]] std::string description() const override {
    return "gloo::allreduce / gloo::allgather / gloo::alltoallv and unbound buffers on a plain "
           "gloo context";
  }

 private:
  const std::shared_ptr<::gloo::Context>& context() {
    if (!ctx_) {
      guard("connect", [&] {
        ::gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto device = ::gloo::transport::tcp::CreateDevice(attr);
        ::gloo::rendezvous::PrefixStore prefixed("bench-direct", store_);
        auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank_, size_);
        ctx->setTimeout(timeout_);
        ctx->connectFullMesh(prefixed, device);
        ctx_ = std::move(ctx);
      });
    }
    return ctx_;
  }
  template <typename F>
  static void guard(const char* op, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      throw BackendError(std::string("bench: direct gloo ") + op + ": " + one_line(e.what()));
    }
  }
  ::gloo::rendezvous::Store& store_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<::gloo::Context> ctx_;
  int tag_ = 0;
};
#endif

/// Runs `job` on --local N ranks, each a thread of this process over Gloo; rank 0's text
/// is printed. Bad input throws ConfigError before any thread starts.
int run_on_gloo(const RuntimeFlags& rt, const std::function<void(int world_size)>& prepare,
                const WorldJob& job) {
#if COMMGRID_HAS_GLOO
  if (rt.local.empty())
    throw ConfigError("local", "local: --backend gloo needs --local N (N ranks as threads of "
                               "this process)");
  const int n = static_cast<int>(parse_integer("local", rt.local, 1, 4096));
  const auto timeout = std::chrono::seconds(parse_integer("timeout", rt.timeout, 1, 7 * 24 * 3600));
  prepare(n);
  GlooOptions options;
  options.timeout = timeout;
  ::gloo::rendezvous::HashStore direct_store;  // thread-safe; the direct contexts meet here
  std::string text;
  run_local_ranks(
      n,
      [&](Communicator& world) {
        GlooDirect direct(direct_store, world.rank(), world.size(), timeout);
        std::string mine = job(world, &direct);
        if (world.rank() == 0) text = std::move(mine);
      },
      options);
  std::cout << text << std::flush;
  return 0;
#else
  (void)rt;
  (void)prepare;
  (void)job;
  throw ConfigError("backend",
                    "bench: this build of commgrid has no Gloo backend; install Gloo (e.g. "
                    "libgloo-dev) and rebuild with -DCOMMGRID_WITH_GLOO=ON, or use --backend mpi");
#endif
}

/// Runs `job` on an NCCL world, one GPU per rank, bootstrapped from --local N rank-threads
/// over Gloo or, without --local, from MPI (under mpirun); rank 0's text is printed.
int run_on_nccl(const RuntimeFlags& rt, const std::function<void(int world_size)>& prepare,
                const WorldJob& job) {
#if COMMGRID_HAS_NCCL
  NcclOptions nccl;
  nccl.timeout = std::chrono::seconds(parse_integer("timeout", rt.timeout, 1, 7 * 24 * 3600));
  if (!rt.local.empty()) {
#if COMMGRID_HAS_GLOO
    const int n = static_cast<int>(parse_integer("local", rt.local, 1, 4096));
    prepare(n);
    GlooOptions options;
    options.timeout = *nccl.timeout;
    std::string text;
    run_local_ranks(
        n,
        [&](Communicator& boot) {
          const auto world = make_nccl_world(boot, nccl);
          const auto direct = bench::make_nccl_direct(*world, *nccl.timeout);
          std::string mine = job(*world, direct.get());
          if (world->rank() == 0) text = std::move(mine);
        },
        options);
    std::cout << text << std::flush;
    return 0;
#else
    throw ConfigError("local", "local: --local runs ranks as threads over a Gloo bootstrap, and "
                               "this build of commgrid has no Gloo backend");
#endif
  }
  return run_on_mpi(rt, prepare, [&](Communicator& boot, DirectCollectives*) {
    const auto world = make_nccl_world(boot, nccl);
    const auto direct = bench::make_nccl_direct(*world, *nccl.timeout);
    return job(*world, direct.get());
  });
#else
  (void)rt;
  (void)prepare;
  (void)job;
  throw ConfigError("backend",
                    "bench: this build of commgrid has no NCCL backend; install CUDA and NCCL "
                    "and rebuild with -DCOMMGRID_WITH_NCCL=ON");
#endif
}

int run_world(const RuntimeFlags& rt, const std::function<void(int world_size)>& prepare,
              const WorldJob& job) {
  check_format(rt.format);
  if (rt.direct != "blocking" && rt.direct != "nonblocking")
    throw ConfigError("direct", "direct: unknown reference \"" + rt.direct +
                                    "\" (valid: blocking, nonblocking)");
  if (rt.backend == "mpi") {
    if (!rt.local.empty())
      throw ConfigError("local", "local: --local is for --backend gloo (under MPI the launcher "
                                 "sets the number of ranks)");
    return run_on_mpi(rt, prepare, job);
  }
  if (rt.backend == "gloo") return run_on_gloo(rt, prepare, job);
  if (rt.backend == "nccl") return run_on_nccl(rt, prepare, job);
  throw ConfigError("backend", "backend: unknown backend \"" + rt.backend + "\" (valid: mpi, gloo, nccl)");
}

std::vector<CreationStrategy> parse_strategies(const std::string& text) {
  std::vector<CreationStrategy> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    const CreationStrategy s = parse_strategy(
        std::string_view(text).substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (std::find(out.begin(), out.end(), s) != out.end())
      throw InvalidValueError("strategies", "strategies: \"" + std::string(strategy_name(s)) +
                                                "\" is given twice");
    out.push_back(s);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int run_bench_init(const BenchInitFlags& f) {
  const std::vector<CreationStrategy> strategies = parse_strategies(f.strategies);
  const int repeats = static_cast<int>(parse_integer("repeats", f.repeats, 1, 1000));
  auto config = std::make_shared<ParallelConfig>();
  return run_world(
      f.rt, [&](int world_size) { *config = to_config(f.layout, world_size); },
      [&](Communicator& world, DirectCollectives*) {
        const bench::InitResult r = bench::run_init_bench(world, *config, strategies, repeats);
        return f.rt.format == "json" ? bench::init_json(r, *config).dump(2) + "\n"
                                     : bench::init_table(r, *config);
      });
}

int run_bench_collectives(const BenchCollectivesFlags& f) {
  const std::vector<std::size_t> sizes = bench::parse_sizes("sizes", f.sizes);
  const int iterations = static_cast<int>(parse_integer("iterations", f.iterations, 1, 10000000));
  return run_world(
      f.rt, [](int) {},
      [&](Communicator& world, DirectCollectives* direct) {
        const bench::CollectivesResult r =
            bench::run_collectives_bench(world, *direct, sizes, iterations);
        return f.rt.format == "json" ? bench::collectives_json(r).dump(2) + "\n"
                                     : bench::collectives_table(r);
      });
}

void add_runtime_flags(CLI::App& app, RuntimeFlags& rt) {
  app.add_option("--backend", rt.backend,
                 "mpi (default; run under mpirun), gloo, or nccl (one GPU per rank)");
  app.add_option("--local", rt.local,
                 "with --backend gloo or nccl: N ranks as threads in this process")->type_name("INT");
  app.add_option("--timeout", rt.timeout, "seconds any rank waits for the others (600)")->type_name("SECONDS");
  app.add_option("--format", rt.format, "table (default) or json");
}

}  // namespace

Command add_bench_command(CLI::App& root) {
  CLI::App* app = root.add_subcommand("bench", "measure the layout, group creation and collectives");
  app->require_subcommand(1);

  auto lo = std::make_shared<BenchLayoutOptions>();
  CLI::App* layout = app->add_subcommand(
      "layout", "enumerate every kind (vs writing as many integers) and time one-rank queries");
  layout->add_option("--worlds", lo->worlds,
                     "worlds to enumerate, e.g. 1024,16384 (default 2^10,2^14,2^17,2^20; "
                     "multiples of 128; \"none\" skips)");
  layout->add_option("--query-worlds", lo->query_worlds,
                     "worlds of the one-rank queries (default 2^10 ... 2^30; \"none\" skips)");
  layout->add_option("--repeats", lo->repeats, "timed repetitions; the fastest counts (5)")->type_name("INT");
  layout->add_option("--queries", lo->queries, "queries per kind and world (100000)")->type_name("INT");
  layout->add_option("--memory", lo->memory,
                     "warm (default: pages reused, measures the code) or cold (fresh pages "
                     "for lists and baselines alike)");
  layout->add_option("--format", lo->format, "table (default) or json");
  layout->add_option("--compat", lo->compat, "seed (default) or head: the edition laid out");
  layout->add_option("--gtp-remat", lo->gtp_remat, "HEAD's gtp_remat size (1; head only)")
      ->type_name("INT");

  auto fi = std::make_shared<BenchInitFlags>();
  CLI::App* init = app->add_subcommand(
      "init", "time ProcessGroups::initialize with each creation strategy on real ranks");
  add_layout_flags(*init, fi->layout, /*with_world_size=*/true);
  init->add_option("--strategies", fi->strategies, "split,member,per-group (default: all three)");
  init->add_option("--repeats", fi->repeats, "repetitions; the fastest counts (5)")->type_name("INT");
  add_runtime_flags(*init, fi->rt);
  init->footer("Example: mpirun --oversubscribe -np 16 commgrid bench init --tp 2 --pp 2\n"
               "         commgrid bench init --backend gloo --local 16 --tp 2 --pp 2\n"
               "         commgrid bench init --backend nccl --local 8 --tp 2 --pp 2 (8 GPUs)");

  auto fc = std::make_shared<BenchCollectivesFlags>();
  CLI::App* coll = app->add_subcommand(
      "collectives", "allreduce, allgather, pingpong, batched exchange and alltoallv through commgrid vs the backend called directly");
  coll->add_option("--sizes", fc->sizes, "bytes per rank, e.g. 1KiB,64MiB (default)");
  coll->add_option("--iterations", fc->iterations,
                   "calls of each kind per size (1000; fewer for large sizes, at least 5)")->type_name("INT");
  add_runtime_flags(*coll, fc->rt);
  coll->add_option("--direct", fc->rt.direct,
                   "MPI reference: blocking (MPI_Allreduce, default) or nonblocking "
                   "(MPI_Iallreduce + MPI_Wait, the algorithm commgrid's MPI backend uses)");
  coll->footer("Example: mpirun --oversubscribe -np 4 commgrid bench collectives\n"
               "         commgrid bench collectives --backend nccl --local 2 (2 GPUs; device "
               "buffers, raw NCCL as the reference)");

#if COMMGRID_HAS_BOOTSTRAP
  const Command store = add_bench_store_command(*app);  // bench_store.cpp
#else
  const Command store;
#endif
  return {app, [app, layout, lo, init, fi, coll, fc, store]() -> int {
            if (store.app != nullptr && store.app->parsed()) return store.run();
            if (layout->parsed()) return run_bench_layout(*lo);
            if (init->parsed()) return run_bench_init(*fi);
            if (coll->parsed()) return run_bench_collectives(*fc);
            throw ConfigError("bench", "bench: no benchmark given (layout, init, collectives)");
          }};
}

}  // namespace commgrid::cli
