// The store keys of resilience and the decision's text (resilience_keys.hpp).
#include "commgrid/resilience_keys.hpp"

#include <charconv>
#include <cstdio>

namespace commgrid {
namespace {

std::string epoch_key(std::string_view prefix, std::int64_t epoch, std::string_view name) {
  return std::string(prefix) + "/epoch/" + std::to_string(epoch) + "/" + std::string(name);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (!s.empty()) {
    const auto at = s.find(sep);
    out.push_back(s.substr(0, at));
    if (at == std::string_view::npos) break;
    s.remove_prefix(at + 1);
  }
  return out;
}

std::int64_t number(std::string_view s, std::string_view what,
                    std::string_view where = " in a decision") {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size())
    throw BackendError("recovery: malformed " + std::string(what) + " '" + std::string(s) + "'" +
                       std::string(where));
  return v;
}

std::vector<std::int64_t> numbers(std::string_view s, std::string_view what,
                                  std::string_view where = " in a decision") {
  std::vector<std::int64_t> out;
  for (std::string_view item : split(s, ',')) out.push_back(number(item, what, where));
  return out;
}

std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }

}  // namespace

std::string dead_process_key(std::string_view prefix, std::int64_t process, int incarnation) {
  return std::string(prefix) + "/process/" + std::to_string(process) + "/" +
         std::to_string(incarnation) + "/dead";
}
std::string epoch_failed_key(std::string_view prefix, std::int64_t epoch) {
  return epoch_key(prefix, epoch, "failed");
}
std::string epoch_decision_key(std::string_view prefix, std::int64_t epoch) {
  return epoch_key(prefix, epoch, "decision");
}
std::string epoch_alive_key(std::string_view prefix, std::int64_t epoch, std::int64_t process) {
  return epoch_key(prefix, epoch, "alive/" + std::to_string(process));
}
std::string epoch_world_prefix(std::string_view prefix, std::int64_t epoch) {
  return epoch_key(prefix, epoch, "world");
}
std::string epoch_transfer_prefix(std::string_view prefix, std::int64_t epoch) {
  return epoch_key(prefix, epoch, "reshard");
}
std::string epoch_torch_store_key(std::string_view prefix, std::int64_t epoch) {
  return epoch_key(prefix, epoch, "torch_store");
}
std::string job_done_key(std::string_view prefix) { return std::string(prefix) + "/done"; }
std::string job_ended_key(std::string_view prefix) { return std::string(prefix) + "/ended"; }
std::string process_identity(std::int64_t process, int incarnation) {
  return "process/" + std::to_string(process) + "/" + std::to_string(incarnation);
}

std::string join_numbers(const std::vector<std::int64_t>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::vector<std::int64_t> parse_numbers(std::string_view text, std::string_view what) {
  return numbers(text, what, "");
}

std::string format_registration(const RegistrationRecord& r) {
  std::string out = std::to_string(r.incarnation);
  if (r.renew.empty() && !r.fingerprint && r.note.empty()) return out;
  out += ";" + join_numbers(r.renew) + ";";
  if (r.fingerprint) out += fingerprint_text(*r.fingerprint);
  if (!r.note.empty()) out += ";" + r.note;
  return out;
}

RegistrationRecord parse_registration(std::string_view text) {
  RegistrationRecord r;
  const std::vector<std::string_view> parts = split(text, ';');
  r.incarnation = number(parts.empty() ? text : parts[0], "incarnation", "");
  if (parts.size() > 1) r.renew = numbers(parts[1], "renewed process", "");
  if (parts.size() > 2 && !parts[2].empty()) {
    r.fingerprint = parse_fingerprint(parts[2]);
    if (!r.fingerprint)
      throw BackendError("recovery: malformed fingerprint in the registration '" +
                         std::string(text) + "'");
  }
  if (parts.size() > 3) r.note = std::string(parts[3]);
  return r;
}

std::string fingerprint_text(std::uint64_t fingerprint) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fingerprint));
  return hex;
}

std::optional<std::uint64_t> parse_fingerprint(std::string_view text) {
  std::uint64_t v = 0;
  if (text.empty() || text.size() > 16) return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 16);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::string format_decision(const DecisionRecord& d) {
  std::string out = "epoch=" + std::to_string(d.epoch) + "\ndecider=" + std::to_string(d.decider) +
                    "\ndead=" + join_numbers(d.dead) + "\nrevived=";
  for (std::size_t i = 0; i < d.revived.size(); ++i)
    out += (i ? "," : "") + std::to_string(d.revived[i].first) + ":" +
           std::to_string(d.revived[i].second);
  out += "\n";
  if (d.shrink_world) out += "shrink=" + std::to_string(*d.shrink_world) + "\n";
  if (!d.process_of.empty()) out += "ranks=" + join_numbers(d.process_of) + "\n";
  if (!d.renew.empty()) {
    out += "renew=";
    for (std::size_t i = 0; i < d.renew.size(); ++i)
      out += (i ? "," : "") + std::to_string(d.renew[i].first) + "-" +
             std::to_string(d.renew[i].second);
    out += "\n";
  }
  if (d.fingerprint) out += "fingerprint=" + fingerprint_text(*d.fingerprint) + "\n";
  if (!d.notes.empty()) {
    out += "notes=";
    bool first = true;
    for (const auto& [p, note] : d.notes) {
      out += (first ? "" : " ") + std::to_string(p) + "/" + note;
      first = false;
    }
    out += "\n";
  }
  return out;
}

DecisionRecord parse_decision(std::string_view decision) {
  DecisionRecord d;
  for (std::string_view line : split(decision, '\n')) {
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string_view::npos)
      throw BackendError("recovery: malformed decision line '" + std::string(line) + "'");
    const std::string_view name = line.substr(0, eq), value = line.substr(eq + 1);
    if (name == "epoch") {
      d.epoch = number(value, "epoch");
    } else if (name == "decider") {
      d.decider = number(value, "decider");
    } else if (name == "dead") {
      d.dead = numbers(value, "dead process");
    } else if (name == "revived") {
      for (std::string_view item : split(value, ',')) {
        const auto colon = item.find(':');
        if (colon == std::string_view::npos)
          throw BackendError("recovery: malformed revived '" + std::string(item) +
                             "' in a decision");
        d.revived.emplace_back(number(item.substr(0, colon), "revived process"),
                               static_cast<int>(number(item.substr(colon + 1), "incarnation")));
      }
    } else if (name == "shrink") {
      d.shrink_world = number(value, "shrink");
    } else if (name == "ranks") {
      d.process_of = numbers(value, "rank's process");
    } else if (name == "renew") {
      for (std::string_view item : split(value, ',')) {
        const auto dash = item.find('-');
        if (dash == std::string_view::npos)
          throw BackendError("recovery: malformed renew '" + std::string(item) + "' in a decision");
        d.renew.emplace_back(number(item.substr(0, dash), "renewed process"),
                             number(item.substr(dash + 1), "renewed process"));
      }
    } else if (name == "notes") {
      for (std::string_view item : split(value, ' ')) {
        const auto slash = item.find('/');
        if (slash == std::string_view::npos)
          throw BackendError("recovery: malformed note '" + std::string(item) + "' in a decision");
        d.notes[number(item.substr(0, slash), "noting process")] =
            std::string(item.substr(slash + 1));
      }
    } else if (name == "fingerprint") {
      d.fingerprint = parse_fingerprint(value);
      if (!d.fingerprint)
        throw BackendError("recovery: malformed fingerprint '" + std::string(value) +
                           "' in a decision");
    }
  }
  return d;
}

std::vector<DecisionRecord> read_decisions(Store& store, std::string_view prefix,
                                           std::int64_t from) {
  std::vector<DecisionRecord> out;
  for (std::int64_t e = from + 1; store.has(epoch_decision_key(prefix, e)); ++e)
    out.push_back(parse_decision(text(store.get(epoch_decision_key(prefix, e)))));
  return out;
}

std::optional<std::string> job_end_reason(Store& store, std::string_view prefix) {
  const std::string key = job_ended_key(prefix);
  if (!store.has(key)) return std::nullopt;
  return text(store.get(key));
}

}  // namespace commgrid
