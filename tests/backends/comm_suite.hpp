// Backend-neutral checks of what model code needs from a Communicator: nonblocking and
// batched point to point, variable and rooted collectives, avg, every element type, typed
// buffers, the member/global rank mapping, and the argument errors of the contract (the
// same typed error for the same mistake on every backend). Each function is called on
// every rank of a real job (Gloo rank-threads, MPI processes, NCCL rank-threads on GPUs)
// and throws CheckFailed on the first wrong value, so a failure names the rank, the
// operation and the values.
#pragma once

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "commgrid/commgrid.hpp"

namespace commgrid::suite {

struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void check(bool ok, const Communicator& c, const std::string& what) {
  if (!ok)
    throw CheckFailed(std::string(c.backend()) + " " + c.name() + " rank " +
                      std::to_string(c.rank()) + ": " + what);
}

/// A value every rank can compute for message m, element k.
inline double payload(std::size_t m, std::size_t k) {
  return static_cast<double>(m) * 1000.0 + static_cast<double>(k) + 0.25;
}

/// Each rank exchanges with rank^1 (both post a send and a receive in one batch), then
/// shifts a ring both ways; with two ranks the next and previous rank are the same peer.
inline void symmetric_and_ring(Communicator& c) {
  const Rank n = c.size(), me = c.rank();
  if (n < 2) return;
  const Rank partner = me ^ 1;
  if (partner < n) {
    std::vector<double> out(17, static_cast<double>(me)), in(17, -1);
    const P2POp ops[] = {P2POp::send(std::span<double>(out), partner, 3),
                         P2POp::recv(std::span<double>(in), partner, 3)};
    c.batch_isend_irecv(ops)->wait();
    check(std::all_of(in.begin(), in.end(), [&](double v) { return v == partner; }), c,
          "symmetric exchange with rank " + std::to_string(partner) + " got wrong data");
  }
  const Rank next = (me + 1) % n, prev = (me + n - 1) % n;
  std::int64_t to_next = me, to_prev = 100 + me, from_prev = -1, from_next = -1;
  const P2POp ring[] = {P2POp::send(&to_next, 1, DataType::int64, next, 1),
                        P2POp::send(&to_prev, 1, DataType::int64, prev, 2),
                        P2POp::recv(&from_prev, 1, DataType::int64, prev, 1),
                        P2POp::recv(&from_next, 1, DataType::int64, next, 2)};
  c.batch_isend_irecv(ring)->wait();
  check(from_prev == prev && from_next == 100 + next, c,
        "ring shift: from prev " + std::to_string(from_prev) + ", from next " +
            std::to_string(from_next));
  // isend/irecv on their own, and the typed blocking forms in a safe order.
  std::vector<float> a(5, static_cast<float>(me)), b(5, -1.f);
  auto s = c.isend(std::span<float>(a), next, 9);
  auto r = c.irecv(std::span<float>(b), prev, 9);
  r->wait();
  s->wait();
  check(b[4] == static_cast<float>(prev) && s->done() && r->done(), c, "isend/irecv ring");
}

/// `batches` random batches: every rank draws the same list of messages (sender, receiver,
/// size 0..40 incl. empty, tag 0..2, self-messages included) and posts its part in its own
/// random order, keeping the order of messages that share sender, receiver and tag (the
/// order in which they match).
inline void random_batches(Communicator& c, int batches, std::uint64_t seed) {
  const Rank n = c.size(), me = c.rank();
  std::mt19937_64 shared(seed), own(seed * 7919 + static_cast<std::uint64_t>(me) + 1);
  for (int b = 0; b < batches; ++b) {
    const int messages = static_cast<int>(shared() % 24);
    struct Msg {
      int from, to, tag;
      std::size_t size;
    };
    std::vector<Msg> list;
    for (int m = 0; m < messages; ++m) {
      const std::size_t size = shared() % 4 == 0 ? 0 : shared() % 41;
      list.push_back({static_cast<int>(shared() % static_cast<unsigned>(n)),
                      static_cast<int>(shared() % static_cast<unsigned>(n)),
                      static_cast<int>(shared() % 3), size});
    }
    std::vector<std::vector<double>> bufs(list.size());
    std::vector<std::pair<std::size_t, bool>> mine;  // (message, is_send)
    for (std::size_t m = 0; m < list.size(); ++m) {
      if (list[m].from == me) mine.emplace_back(m, true);
      if (list[m].to == me) mine.emplace_back(m, false);
    }
    std::shuffle(mine.begin(), mine.end(), own);
    // Restore the matching order within each (from, to, tag, direction) class.
    std::map<std::tuple<int, int, int, bool>, std::vector<std::size_t>> slots;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const Msg& msg = list[mine[i].first];
      slots[{msg.from, msg.to, msg.tag, mine[i].second}].push_back(i);
    }
    std::vector<std::pair<std::size_t, bool>> ordered(mine.size());
    for (auto& [key, positions] : slots) {
      std::vector<std::pair<std::size_t, bool>> items;
      for (std::size_t p : positions) items.push_back(mine[p]);
      std::sort(items.begin(), items.end());
      for (std::size_t k = 0; k < positions.size(); ++k) ordered[positions[k]] = items[k];
    }
    std::vector<P2POp> ops;
    std::vector<std::vector<double>> sends(list.size());
    for (const auto& [m, is_send] : ordered) {
      const Msg& msg = list[m];
      if (is_send) {
        sends[m].resize(msg.size);
        for (std::size_t k = 0; k < msg.size; ++k) sends[m][k] = payload(m, k);
        ops.push_back(P2POp::send(std::span<double>(sends[m]), msg.to, msg.tag));
      } else {
        bufs[m].assign(msg.size, -1.0);
        ops.push_back(P2POp::recv(std::span<double>(bufs[m]), msg.from, msg.tag));
      }
    }
    c.batch_isend_irecv(ops)->wait();
    for (std::size_t m = 0; m < list.size(); ++m) {
      if (list[m].to != me) continue;
      for (std::size_t k = 0; k < list[m].size; ++k)
        check(bufs[m][k] == payload(m, k), c,
              "batch " + std::to_string(b) + " message " + std::to_string(m) + " from rank " +
                  std::to_string(list[m].from) + " element " + std::to_string(k) + " is " +
                  std::to_string(bufs[m][k]));
    }
  }
}

/// Rank 0 waits for a message rank 1 never sends: TimeoutError within about the timeout,
/// naming the peer. Rank 1 stays alive past the timeout (so that rank 0 sees a timeout,
/// not a closed connection). A timeout may leave the communicator unusable (Gloo closes
/// the pair), so nothing runs on it afterwards.
inline void receive_times_out(Communicator& c, std::chrono::milliseconds timeout) {
  if (c.size() < 2) return;
  const auto saved = c.timeout();
  if (c.rank() == 0) {
    c.set_timeout(timeout);
    double x = 0;
    auto work = c.irecv(&x, 1, DataType::float64, 1, 77);
    const auto start = std::chrono::steady_clock::now();
    std::string message;
    try {
      work->wait();
    } catch (const TimeoutError& e) { message = e.what(); }
    const auto took = std::chrono::steady_clock::now() - start;
    c.set_timeout(saved);
    check(!message.empty(), c, "a receive nobody sends to did not time out");
    check(message.find("rank 1 (global " + std::to_string(c.global_rank(1)) + ")") !=
              std::string::npos,
          c, "timeout message does not name the peer: " + message);
    // Rank 1 stays for timeout + 5 s: the bound, with room for a loaded machine.
    check(took < timeout + std::chrono::seconds(5), c, "timeout took too long");
  } else if (c.rank() == 1) {
    std::this_thread::sleep_for(timeout + std::chrono::seconds(5));
  }
}

/// alltoallv with counts from a shared seed: zeros, and one pair carrying 3000 elements.
inline void alltoallv_random(Communicator& c, std::uint64_t seed) {
  const Rank n = c.size(), me = c.rank();
  std::mt19937_64 rng(seed);
  std::vector<std::vector<std::size_t>> count(
      static_cast<std::size_t>(n), std::vector<std::size_t>(static_cast<std::size_t>(n)));
  for (auto& row : count)
    for (auto& x : row) x = rng() % 3 == 0 ? 0 : rng() % 9;
  count[0][static_cast<std::size_t>(n - 1)] = 3000;
  auto value = [](int from, int to, std::size_t k) {
    return static_cast<std::int64_t>(from * 1000003 + to * 1009 + static_cast<int>(k));
  };
  const auto row = count[static_cast<std::size_t>(me)];
  std::vector<std::size_t> recv_counts;
  for (int i = 0; i < n; ++i)
    recv_counts.push_back(count[static_cast<std::size_t>(i)][static_cast<std::size_t>(me)]);
  std::vector<std::int64_t> send,
      recv(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}), -1);
  for (int j = 0; j < n; ++j)
    for (std::size_t k = 0; k < row[static_cast<std::size_t>(j)]; ++k)
      send.push_back(value(me, j, k));
  c.alltoallv(std::span<const std::int64_t>(send), row, std::span<std::int64_t>(recv), recv_counts)
      ->wait();
  std::size_t at = 0;
  for (int i = 0; i < n; ++i)
    for (std::size_t k = 0; k < recv_counts[static_cast<std::size_t>(i)]; ++k, ++at)
      check(recv[at] == value(i, me, k), c,
            "alltoallv block from rank " + std::to_string(i) + " element " + std::to_string(k));
}

/// allgatherv with per-rank counts (zeros included).
inline void allgatherv_random(Communicator& c, std::uint64_t seed) {
  const Rank n = c.size(), me = c.rank();
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (auto& x : counts) x = rng() % 3 == 0 ? 0 : rng() % 7;
  std::vector<float> send(counts[static_cast<std::size_t>(me)]);
  for (std::size_t k = 0; k < send.size(); ++k)
    send[k] = static_cast<float>(me * 100 + static_cast<int>(k));
  std::vector<float> recv(std::accumulate(counts.begin(), counts.end(), std::size_t{0}), -1.f);
  c.allgatherv(std::span<const float>(send), std::span<float>(recv), counts)->wait();
  std::size_t at = 0;
  for (int i = 0; i < n; ++i)
    for (std::size_t k = 0; k < counts[static_cast<std::size_t>(i)]; ++k, ++at)
      check(recv[at] == static_cast<float>(i * 100 + static_cast<int>(k)), c,
            "allgatherv block of rank " + std::to_string(i));
}

/// Rank r's value for element k: small integers, exact in every type (int8 and float16
/// included) and in sums over 16 ranks.
inline double small(int r, std::size_t k) {
  return static_cast<double>((r * 3 + static_cast<int>(k)) % 5 + 1);
}

template <class T>
T make(double v) {
  if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
    return T(static_cast<float>(v));
  else return static_cast<T>(v);
}
template <class T>
double read(T v) {
  if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
    return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}

/// reduce, gather and scatter to every root; allreduce sum, max and avg; all of type T.
template <class T>
void rooted_and_avg_typed(Communicator& c) {
  const Rank n = c.size(), me = c.rank();
  const std::size_t count = 6;
  const std::string type(datatype_name(datatype_of<T>));
  std::vector<T> mine(count);
  for (std::size_t k = 0; k < count; ++k) mine[k] = make<T>(small(me, k));
  auto sum_of = [&](std::size_t k) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += small(r, k);
    return s;
  };
  for (int root = 0; root < n; ++root) {
    std::vector<T> out(me == root ? count : 0);
    c.reduce(std::span<const T>(mine), std::span<T>(out), ReduceOp::sum, root)->wait();
    if (me == root)
      for (std::size_t k = 0; k < count; ++k)
        check(read(out[k]) == sum_of(k), c, type + " reduce to root " + std::to_string(root));
    std::vector<T> all(me == root ? count * static_cast<std::size_t>(n) : 0);
    c.gather(std::span<const T>(mine), std::span<T>(all), root)->wait();
    if (me == root)
      for (int r = 0; r < n; ++r)
        for (std::size_t k = 0; k < count; ++k)
          check(read(all[static_cast<std::size_t>(r) * count + k]) == small(r, k), c,
                type + " gather to root " + std::to_string(root));
    std::vector<T> blocks;
    if (me == root)
      for (int r = 0; r < n; ++r)
        for (std::size_t k = 0; k < count; ++k) blocks.push_back(make<T>(small(r + root, k)));
    std::vector<T> part(count);
    c.scatter(std::span<const T>(blocks), std::span<T>(part), root)->wait();
    for (std::size_t k = 0; k < count; ++k)
      check(read(part[k]) == small(me + root, k), c,
            type + " scatter from root " + std::to_string(root));
  }
  std::vector<T> buf = mine;
  c.allreduce(std::span<T>(buf), ReduceOp::sum)->wait();
  for (std::size_t k = 0; k < count; ++k)
    check(read(buf[k]) == sum_of(k), c, type + " allreduce sum");
  buf = mine;
  c.allreduce(std::span<T>(buf), ReduceOp::max)->wait();
  for (std::size_t k = 0; k < count; ++k) {
    double mx = 0;
    for (int r = 0; r < n; ++r) mx = std::max(mx, small(r, k));
    check(read(buf[k]) == mx, c, type + " allreduce max");
  }
  // avg: the sum divided by the group size; integers truncate. Compare with the same
  // computation in the element type.
  buf = mine;
  c.allreduce(std::span<T>(buf), ReduceOp::avg)->wait();
  for (std::size_t k = 0; k < count; ++k) {
    double expected = sum_of(k) / n;
    if constexpr (std::is_integral_v<T>)
      expected = static_cast<double>(static_cast<std::int64_t>(sum_of(k)) / n);
    if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16> ||
                  std::is_same_v<T, float>)
      expected =
          read(make<T>(static_cast<double>(static_cast<float>(sum_of(k)) / static_cast<float>(n))));
    check(read(buf[k]) == expected, c,
          type + " allreduce avg: got " + std::to_string(read(buf[k])) + ", expected " +
              std::to_string(expected));
  }
  // reduce_scatter with avg: block rank() of the averaged sum.
  std::vector<T> whole(count * static_cast<std::size_t>(n)), block(count);
  for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = make<T>(small(me, i));
  c.reduce_scatter(std::span<const T>(whole), std::span<T>(block), ReduceOp::sum)->wait();
  for (std::size_t k = 0; k < count; ++k) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += small(r, static_cast<std::size_t>(me) * count + k);
    check(read(block[k]) == s, c, type + " reduce_scatter sum");
  }
}

inline void every_type(Communicator& c) {
  rooted_and_avg_typed<float>(c);
  rooted_and_avg_typed<double>(c);
  rooted_and_avg_typed<std::int32_t>(c);
  rooted_and_avg_typed<std::int64_t>(c);
  rooted_and_avg_typed<std::int8_t>(c);
  rooted_and_avg_typed<std::uint8_t>(c);
  rooted_and_avg_typed<bfloat16>(c);
  rooted_and_avg_typed<float16>(c);
}

/// Typed buffers of the wrong size are InvalidValueError before any communication, so a
/// single rank can make the mistake without the others taking part.
inline void typed_size_errors(Communicator& c) {
  std::vector<double> small_buf(1), big(5 * static_cast<std::size_t>(c.size()) + 1);
  std::vector<double> three(3);
  auto throws = [&](auto&& fn, const char* what) {
    bool thrown = false;
    try {
      fn();
    } catch (const InvalidValueError& e) {
      thrown = std::string(e.what()).find(c.name()) != std::string::npos;
    }
    check(thrown, c, std::string(what) + " with a wrong size did not throw InvalidValueError");
  };
  throws([&] { (void)c.allgather(std::span<const double>(three), std::span<double>(small_buf)); },
         "allgather");
  throws(
      [&] {
        (void)c.reduce_scatter(std::span<const double>(three), std::span<double>(big),
                               ReduceOp::sum);
      },
      "reduce_scatter");
  throws(
      [&] {
        (void)c.allreduce(std::span<const double>(three), std::span<double>(small_buf),
                          ReduceOp::sum);
      },
      "allreduce");
  const std::vector<std::size_t> wrong_counts(static_cast<std::size_t>(c.size()), 1);
  throws(
      [&] {
        (void)c.alltoallv(std::span<const double>(three), wrong_counts, std::span<double>(big),
                          wrong_counts);
      },
      "alltoallv");
  if (c.size() > 1)
    throws(
        [&] { (void)c.gather(std::span<const double>(three), std::span<double>(three), c.rank()); },
        "gather");
}

/// Runs fn, which must throw E with parameter() == param and a message that starts with
/// "<backend> <op> on <group>"; a CheckFailed names what was expected and what came.
template <class E, class F>
void expect_error(const Communicator& c, const std::string& what, const char* op, const char* param,
                  F&& fn) {
  std::string got = "no error";
  bool ok = false;
  try {
    (void)fn();
  } catch (const E& e) {
    const std::string msg = e.what();
    got = std::string("parameter ") + e.parameter() + ": " + msg;
    ok = e.parameter() == param &&
         msg.rfind(std::string(c.backend()) + " " + op + " on " + c.name(), 0) == 0;
  } catch (const std::exception& e) { got = std::string("another error type: ") + e.what(); }
  check(ok, c, what + ": expected the contract's error (parameter " + param + "), got " + got);
}

/// Every argument mistake of the Communicator contract raises the same typed error, with the
/// same parameter() and a message "<backend> <op> on <group>: ...", on every backend, before
/// any communication: each rank makes the mistakes on its own, and the communicator still
/// works afterwards (an allreduce at the end). Refused creations are not counted.
inline void argument_errors(Communicator& c) {
  const Rank n = c.size(), me = c.rank();
  const std::int64_t calls = c.creation_calls();
  std::vector<std::int64_t> buf(4 * static_cast<std::size_t>(n) + 8, 1);
  std::int64_t* p = buf.data();
  const DataType i64 = DataType::int64;
  using Config = ConfigError;
  using Range = RankOutOfRangeError;
  using Value = InvalidValueError;
  // Null buffers with a count > 0.
  expect_error<Config>(c, "null broadcast buffer", "broadcast", "buf",
                       [&] { return c.broadcast(nullptr, 1, i64, 0); });
  expect_error<Config>(c, "null allreduce send", "allreduce", "send",
                       [&] { return c.allreduce(nullptr, p, 1, i64, ReduceOp::sum); });
  expect_error<Config>(c, "null allgather recv", "allgather", "recv",
                       [&] { return c.allgather(p, nullptr, 1, i64); });
  expect_error<Config>(c, "null isend buffer", "isend", "buf",
                       [&] { return c.isend(nullptr, 2, i64, 0, 0); });
  // Roots and peers out of range.
  expect_error<Range>(c, "broadcast root -1", "broadcast", "root",
                      [&] { return c.broadcast(p, 1, i64, -1); });
  expect_error<Range>(c, "reduce root = size", "reduce", "root",
                      [&] { return c.reduce(p, p, 1, i64, ReduceOp::sum, n); });
  expect_error<Range>(c, "gather root = size", "gather", "root",
                      [&] { return c.gather(p, p + 1, 1, i64, n); });
  expect_error<Range>(c, "scatter root = size", "scatter", "root",
                      [&] { return c.scatter(p, p + 1, 1, i64, n); });
  expect_error<Range>(c, "send to rank size", "send", "peer",
                      [&] { return c.send(p, 1, i64, n, 0); });
  expect_error<Range>(c, "irecv from -1", "irecv", "peer",
                      [&] { return c.irecv(p, 1, i64, -1, 0); });
  // Ranks are 64-bit on every backend: one that an int would wrap to a member (2^32 + 0)
  // is out of range, never that member.
  const Rank wraps = (Rank{1} << 32) + me;
  expect_error<Range>(c, "broadcast root 2^32", "broadcast", "root",
                      [&] { return c.broadcast(p, 1, i64, wraps); });
  expect_error<Range>(c, "isend to 2^32", "isend", "peer",
                      [&] { return c.isend(p, 1, i64, wraps, 0); });
  const std::vector<Rank> wrapped = {wraps};
  expect_error<Range>(c, "create_group of 2^32", "create_group", "members",
                      [&] { return c.create_group(wrapped, "bad#0"); });
  // Tags.
  expect_error<Value>(c, "isend tag -1", "isend", "tag",
                      [&] { return c.isend(p, 1, i64, me, -1); });
  const P2POp bad_tag[] = {P2POp::recv(p, 1, i64, me, 0), P2POp::send(p + 1, 1, i64, me, -5)};
  expect_error<Value>(c, "batch tag -5", "batch_isend_irecv", "tag",
                      [&] { return c.batch_isend_irecv(bad_tag); });
  if (c.max_tag() < INT_MAX)
    expect_error<Value>(c, "tag above max_tag()", "isend", "tag",
                        [&] { return c.isend(p, 1, i64, me, c.max_tag() + 1); });
  // Counts lists and counts.
  const std::vector<std::size_t> short_counts(static_cast<std::size_t>(n) + 1, 0);
  const std::vector<std::size_t> ones(static_cast<std::size_t>(n), 1);
  expect_error<Value>(c, "alltoallv send_counts of size+1", "alltoallv", "send_counts",
                      [&] { return c.alltoallv(p, short_counts, p + n + 1, ones, i64); });
  expect_error<Value>(c, "allgatherv recv_counts of size+1", "allgatherv", "recv_counts",
                      [&] { return c.allgatherv(p, 0, p + 1, short_counts, i64); });
  expect_error<Value>(c, "allgatherv count != recv_counts[rank]", "allgatherv", "count",
                      [&] { return c.allgatherv(p, 2, p + 2, ones, i64); });
  std::vector<std::size_t> self_more = ones;
  self_more[static_cast<std::size_t>(me)] = 2;
  expect_error<Value>(c, "alltoallv self block 2 vs 1", "alltoallv", "recv_counts",
                      [&] { return c.alltoallv(p, self_more, p + 2 * n + 2, ones, i64); });
  if (c.max_count() < SIZE_MAX)
    expect_error<Value>(c, "count above max_count()", "allreduce", "count",
                        [&] { return c.allreduce(p, p, c.max_count() + 1, i64, ReduceOp::sum); });
  // Types and ops outside the enumerations.
  expect_error<Value>(c, "DataType 99", "allreduce", "type", [&] {
    return c.allreduce(p, p, 1, static_cast<DataType>(99), ReduceOp::sum);
  });
  expect_error<Value>(c, "ReduceOp 99", "reduce_scatter", "op", [&] {
    return c.reduce_scatter(p, p + n, 1, i64, static_cast<ReduceOp>(99));
  });
  // Overlapping buffers where the operation does not allow it.
  expect_error<Config>(c, "allgather in place", "allgather", "recv",
                       [&] { return c.allgather(p, p, 1, i64); });
  expect_error<Config>(c, "alltoall in place", "alltoall", "recv",
                       [&] { return c.alltoall(p, p, 1, i64); });
  expect_error<Config>(c, "allreduce, recv one element into send", "allreduce", "recv",
                       [&] { return c.allreduce(p, p + 1, 2, i64, ReduceOp::sum); });
  expect_error<Config>(c, "reduce_scatter overlapping", "reduce_scatter", "recv",
                       [&] { return c.reduce_scatter(p, p + n - 1, 1, i64, ReduceOp::sum); });
  const P2POp two_into_one[] = {P2POp::recv(p, 2, i64, me, 0), P2POp::recv(p + 1, 2, i64, me, 1)};
  expect_error<Config>(c, "two receives into one buffer", "batch_isend_irecv", "buf",
                       [&] { return c.batch_isend_irecv(two_into_one); });
  const P2POp send_into_recv[] = {P2POp::send(p, 3, i64, me, 0), P2POp::recv(p + 2, 3, i64, me, 0)};
  expect_error<Config>(c, "a receive over a send's buffer", "batch_isend_irecv", "buf",
                       [&] { return c.batch_isend_irecv(send_into_recv); });
  // Blocking point to point with this rank itself could only hang.
  expect_error<Config>(c, "blocking send to itself", "send", "peer",
                       [&] { return c.send(p, 1, i64, me, 0); });
  expect_error<Config>(c, "blocking recv from itself", "recv", "peer",
                       [&] { return c.recv(p, 1, i64, me, 0); });
  // Creation arguments.
  expect_error<Value>(c, "split color -1", "split", "color",
                      [&] { return c.split(std::int64_t{-1}, 0, "bad#0"); });
  expect_error<Value>(c, "split key 2^40", "split", "key",
                      [&] { return c.split(std::int64_t{0}, std::int64_t{1} << 40, "bad#0"); });
  const std::vector<Rank> none, outside = {me, n}, backwards = {n - 1, 0};
  expect_error<Config>(c, "create_group of nobody", "create_group", "members",
                       [&] { return c.create_group(none, "bad#0"); });
  expect_error<Range>(c, "create_group with rank size", "create_group", "members",
                      [&] { return c.create_group(outside, "bad#0"); });
  if (n > 1) {
    expect_error<Config>(c, "create_group_collective backwards", "create_group_collective",
                         "members", [&] { return c.create_group_collective(backwards, "bad#0"); });
    const std::vector<Rank> others = {(me + 1) % n};
    expect_error<Config>(c, "create_group without this rank", "create_group", "members",
                         [&] { return c.create_group(others, "bad#0"); });
  }
  check(c.creation_calls() == calls, c, "refused creations were counted as backend calls");
  expect_error<Value>(c, "set_timeout(0)", "set_timeout", "timeout", [&] {
    c.set_timeout(std::chrono::milliseconds(0));
    return 0;
  });
  // Nothing above reached the backend: the communicator works as before.
  std::int64_t one = 1;
  c.allreduce(&one, &one, 1, i64, ReduceOp::sum)->wait();
  check(one == n, c, "allreduce after the refused calls gave " + std::to_string(one));
}

/// The world's members are 0..W-1 and its ranks map both ways.
inline void world_members(Communicator& world) {
  const auto& m = world.members();
  check(static_cast<Rank>(m.size()) == world.size(), world, "world members size");
  for (Rank r = 0; r < world.size(); ++r) {
    check(m[static_cast<std::size_t>(r)] == r, world, "world member " + std::to_string(r));
    check(world.group_rank(world.global_rank(r)) == r, world, "world rank mapping");
  }
}

/// Every created kind of a layout: the communicator's members are the layout group's
/// members sorted, its global rank of rank() is this rank, and a non-member is refused.
inline void members_match_layout(Communicator& world, const ParallelConfig& config) {
  ProcessGroups pg;
  pg.initialize(world, config);
  for (GroupKind k : pg.kinds()) {
    if (!pg.has_group(k)) continue;
    const Communicator& g = pg.group(k);
    std::vector<std::int64_t> expected(pg.global_ranks(k).begin(), pg.global_ranks(k).end());
    std::sort(expected.begin(), expected.end());
    check(g.members() == expected, world,
          std::string(kind_name(k)) + " members differ from the layout");
    check(g.global_rank(g.rank()) == world.rank(), world,
          std::string(kind_name(k)) + " global_rank(rank())");
    check(g.group_rank(world.rank()) == g.rank(), world,
          std::string(kind_name(k)) + " group_rank(world rank)");
    // The pipeline getters give global ranks; group_rank maps them for send/recv.
    if (k == GroupKind::pp)
      check(g.group_rank(pg.pipeline_next_rank()) == (g.rank() + 1) % g.size(), world,
            "pp next rank");
    if (g.size() < world.size()) {
      std::int64_t outsider = 0;
      while (std::find(expected.begin(), expected.end(), outsider) != expected.end()) ++outsider;
      bool refused = false;
      try {
        (void)g.group_rank(outsider);
      } catch (const RankOutOfRangeError&) { refused = true; }
      check(refused, world, std::string(kind_name(k)) + " group_rank of a non-member");
    }
  }
}

}  // namespace commgrid::suite
