// The JSON of etcd v3's gateway: keys and values in base64, members a reply may omit (proto3's
// JSON leaves default values out), 64-bit numbers as strings. Built with libcurl only.
#pragma once

#if COMMGRID_HAVE_CURL
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace commgrid::bootstrap::etcd {

using json = nlohmann::json;

/// Base64 (RFC 4648, padded) of `s`, and back (BackendError for malformed base64).
std::string b64(std::string_view s);
std::string unb64(const std::string& s);

/// The end of the range of every key that starts with `prefix` (etcd's range_end).
std::string prefix_end(std::string prefix);

/// A member of `j` that is a number or a string of one (0 when absent).
std::int64_t number(const json& j, const char* field);
/// A member of an object / the i-th item of an array, or null when there is none.
const json& field(const json& j, const char* name);
const json& item(const json& j, size_t i);
/// A string member ("" when absent).
std::string text_of(const json& j, const char* name);
/// The key-values of a transaction's i-th response (a range): an empty array when none.
json kvs_of(const json& txn_reply, size_t i);

}  // namespace commgrid::bootstrap::etcd
#endif  // COMMGRID_HAVE_CURL
