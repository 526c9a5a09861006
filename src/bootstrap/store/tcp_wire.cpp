// The tcp:// store's wire format (tcp_wire.hpp).
#include "tcp_wire.hpp"

#include <arpa/inet.h>

#include <cstring>

namespace commgrid::bootstrap::tcp {

void put_u32(std::string& out, uint32_t v) {
  const uint32_t be = htonl(v);
  out.append(reinterpret_cast<const char*>(&be), 4);
}

uint32_t get_u32(const char* in) {
  uint32_t be = 0;
  std::memcpy(&be, in, 4);
  return ntohl(be);
}

size_t max_request_frame(char type) {
  switch (type) {
    case 'S':
    case 'X': return kMaxFrame;
    case 'G':
    case 'C':
    case 'I': return 1 + 4 + kTcpStoreMaxKey;
    case 'P': return 1 + 2 * (4 + kTcpStoreMaxKey);
    case 'W': return kTcpStoreMaxWaitBytes;
    default: return 0;
  }
}

const char* request_name(char type) {
  switch (type) {
    case 'S':
    case 'X': return "set";
    case 'G': return "get";
    case 'C': return "check";
    case 'I': return "identify";
    case 'P': return "fence";
    case 'W': return "wait";
    default: return "unknown";
  }
}

std::string encode(const Message& m) {
  size_t size = 1;
  for (const auto& f : m.fields) size += 4 + f.size();
  std::string out;
  out.reserve(4 + size);
  put_u32(out, static_cast<uint32_t>(size));
  out += m.type;
  for (const auto& f : m.fields) {
    put_u32(out, static_cast<uint32_t>(f.size()));
    out += f;
  }
  return out;
}

std::optional<Message> decode(std::string_view body) {
  if (body.empty()) return std::nullopt;
  Message m;
  m.type = body[0];
  body.remove_prefix(1);
  while (!body.empty()) {
    if (body.size() < 4) return std::nullopt;
    const uint32_t n = get_u32(body.data());
    body.remove_prefix(4);
    if (n > body.size()) return std::nullopt;
    m.fields.emplace_back(body.substr(0, n));
    body.remove_prefix(n);
  }
  return m;
}

std::optional<size_t> count_fields(std::string_view body) {
  if (body.empty()) return std::nullopt;
  body.remove_prefix(1);
  size_t n = 0;
  while (!body.empty()) {
    if (body.size() < 4) return std::nullopt;
    const uint32_t len = get_u32(body.data());
    body.remove_prefix(4);
    if (len > body.size()) return std::nullopt;
    body.remove_prefix(len);
    ++n;
  }
  return n;
}

}  // namespace commgrid::bootstrap::tcp
