#include "commgrid/group_kind.hpp"

#include "commgrid/error.hpp"

namespace commgrid {
namespace {

constexpr std::array<std::string_view, kNumKinds> kNames = {"dp_cp",
                                                            "intra_dp_cp",
                                                            "dp",
                                                            "cp",
                                                            "hcp",
                                                            "mp",
                                                            "tp",
                                                            "pp",
                                                            "embd",
                                                            "pos_embd",
                                                            "tp_dp_cp",
                                                            "tp_dp",
                                                            "tp_cp",
                                                            "ep",
                                                            "expt_tp",
                                                            "tp_ep",
                                                            "tp_ep_pp",
                                                            "expt_dp",
                                                            "intra_expt_dp",
                                                            "inter_dist_opt",
                                                            "intra_dist_opt",
                                                            "gtp_remat",
                                                            "expt_gtp_remat",
                                                            "dp_gtp_remat",
                                                            "dp_cp_gtp_remat",
                                                            "expt_dp_gtp_remat",
                                                            "tp_ep_pp_with_egtp_remat",
                                                            "hybrid_dp_cp",
                                                            "dp_cp_ag",
                                                            "expt_dp_ag"};

}  // namespace

const std::array<GroupKind, kNumKinds>& all_kinds() noexcept {
  static const std::array<GroupKind, kNumKinds> kinds = [] {
    std::array<GroupKind, kNumKinds> k{};
    for (int i = 0; i < kNumKinds; ++i) k[i] = static_cast<GroupKind>(i);
    return k;
  }();
  return kinds;
}

std::string_view kind_name(GroupKind k) noexcept { return kNames[static_cast<int>(k)]; }

std::optional<GroupKind> find_kind(std::string_view name) noexcept {
  for (int i = 0; i < kNumKinds; ++i)
    if (kNames[i] == name) return static_cast<GroupKind>(i);
  return std::nullopt;
}

std::string all_kind_names() {
  std::string s;
  for (int i = 0; i < kNumKinds; ++i) s += (i ? ", " : "") + std::string(kNames[i]);
  return s;
}

GroupKind parse_kind(std::string_view name) {
  if (auto k = find_kind(name)) return *k;
  throw UnknownKindError(
      "kinds", "unknown group kind \"" + std::string(name) + "\"; valid: " + all_kind_names());
}

std::vector<GroupKind> parse_kinds(std::string_view list) {
  std::vector<GroupKind> out;
  std::vector<std::string> unknown;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = list.find(',', start);
    const std::string_view name = list.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (auto k = find_kind(name)) {
      for (GroupKind seen : out)
        if (seen == *k)
          throw ConfigError("kinds", "kinds: \"" + std::string(name) + "\" is listed twice");
      out.push_back(*k);
    } else {
      unknown.push_back("\"" + std::string(name) + "\"");
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (!unknown.empty()) {
    std::string names;
    for (std::size_t i = 0; i < unknown.size(); ++i) names += (i ? ", " : "") + unknown[i];
    throw UnknownKindError("kinds", std::string("unknown group kind") +
                                        (unknown.size() > 1 ? "s " : " ") + names +
                                        "; valid: " + all_kind_names());
  }
  return out;
}

}  // namespace commgrid
