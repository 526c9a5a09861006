#include "plan/plan_job.hpp"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "commgrid/config.hpp"
#include "commgrid/error.hpp"

namespace commgrid::cli {
namespace {

using Json = nlohmann::ordered_json;

/// A job file is a few kilobytes; these bound what a hostile or broken one can cost.
constexpr std::size_t kMaxJobBytes = 16u << 20;
constexpr int kMaxJobDepth = 32;  // a job nests 5 deep: {modules: [{groups: [[...]]}]}
constexpr std::size_t kMaxExcerpt = 60;
constexpr std::size_t kMaxName = 64;  // module and dim names

/// The text shortened to an excerpt: an error names a bad value, it does not repeat it.
std::string excerpt(std::string text, std::size_t max = kMaxExcerpt) {
  if (text.size() <= max) return text;
  const std::size_t total = text.size();
  text.resize(max);
  return text + "... (" + std::to_string(total) + " characters)";
}

std::string excerpt(const Json& v) {
  // Values nest at most kMaxJobDepth deep (checked before parsing), so dump() is safe.
  return excerpt(v.dump());
}

/// The deepest nesting of arrays and objects in JSON text (outside strings), and where
/// it first exceeds `limit`: the parser and every walk of the document recurse per level.
std::optional<std::size_t> too_deep(const std::string& text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::nullopt;
}

[[noreturn]] void bad(const std::string& field, const std::string& what) {
  throw ConfigError("job", "job." + field + ": " + what);
}

const Json& member(const Json& obj, const std::string& where, const char* key) {
  if (!obj.contains(key)) bad(where.empty() ? key : where + "." + key, "missing");
  return obj.at(key);
}

std::int64_t integer(const Json& v, const std::string& field, std::int64_t min) {
  if (!v.is_number_integer() || v.get<std::int64_t>() < min)
    bad(field, "expected an integer >= " + std::to_string(min) + ", got " + excerpt(v));
  return v.get<std::int64_t>();
}

std::string text(const Json& v, const std::string& field) {
  if (!v.is_string() || v.get<std::string>().empty())
    bad(field, "expected a non-empty string, got " + excerpt(v));
  // Names are echoed in messages and table rows: a long one is a mistake, not a name.
  if (v.get<std::string>().size() > kMaxName)
    bad(field, "expected a name of at most " + std::to_string(kMaxName) + " characters, got " +
                   excerpt(v));
  return v.get<std::string>();
}

void check_keys(const Json& obj, const std::string& where,
                std::initializer_list<const char*> keys) {
  if (!obj.is_object())
    bad(where.empty() ? "(the document)" : where, "expected an object, got " + excerpt(obj));
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return it.key() == k; }))
      bad((where.empty() ? "" : where + ".") + excerpt(it.key()), "unknown field");
}

}  // namespace

Job read_job(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("job", "job: cannot read \"" + path + "\"");
  std::string content;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    content.append(buf, static_cast<std::size_t>(in.gcount()));
    if (content.size() > kMaxJobBytes)
      throw ConfigError("job", "job: \"" + path + "\" is larger than " +
                                   std::to_string(kMaxJobBytes >> 20) +
                                   " MiB; a job file is a few kilobytes");
  }
  if (const auto at = too_deep(content, kMaxJobDepth))
    throw ConfigError("job", "job: \"" + path + "\" nests arrays and objects deeper than " +
                                 std::to_string(kMaxJobDepth) + " levels (at byte " +
                                 std::to_string(*at) + "); a job file nests 5");
  Json j;
  try {
    j = Json::parse(content);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number no double holds ("size": 1e999).
    throw ConfigError("job", "job: \"" + path + "\" is not valid JSON (" +
                                 excerpt(e.what(), 4 * kMaxExcerpt) + ")");
  }
  check_keys(j, "", {"world_size", "modules"});
  Job job;
  job.world_size = integer(member(j, "", "world_size"), "world_size", 1);
  if (job.world_size > kMaxWorldSize) bad("world_size", "exceeds " + std::to_string(kMaxWorldSize));
  const Json& modules = member(j, "", "modules");
  if (!modules.is_array() || modules.empty())
    bad("modules", "expected a non-empty list of modules");
  for (std::size_t m = 0; m < modules.size(); ++m) {
    const std::string where = "modules[" + std::to_string(m) + "]";
    const Json& mod = modules[m];
    check_keys(mod, where, {"name", "rank_offset", "dims", "groups"});
    const std::string name = text(member(mod, where, "name"), where + ".name");
    for (const JobModule& other : job.modules)
      if (other.name == name) bad(where + ".name", "module \"" + name + "\" is given twice");
    const std::int64_t offset =
        mod.contains("rank_offset") ? integer(mod["rank_offset"], where + ".rank_offset", 0) : 0;
    const Json& dims = member(mod, where, "dims");
    if (!dims.is_array() || dims.empty())
      bad(where + ".dims", "expected a non-empty list of {\"name\", \"size\"}");
    std::vector<std::int64_t> shape;
    std::vector<std::string> names;
    for (std::size_t d = 0; d < dims.size(); ++d) {
      const std::string dw = where + ".dims[" + std::to_string(d) + "]";
      check_keys(dims[d], dw, {"name", "size"});
      names.push_back(text(member(dims[d], dw, "name"), dw + ".name"));
      shape.push_back(integer(member(dims[d], dw, "size"), dw + ".size", 1));
      for (std::size_t e = 0; e + 1 < names.size(); ++e)
        if (names[e] == names.back())
          bad(dw + ".name", "dim \"" + names.back() + "\" appears twice");
    }
    std::optional<HyperGrid> grid;
    try {
      grid.emplace(shape, names, job.world_size, offset);
    } catch (const ConfigError& e) { bad(where, e.what()); }
    std::vector<std::vector<std::string>> sets;
    if (mod.contains("groups")) {
      const Json& groups = mod["groups"];
      if (!groups.is_array())
        bad(where + ".groups", "expected a list of dim lists, e.g. [[\"tp\"], [\"dp\", \"cp\"]]");
      for (std::size_t g = 0; g < groups.size(); ++g) {
        const std::string gw = where + ".groups[" + std::to_string(g) + "]";
        if (!groups[g].is_array() || groups[g].empty())
          bad(gw, "expected a non-empty list of dim names");
        std::vector<std::string> set;
        for (std::size_t k = 0; k < groups[g].size(); ++k)
          set.push_back(text(groups[g][k], gw + "[" + std::to_string(k) + "]"));
        std::string key;
        try {
          key = grid->key(set);
        } catch (const ConfigError& e) { bad(gw, e.what()); }
        // verify creates each set's groups once: the same dims twice (in any order) would
        // create them twice, which HEAD refuses (a KeyError), and so does verify --job.
        for (std::size_t e = 0; e < sets.size(); ++e)
          if (grid->key(sets[e]) == key)
            bad(gw, "the groups over " + key + " are listed twice (also groups[" +
                        std::to_string(e) + "])");
        sets.push_back(std::move(set));
      }
    } else {
      for (const std::string& n : names) sets.push_back({n});
    }
    // Modules lie on disjoint rank spans.
    for (const JobModule& other : job.modules) {
      const HyperGrid& o = other.grid;
      if (offset < o.rank_offset() + o.size() && o.rank_offset() < offset + grid->size())
        bad(where + ".rank_offset", "module \"" + name + "\" (ranks " + std::to_string(offset) +
                                        "-" + std::to_string(offset + grid->size() - 1) +
                                        ") overlaps module \"" + other.name + "\" (ranks " +
                                        std::to_string(o.rank_offset()) + "-" +
                                        std::to_string(o.rank_offset() + o.size() - 1) + ")");
    }
    job.modules.push_back(JobModule{name, std::move(*grid), std::move(sets)});
  }
  return job;
}

void write_job_plan(std::ostream& out, const Job& job, bool json) {
  if (json) {
    Json j;
    j["world_size"] = job.world_size;
    Json mods = Json::object();
    for (const JobModule& m : job.modules) {
      Json mj;
      mj["rank_offset"] = m.grid.rank_offset();
      mj["size"] = m.grid.size();
      Json dims = Json::array();
      for (std::size_t d = 0; d < m.grid.shape().size(); ++d)
        dims.push_back({{"name", m.grid.dim_names()[d]}, {"size", m.grid.shape()[d]}});
      mj["dims"] = dims;
      Json groups = Json::object();
      for (const auto& set : m.groups) groups[m.grid.key(set)] = m.grid.groups(set).to_vectors();
      mj["groups"] = groups;
      mods[m.name] = mj;
    }
    j["modules"] = mods;
    out << j.dump() << "\n";
    return;
  }
  out << "job: " << job.modules.size() << " modules on " << job.world_size << " ranks\n";
  for (const JobModule& m : job.modules) {
    out << m.name << ": ranks " << m.grid.rank_offset() << "-"
        << m.grid.rank_offset() + m.grid.size() - 1 << ", dims";
    for (std::size_t d = 0; d < m.grid.shape().size(); ++d)
      out << " " << m.grid.dim_names()[d] << "=" << m.grid.shape()[d];
    out << "\n";
    for (const auto& set : m.groups) {
      const GroupList g = m.grid.groups(set);
      out << "  " << m.grid.key(set) << ": " << g.size() << " groups of "
          << (g.empty() ? 0 : g[0].size()) << ":";
      for (std::size_t i = 0; i < g.size() && i < 4; ++i) {
        out << " [";
        for (std::size_t k = 0; k < g[i].size(); ++k) out << (k ? "," : "") << g[i][k];
        out << "]";
      }
      out << (g.size() > 4 ? " ...\n" : "\n");
    }
  }
}

}  // namespace commgrid::cli
