#include "launch/output_relay.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace commgrid::cli {
namespace {

constexpr std::size_t kReadChunk = 65536;
constexpr std::size_t kLongestPartialLine = 65536;

}  // namespace

void Stream::read_some() {
  if (!fd_.open()) return;
  char buf[kReadChunk];
  const ssize_t n = ::read(fd_.get(), buf, sizeof(buf));
  if (n > 0) pending_.append(buf, static_cast<std::size_t>(n));
  else if (n == 0 || (errno != EINTR && errno != EAGAIN)) fd_.reset();
}

void Stream::read_rest() {
  char buf[kReadChunk];
  while (fd_.open()) {
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) break;
    const ssize_t n = ::read(fd_.get(), buf, sizeof(buf));
    if (n <= 0) break;
    pending_.append(buf, static_cast<std::size_t>(n));
  }
  fd_.reset();
}

void Stream::emit(const std::string& prefix, bool show, bool flush_partial) {
  if (!show) {
    pending_.clear();
    return;
  }
  std::size_t start = 0, nl = 0;
  std::string out;
  while ((nl = pending_.find('\n', start)) != std::string::npos) {
    out += prefix;
    out.append(pending_, start, nl - start + 1);
    start = nl + 1;
  }
  pending_.erase(0, start);
  if (!pending_.empty() && (flush_partial || pending_.size() > kLongestPartialLine)) {
    out += prefix + pending_ + "\n";
    pending_.clear();
  }
  if (!out.empty()) write_all(target_, out);
}

Routing route(OutputMode mode, const std::string& label, bool rank0) {
  const std::string prefix = label + " ";
  switch (mode) {
    case OutputMode::prefixed: return {prefix, prefix, true};
    case OutputMode::raw: return {"", "", true};
    case OutputMode::rank0: return {"", rank0 ? "" : prefix, rank0};
  }
  return {prefix, prefix, true};
}

}  // namespace commgrid::cli
