#include "bench/bench_gloo.hpp"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <string>
#include <vector>

#include "command.hpp"
#include "commgrid/error.hpp"

namespace commgrid::bench {

class GlooDirectHub {
 public:
  ::gloo::rendezvous::HashStore store;  // thread-safe; the direct contexts meet here
};

namespace {

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
      throw BackendError(std::string("bench: direct gloo ") + op + ": " + cli::one_line(e.what()));
    }
  }
  ::gloo::rendezvous::Store& store_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<::gloo::Context> ctx_;
  int tag_ = 0;
};

}  // namespace

std::shared_ptr<GlooDirectHub> make_gloo_direct_hub() { return std::make_shared<GlooDirectHub>(); }

std::unique_ptr<DirectCollectives> make_gloo_direct(GlooDirectHub& hub, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  return std::make_unique<GlooDirect>(hub.store, rank, size, timeout);
}

}  // namespace commgrid::bench
