// The tcp:// store's wire format: a frame is a 4-byte big-endian length, then a message of
// one type byte and length-prefixed string fields. The sizes every frame is bounded by.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tcp_store.hpp"

namespace commgrid::bootstrap::tcp {

/// The largest frame after the proof: a set of the largest key and value.
inline constexpr std::size_t kMaxFrame = 64 + kTcpStoreMaxKey + kTcpStoreMaxValue;
/// Before its proof a connection may send one frame of at most this (the proof is 109 bytes).
inline constexpr std::size_t kPreAuthBuffer = 256;
/// A client reads the server's greeting and proof, frames it has not yet trusted, up to this.
inline constexpr std::size_t kMaxHandshakeFrame = 4096;

/// The largest frame a request of `type` may have after the proof ('S'/'X' set, 'G' get,
/// 'C' check, 'W' wait, 'I' identify, 'P' fence); 0 for a type that is not a request.
[[nodiscard]] std::size_t max_request_frame(char type);

/// "set", "get", ...: a request type as an error names it.
[[nodiscard]] const char* request_name(char type);

/// A message: one type byte and string fields.
struct Message {
  char type = 0;
  std::vector<std::string> fields;
};

/// Appends `v` in network byte order.
void put_u32(std::string& out, std::uint32_t v);
/// The 4 bytes at `in`, in network byte order.
[[nodiscard]] std::uint32_t get_u32(const char* in);

/// The frame of `m`: its length, then its body.
[[nodiscard]] std::string encode(const Message& m);
/// A frame's body (after its length) as a message; nullopt when malformed.
[[nodiscard]] std::optional<Message> decode(std::string_view body);
/// The number of fields of a frame's body, counted without copying any; nullopt when
/// malformed.
[[nodiscard]] std::optional<std::size_t> count_fields(std::string_view body);

}  // namespace commgrid::bootstrap::tcp
