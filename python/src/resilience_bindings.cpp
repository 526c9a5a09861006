// _resilience: the binding of commgrid's resilient driver (resilient_driver.hpp) for Python
// programs started by `commgrid launch --spares S`. The driver keeps its snapshots, buddy
// copies and recovery in C++ over its own Gloo world of each epoch (make_gloo_world on the
// job's store); the program's callbacks, its state provider (bytes in and out) and the
// torch groups of each epoch are Python's (commgrid/torch/resilient.py). A separate module
// from _commgrid, so that `import commgrid` (the layout core) loads no backend.
//
// Threads: run() releases the GIL; each callback takes it back for the Python call. A
// callback that raises one of the driver's failure types (a collective that failed because
// a peer died) becomes a commgrid::BackendError, which starts a recovery; a state provider
// that raises becomes the driver's StateProviderError with the Python exception's type and
// message; anything else propagates out of run() unchanged.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "commgrid/error.hpp"
#include "commgrid/gloo.hpp"
#include "commgrid/resilience_keys.hpp"
#include "commgrid/resilient_driver.hpp"
#include "commgrid/store.hpp"
#include "epoch_sockets.hpp"

namespace py = pybind11;

namespace commgrid::python {
namespace {

py::object error_class(const char* name) {
  return py::module_::import("commgrid.torch.resilient_errors").attr(name);
}

void translate_errors(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const FencedError& e) {
    PyErr_SetString(error_class("FencedError").ptr(), e.what());
  } catch (const NoSpareError& e) {
    PyErr_SetString(error_class("NoSpareError").ptr(), e.what());
  } catch (const StateLostError& e) {
    PyErr_SetString(error_class("StateLostError").ptr(), e.what());
  } catch (const StateProviderError& e) {
    PyErr_SetString(error_class("StateProviderError").ptr(), e.what());
  } catch (const RecoveryError& e) {
    PyErr_SetString(error_class("RecoveryError").ptr(), e.what());
  } catch (const BackendError& e) {
    PyErr_SetString(error_class("BackendError").ptr(), e.what());
  } catch (const ConfigError& e) {
    py::object type = py::module_::import("commgrid.errors").attr("ConfigError");
    py::object value = type(e.what());
    value.attr("parameter") = e.parameter();
    PyErr_SetObject(type.ptr(), value.ptr());
  } catch (const Error& e) { PyErr_SetString(error_class("RecoveryError").ptr(), e.what()); }
}

// "TypeName: message" of the Python exception being handled (GIL held).
std::string describe(const py::error_already_set& e) {
  std::string type = py::str(e.type().attr("__name__"));
  std::string text = py::str(e.value());
  return text.empty() ? type : type + ": " + text;
}

py::dict layout_dict(const ParallelConfig& c) {
  py::dict d;
  d["world_size"] = c.world_size;
  d["tp"] = c.tp;
  d["pp"] = c.pp;
  d["cp"] = c.cp;
  d["ep"] = c.ep;
  d["etp"] = c.etp ? py::object(py::int_(*c.etp)) : py::object(py::none());
  d["order"] = c.order;
  d["dp"] = c.dp();
  return d;
}

// The process's driver and the Python side it calls back.
class PyDriver {
 public:
  PyDriver(std::int64_t tp, std::int64_t pp, std::int64_t cp, std::int64_t ep,
           std::optional<std::int64_t> etp, const std::string& order, std::int64_t snapshot_every,
           const std::string& state_from, bool shrink, std::optional<std::int64_t> global_batch,
           std::size_t snapshot_memory_limit, py::object failure_types)
      : failure_types_(std::move(failure_types)) {
    const auto launch = read_spare_launch();
    if (!launch)
      throw ConfigError("COMMGRID_PROCESS",
                        "the resilient driver runs under `commgrid launch --spares S` "
                        "(COMMGRID_PROCESS is not set)");
    launch_ = *launch;
    ResilientOptions options;
    options.layout.world_size = launch_.world_size();
    options.layout.tp = tp;
    options.layout.pp = pp;
    options.layout.cp = cp;
    options.layout.ep = ep;
    options.layout.etp = etp;
    options.layout.order = order;
    options.snapshot_every = snapshot_every;
    options.state_from = parse_state_source(state_from);
    options.shrink = shrink;
    options.global_batch = global_batch;
    options.snapshot_memory_limit = snapshot_memory_limit;
    // The driver's own C++ groups: the world moves buddy copies and reshards, the dp groups
    // a spare's state from a replica. The program's groups are torch's (resilient.py), so
    // no other kind is made here. The driver's thread alone drives them, so a dp group of
    // every rank is the world itself (share_identical_groups).
    options.init.kinds = {GroupKind::dp};
    options.init.share_identical_groups = true;
    options.factory = [this](const std::string& prefix, Rank rank, Rank size) {
      Recovery& rec = driver_->recovery();
      GlooOptions o;
      o.store = rec.store();
      o.rank = rank;
      o.size = size;
      o.prefix = prefix;
      o.timeout = rec.options().timeout;
      o.token = effective_token(*rec.store(), launch_.token);
      return make_gloo_world(o);
    };
    driver_ = make_resilient_driver(launch_, std::move(options));
  }

  // Runs the steps; see ResilientDriver::run. The GIL is released while C++ runs.
  std::optional<Rank> run(std::int64_t steps, py::object save, py::object load,
                          py::object start_epoch, py::object stop_epoch, py::object step,
                          py::object begin_step, py::object recovered) {
    Provider provider(std::move(save), std::move(load));
    ResilientCallbacks cb;
    cb.start_epoch = [&](const EpochContext& ctx) {
      call([&] {
        py::dict d = layout_dict(ctx.layout);
        d["epoch"] = ctx.epoch;
        d["rank"] = ctx.rank;
        d["torch_store_key"] =
            epoch_torch_store_key(driver_->recovery().options().prefix, ctx.epoch);
        start_epoch(d);
      });
    };
    if (!stop_epoch.is_none()) cb.stop_epoch = [&] { call([&] { stop_epoch(); }); };
    cb.step = [&](std::int64_t s) { call([&] { step(s); }); };
    if (!begin_step.is_none())
      cb.begin_step = [&](std::int64_t s) { call([&] { begin_step(s); }); };
    if (!recovered.is_none())
      cb.recovered = [&](const EpochRecord& r) {
        call([&] {
          py::dict d;
          d["epoch"] = r.epoch;
          d["resumed_at"] = r.resumed_at;
          d["dead"] = r.dead;
          d["shrink"] = r.shrink;
          d["layout"] = layout_dict(r.layout);
          d["agreement_s"] = r.agreement.count();
          d["groups_s"] = r.groups.count();
          d["model_s"] = r.model.count();
          d["state_s"] = r.state.count();
          d["cpu_s"] = r.cpu.count();
          recovered(d);
        });
      };
    py::gil_scoped_release release;
    return driver_->run(steps, provider, cb);
  }

  // Sets `key` in the job's store (the torch store's address of an epoch, say).
  void store_set(const std::string& key, const py::bytes& value) {
    std::string v = value;
    py::gil_scoped_release release;
    driver_->recovery().store()->set(key, std::span<const char>(v.data(), v.size()));
  }

  // The value of `key` once it is set; None when the current epoch fails first or
  // `timeout_s` passes (so a wait for a peer that died ends with the epoch).
  std::optional<py::bytes> store_wait(const std::string& key, double timeout_s) {
    std::optional<std::vector<char>> got;
    {
      py::gil_scoped_release release;
      Recovery& rec = driver_->recovery();
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
      const std::vector<std::string> keys{key};
      while (std::chrono::steady_clock::now() < until) {
        if (rec.store()->wait_for(keys, std::chrono::milliseconds(200)).empty()) {
          got = rec.store()->get(key);
          break;
        }
        if (rec.failed()) break;
      }
    }
    if (!got) return std::nullopt;
    return py::bytes(got->data(), got->size());
  }

  [[nodiscard]] std::string store_address() const {
    return driver_->recovery().store()->local_address();
  }
  [[nodiscard]] std::string store_uri() const { return driver_->recovery().store()->uri(); }
  [[nodiscard]] double timeout_s() const {
    return std::chrono::duration<double>(driver_->recovery().options().timeout).count();
  }
  [[nodiscard]] const SpareLaunch& launch() const { return launch_; }
  [[nodiscard]] ResilientDriver& driver() { return *driver_; }

 private:
  // The state provider: Python callables, bytes in and out.
  class Provider : public StateProvider {
   public:
    Provider(py::object save, py::object load) : save_(std::move(save)), load_(std::move(load)) {}
    ~Provider() override {
      py::gil_scoped_acquire gil;
      save_ = py::object();
      load_ = py::object();
    }
    StateBytes save() override {
      py::gil_scoped_acquire gil;
      try {
        py::object out = save_();
        std::string_view bytes;
        if (py::isinstance<py::bytes>(out)) {
          char* data = nullptr;
          Py_ssize_t size = 0;
          PyBytes_AsStringAndSize(out.ptr(), &data, &size);
          bytes = std::string_view(data, static_cast<std::size_t>(size));
        } else {
          throw std::runtime_error("TypeError: the state provider's save returned " +
                                   std::string(py::str(py::type::of(out).attr("__name__"))) +
                                   ", not bytes");
        }
        StateBytes state(bytes.size());
        if (!state.empty()) std::memcpy(state.data(), bytes.data(), bytes.size());
        return state;
      } catch (py::error_already_set& e) { throw std::runtime_error(describe(e)); }
    }
    void load(std::span<const std::byte> state) override {
      py::gil_scoped_acquire gil;
      try {
        load_(py::bytes(reinterpret_cast<const char*>(state.data()), state.size()));
      } catch (py::error_already_set& e) { throw std::runtime_error(describe(e)); }
    }

   private:
    py::object save_, load_;
  };

  // Calls Python with the GIL: a failure type becomes BackendError (a recovery).
  template <class F>
  void call(F&& f) {
    py::gil_scoped_acquire gil;
    try {
      f();
    } catch (py::error_already_set& e) {
      if (!failure_types_.is_none() && e.matches(failure_types_)) throw BackendError(describe(e));
      throw;
    }
  }

  SpareLaunch launch_;
  py::object failure_types_;
  std::unique_ptr<ResilientDriver> driver_;
};

}  // namespace
}  // namespace commgrid::python

PYBIND11_MODULE(_resilience, m) {
  using namespace commgrid::python;
  using commgrid::Rank;
  m.doc() = "commgrid's resilient driver (binding only; use commgrid.torch.ResilientDriver)";
  py::register_exception_translator(&translate_errors);

  py::class_<PyDriver>(m, "Driver")
      .def(py::init<std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                    std::optional<std::int64_t>, const std::string&, std::int64_t,
                    const std::string&, bool, std::optional<std::int64_t>, std::size_t,
                    py::object>(),
           py::arg("tp") = 1, py::arg("pp") = 1, py::arg("cp") = 1, py::arg("ep") = 1,
           py::arg("etp") = py::none(), py::arg("order") = std::string(commgrid::kDefaultOrder),
           py::arg("snapshot_every") = 1, py::arg("state_from") = "auto", py::arg("shrink") = true,
           py::arg("global_batch") = py::none(), py::arg("snapshot_memory_limit") = 0,
           py::arg("failure_types") = py::none())
      .def("run", &PyDriver::run, py::arg("steps"), py::arg("save"), py::arg("load"),
           py::arg("start_epoch"), py::arg("stop_epoch") = py::none(), py::arg("step"),
           py::arg("begin_step") = py::none(), py::arg("recovered") = py::none())
      .def("store_set", &PyDriver::store_set, py::arg("key"), py::arg("value"))
      .def("store_wait", &PyDriver::store_wait, py::arg("key"), py::arg("timeout_s"))
      .def("store_address", &PyDriver::store_address)
      .def_property_readonly("store_uri", &PyDriver::store_uri)
      .def_property_readonly("timeout_s", &PyDriver::timeout_s)
      .def_property_readonly("process", [](const PyDriver& d) { return d.launch().process; })
      .def_property_readonly("incarnation",
                             [](const PyDriver& d) { return d.launch().incarnation; })
      .def_property_readonly("num_processes",
                             [](const PyDriver& d) { return d.launch().num_processes; })
      .def_property_readonly("spares", [](const PyDriver& d) { return d.launch().spares; })
      .def_property_readonly("world_size",
                             [](const PyDriver& d) { return d.launch().world_size(); })
      .def_property_readonly("epoch", [](PyDriver& d) { return d.driver().recovery().epoch(); })
      .def_property_readonly(
          "logical_rank",
          [](PyDriver& d) -> std::optional<Rank> { return d.driver().recovery().logical_rank(); })
      .def_property_readonly("state_source", [](PyDriver& d) {
        return std::string(commgrid::state_source_name(d.driver().source()));
      });
  // epoch_sockets.hpp: launch's SIGURG for a failed epoch ends its torch collectives.
  m.def("arm_epoch_sockets", &arm_epoch_sockets, py::arg("epoch"), py::arg("fds"));
  m.def("disarm_epoch_sockets", &disarm_epoch_sockets);
  m.def("end_epoch_sockets", &end_epoch_sockets);
  m.def("epoch_sockets_ended", &epoch_sockets_ended);
  m.attr("EPOCH_FAILURE_SIGNAL") = commgrid::kEpochFailureSignal;
}
