// The world from the environment a launcher sets, as torchrun's RANK/WORLD_SIZE.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "commgrid/gloo.hpp"
#include "commgrid/launch_info.hpp"
#include "commgrid/store.hpp"

namespace commgrid {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string require(const char* name) {
  auto v = env(name);
  if (!v)
    throw ConfigError(name, std::string(name) +
                                " is not set (commgrid launch sets COMMGRID_RANK, "
                                "COMMGRID_WORLD_SIZE and COMMGRID_STORE)");
  if (v->empty()) throw ConfigError(name, std::string(name) + " is empty");
  return *v;
}

int parse_int(const char* name, const std::string& text, int min) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    throw InvalidValueError(name, std::string(name) + "='" + text +
                                      "' is not a whole decimal number");
  if (value < min)
    throw InvalidValueError(name, std::string(name) + "=" + text + " must be >= " +
                                      std::to_string(min));
  return value;
}

}  // namespace

bool world_env_present() { return std::getenv("COMMGRID_RANK") != nullptr; }

WorldEnv read_world_env() {
  WorldEnv out;
  out.rank = parse_int("COMMGRID_RANK", require("COMMGRID_RANK"), 0);
  out.size = parse_int("COMMGRID_WORLD_SIZE", require("COMMGRID_WORLD_SIZE"), 1);
  if (out.rank >= out.size)
    throw RankOutOfRangeError("COMMGRID_RANK", "COMMGRID_RANK=" + std::to_string(out.rank) +
                                                   " is not below COMMGRID_WORLD_SIZE=" +
                                                   std::to_string(out.size));
  out.store = require("COMMGRID_STORE");
  if (auto t = env("COMMGRID_TIMEOUT")) {
    // Seconds, possibly fractional ("2.5"), as the CLI's --timeout.
    const char* begin = t->c_str();
    char* end = nullptr;
    double seconds = std::strtod(begin, &end);
    if (t->empty() || end != begin + t->size() || !std::isfinite(seconds) || seconds <= 0 ||
        seconds > 1e9)
      throw InvalidValueError("COMMGRID_TIMEOUT",
                              "COMMGRID_TIMEOUT='" + *t +
                                  "' is not a positive number of seconds");
    out.timeout = std::chrono::milliseconds(
        std::max<long long>(1, std::llround(seconds * 1000.0)));
  }
  return out;
}

std::unique_ptr<Communicator> make_gloo_world_from_env(GlooOptions options) {
  const LaunchInfo info = read_launch_info();
  if (info.timeout) options.timeout = *info.timeout;
  if (auto h = env("COMMGRID_GLOO_HOSTNAME")) {
    if (h->empty())
      throw InvalidValueError("COMMGRID_GLOO_HOSTNAME", "COMMGRID_GLOO_HOSTNAME is set but empty");
    options.hostname = *h;
  }
  StoreOptions so;
  so.job_id = info.job_id;
  so.token = info.token;
  so.timeout = options.timeout;
  so.serve = info.rank == 0;
  so.rank = info.rank;
  auto store = open_store(info.store, so);
  if (options.hostname.empty()) options.hostname = store->local_address();
  options.prefix = info.job_id + "/" + options.prefix;
  options.token = info.token;
  return make_gloo_world(std::move(store), info.rank, info.size, options);
}

}  // namespace commgrid
