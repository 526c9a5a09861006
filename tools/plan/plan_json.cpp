// `commgrid plan --format json`, the output buffer every plan format writes through, and
// the size estimate checked before anything is written.
#include <algorithm>
#include <string>
#include <string_view>

#include "commgrid/error.hpp"
#include "plan/plan_output.hpp"

namespace commgrid::cli {

OutputBuffer::OutputBuffer(std::ostream& out, std::size_t capacity)
    : out_(out), buf_(std::max<std::size_t>(capacity, 64)) {}

// Whatever is still buffered is dropped: every complete document ends with flush(), and an
// exception in the middle of one must not add its tail after the error.
OutputBuffer::~OutputBuffer() = default;

void OutputBuffer::drain() {
  out_.write(buf_.data(), static_cast<std::streamsize>(n_));
  n_ = 0;
  if (!out_) throw Error("plan: writing the output failed");
}

void OutputBuffer::put(std::string_view s) {
  while (!s.empty()) {
    if (n_ == buf_.size()) drain();
    const std::size_t k = std::min(s.size(), buf_.size() - n_);
    std::copy_n(s.data(), k, buf_.data() + n_);
    n_ += k;
    s.remove_prefix(k);
  }
}

void OutputBuffer::pad(std::string_view s, std::size_t width, bool left) {
  const std::size_t fill = width > s.size() ? width - s.size() : 0;
  if (left) put(s);
  for (std::size_t i = 0; i < fill; ++i) put(' ');
  if (!left) put(s);
}

void OutputBuffer::pad_int(std::int64_t v, std::size_t width) {
  char tmp[24];
  const auto end = std::to_chars(tmp, tmp + sizeof tmp, v).ptr;
  pad(std::string_view(tmp, static_cast<std::size_t>(end - tmp)), width);
}

void OutputBuffer::flush() {
  drain();
  out_.flush();
  if (!out_) throw Error("plan: writing the output failed");
}

namespace {

using Json = nlohmann::ordered_json;

// Streams entries [first, first + n) of a kind's member list through fn(span).
template <class Fn>
void for_each_piece(const Layout& layout, GroupKind k, int level, std::int64_t first,
                    std::int64_t n, std::vector<Rank>& buf, Fn&& fn) {
  buf.resize(static_cast<std::size_t>(std::min(n, kPiece)));
  for (std::int64_t done = 0; done < n;) {
    const std::int64_t m = std::min(kPiece, n - done);
    const std::span<Rank> piece(buf.data(), static_cast<std::size_t>(m));
    layout.members(k, level, first + done, piece);
    fn(std::span<const Rank>(piece));
    done += m;
  }
}

// [[a,b],[c,d],...]: every group of one kind (one level).
void write_groups(OutputBuffer& out, const Layout& layout, GroupKind k, int level,
                  std::vector<Rank>& buf) {
  const std::optional<std::int64_t> size = layout.group_size(k, level);
  if (!size) {  // groups of several sizes (custom embedding policy): listed whole
    const GroupList groups = layout.groups(k, level);
    out.put('[');
    for (std::size_t g = 0; g < groups.size(); ++g) {
      out.put(g ? ",[" : "[");
      for (std::size_t i = 0; i < groups[g].size(); ++i) {
        if (i) out.put(',');
        out.put_int(groups[g][i]);
      }
      out.put(']');
    }
    out.put(']');
    return;
  }
  const std::int64_t g = *size;
  std::int64_t pos = 0;
  out.put("[[");
  for_each_piece(layout, k, level, 0, layout.num_members(k, level), buf,
                 [&](std::span<const Rank> piece) {
                   for (Rank r : piece) {
                     if (pos == g) {
                       out.put("],[");
                       pos = 0;
                     } else if (pos > 0) {
                       out.put(',');
                     }
                     out.put_int(r);
                     ++pos;
                   }
                 });
  out.put("]]");
}

// r's group of one kind as a list, or null.
void write_rank_group(OutputBuffer& out, const Layout& layout, GroupKind k, Rank r, int level,
                      std::vector<Rank>& buf) {
  const std::optional<std::int64_t> size = layout.group_size(k, level);
  if (!size) {
    const auto g = layout.group_of(k, r, level);
    if (!g) return out.put("null");
    out.put('[');
    for (std::size_t i = 0; i < g->members.size(); ++i) {
      if (i) out.put(',');
      out.put_int(g->members[i]);
    }
    return out.put(']');
  }
  const std::optional<std::int64_t> q = layout.group_index(k, r, level);
  if (!q) return out.put("null");
  out.put('[');
  bool first = true;
  for_each_piece(layout, k, level, *q * *size, *size, buf, [&](std::span<const Rank> piece) {
    for (Rank m : piece) {
      if (!first) out.put(',');
      first = false;
      out.put_int(m);
    }
  });
  out.put(']');
}

void write_layer_pair(OutputBuffer& out, const LayerAssignment& la, std::int64_t p,
                      std::int64_t v) {
  out.put('[');
  out.put_int(la.first(p, v));
  out.put(',');
  out.put_int(la.first(p, v) + la.per_stage() - 1);
  out.put(']');
}

}  // namespace

Json config_json(const Layout& layout) {
  const ParallelConfig& c = layout.config();
  Json j;
  j["world_size"] = c.world_size;
  j["tp"] = c.tp;
  j["pp"] = c.pp;
  j["cp"] = c.cp;
  j["ep"] = c.ep;
  j["etp"] = c.expert_tp();
  j["dp"] = layout.dp();
  j["expert_dp"] = layout.expert_dp();
  j["dist_opt_instances"] = c.dist_opt_instances;
  j["hcp"] = c.hcp;
  j["vpp"] = c.vpp ? Json(*c.vpp) : Json(nullptr);
  j["order"] = c.order;
  if (c.compat == Compat::head) {
    j["compat"] = "head";
    j["gtp_remat"] = c.gtp_remat;
    j["expert_gtp_remat"] = c.expert_gtp_remat;
    j["hybrid_context_parallel"] = c.hybrid_context_parallel;
    j["all_gather_groups"] = c.all_gather_groups;
    j["rank_offset"] = c.rank_offset;
    j["local_world_size"] = c.local_world_size ? Json(*c.local_world_size) : Json(nullptr);
  }
  return j;
}

void write_plan_json(std::ostream& stream, const Layout& layout, const PlanSelection& sel) {
  OutputBuffer out(stream);
  std::vector<Rank> buf;
  if (sel.rank) {
    out.put("{\"rank\":");
    out.put_int(*sel.rank);
  } else {
    out.put("{\"config\":");
    out.put(config_json(layout).dump());
  }
  out.put(",\"groups\":{");
  bool first_kind = true;
  for (GroupKind k : sel.kinds) {
    if (k == GroupKind::hybrid_dp_cp) {
      // One key per level, as HEAD names them: hybrid_dp_cp_<n>.
      for (int l = 0; l < layout.levels(k); ++l) {
        if (!first_kind) out.put(',');
        first_kind = false;
        out.put('"');
        out.put(layout.level_name(k, l));
        out.put("\":");
        if (sel.rank) write_rank_group(out, layout, k, *sel.rank, l, buf);
        else write_groups(out, layout, k, l, buf);
      }
      continue;
    }
    if (!first_kind) out.put(',');
    first_kind = false;
    out.put('"');
    out.put(kind_name(k));
    out.put("\":");
    const int levels = layout.levels(k);
    if (k == GroupKind::hcp) out.put('[');
    for (int l = 0; l < levels; ++l) {
      if (l) out.put(',');
      if (sel.rank) write_rank_group(out, layout, k, *sel.rank, l, buf);
      else write_groups(out, layout, k, l, buf);
    }
    if (k == GroupKind::hcp) out.put(']');
  }
  out.put('}');
  if (sel.rank && sel.gpus_per_node) {
    out.put(",\"node\":");
    out.put_int(*sel.rank / *sel.gpus_per_node);
    out.put(",\"local_device\":");
    out.put_int(*sel.rank % *sel.gpus_per_node);
  }
  if (sel.num_layers) {
    // Per virtual stage [first, last] layer: the rank's, or per pipeline rank.
    const LayerAssignment la(*sel.num_layers, layout.config());
    out.put(",\"layers\":[");
    const std::int64_t p0 = sel.rank ? layout.coordinates(*sel.rank).pp : 0;
    const std::int64_t p1 = sel.rank ? p0 + 1 : la.pp;
    for (std::int64_t p = p0; p < p1; ++p) {
      if (p > p0) out.put(',');
      if (!sel.rank) out.put('[');
      for (std::int64_t v = 0; v < la.vpp; ++v) {
        if (v) out.put(',');
        write_layer_pair(out, la, p, v);
      }
      if (!sel.rank) out.put(']');
    }
    out.put(']');
  }
  if (sel.spares) {
    // The job's processes in epoch 0: spares as an inclusive [first, last] range ([] when
    // none), and their nodes when the map has nodes.
    const RankMap& m = *sel.spares;
    const std::int64_t W = m.world_size(), P = m.num_processes();
    out.put(",\"processes\":{\"total\":");
    out.put_int(P);
    out.put(",\"spares\":[");
    if (P > W) {
      out.put_int(W);
      out.put(',');
      out.put_int(P - 1);
    }
    out.put(']');
    if (P > W && m.node_of(W)) {
      out.put(",\"spare_nodes\":[");
      out.put_int(*m.node_of(W));
      out.put(',');
      out.put_int(*m.node_of(P - 1));
      out.put(']');
    }
    if (sel.rank) {
      out.put(",\"process\":");
      out.put_int(m.process_of(*sel.rank));
    }
    out.put('}');
  }
  out.put("}\n");
  out.flush();
}

std::int64_t estimate_plan_bytes(const Layout& layout, const PlanSelection& sel,
                                 PlanFormat format) {
  // Every number is bounded by the widest rank (or group index), D digits.
  const std::int64_t D = digits(std::max<std::int64_t>(layout.world_size() - 1, 0));
  std::int64_t bytes = 4096;  // header, config, layers beyond the loop below
  if (sel.num_layers) bytes += 32 * layout.config().pp * layout.config().vpp.value_or(1);
  std::int64_t columns = 0, title = 16;  // the widest column title (HEAD's run to 24)
  for (GroupKind k : sel.kinds)
    for (int l = 0; l < layout.levels(k); ++l) {
      ++columns;
      title = std::max<std::int64_t>(
          {title, static_cast<std::int64_t>(std::string_view(kind_name(k)).size()) + 4,
           static_cast<std::int64_t>(std::string(layout.level_name(k, l)).size())});
      const std::int64_t g = layout.group_size(k, l).value_or(layout.world_size());
      if (format == PlanFormat::json)
        bytes += 64 + (sel.rank ? g * (D + 1)
                                : layout.num_members(k, l) * (D + 1) + 2 * layout.num_groups(k, l));
      else bytes += 1024;  // one summary or rank-view line: compressed lists, bounded
    }
  if (format == PlanFormat::table && !sel.rank) {
    // One row per rank: rank, 7 coordinates and one group index per column, each at
    // least D + 1 and its title wide.
    bytes += layout.world_size() * (8 * std::max<std::int64_t>(D + 1, 6) +
                                    columns * (std::max<std::int64_t>(D, title) + 1) + 4);
  }
  return bytes;
}

}  // namespace commgrid::cli
