// The tcp:// store's server, one connection at a time: its proof, its requests in order, a
// wait parked until its keys are set, and the replies (tcp_server.hpp).
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

#include "tcp_auth.hpp"
#include "tcp_server.hpp"
#include "text.hpp"

namespace commgrid::bootstrap::tcp {

void TcpStoreServer::on_conn(uint64_t id, uint32_t events) {
  Conn* c = find(id);
  if (c == nullptr || c->dead) return;
  if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0) {
    if (c->authed && c->parked && (events & EPOLLIN) == 0) {
      kill(*c);  // the client went away while its wait was parked
      return;
    }
    if (!(c->authed ? read_requests(*c) : read_proof(*c))) {
      kill(*c);
      return;
    }
  }
  if (!c->dead) {
    flush(*c);
    // Requests held back while replies queued up: served now that they have gone.
    if (c->authed && !c->parked && c->in.size() > c->in_off && !serve_requests(*c)) kill(*c);
    if (!c->dead) flush(*c);
    update_events(*c);
  }
}

// Before the proof: at most the fixed buffer, one frame, which must be the proof.
bool TcpStoreServer::read_proof(Conn& c) {
  for (;;) {
    if (c.small_len == c.small.size()) break;
    const ssize_t n =
        ::recv(c.socket.get(), c.small.data() + c.small_len, c.small.size() - c.small_len, 0);
    if (n > 0) {
      c.small_len += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return false;
  }
  if (c.closing) return true;  // refused already: its bytes are not read
  if (c.small_len < 4) return true;
  const uint32_t size = get_u32(c.small.data());
  if (size == 0 || size > c.small.size() - 4) return false;  // not a proof: nothing kept for it
  if (c.small_len < 4 + size) return true;
  const auto a = decode(std::string_view(c.small.data() + 4, size));
  if (!a || a->type != 'A' || a->fields.size() != 2 || a->fields[1].size() != 32) return false;
  if (!client_proven(options_, c.nonce, a->fields[0])) {
    queue(c, encode({'R', {"unauthenticated: the token of the job was not proven"}}));
    c.closing = true;
    return true;
  }
  c.authed = true;
  cancel_timer(c);
  pending_.erase(c.pending_it);
  queue(c, encode(server_answer(options_, a->fields[1], secret_)));
  c.in.assign(c.small.data() + 4 + size, c.small_len - 4 - size);
  return serve_requests(c);
}

// After the proof: bytes as they come (never more than the frame they belong to needs).
bool TcpStoreServer::read_requests(Conn& c) {
  if (c.closing) return true;  // refused: what else it sends is not read
  size_t total = 0;
  while (total < (size_t{1} << 20) && c.in.size() - c.in_off < 4 + kMaxFrame) {
    const ssize_t n = ::recv(c.socket.get(), buffer_.data(), buffer_.size(), 0);
    if (n > 0) {
      c.in.append(buffer_.data(), static_cast<size_t>(n));
      total += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return false;
  }
  return serve_requests(c);
}

// Serves the complete requests received, in order, until one is parked (a wait) or the
// replies queue up. False: the connection broke the protocol.
bool TcpStoreServer::serve_requests(Conn& c) {
  while (!c.dead && !c.parked && c.out.size() < kMaxQueued) {
    const size_t avail = c.in.size() - c.in_off;
    if (avail < 4) break;
    const uint32_t size = get_u32(c.in.data() + c.in_off);
    if (size == 0) return false;
    if (avail < 5) break;  // the type byte says the frame's limit
    const char type = c.in[c.in_off + 4];
    const size_t limit = max_request_frame(type);
    if (limit == 0) return false;  // not a request: the connection broke the protocol
    // Refused from its length alone, before its body is read or anything is allocated.
    if (size > limit)
      return refuse_request(c, std::string("a ") + request_name(type) + " request of " +
                                   std::to_string(size) + " bytes exceeds the limit of " +
                                   std::to_string(limit) + " bytes per request");
    if (avail < 4 + size) break;
    const std::string_view body = std::string_view(c.in).substr(c.in_off + 4, size);
    if (type == 'W')
      if (const auto n = count_fields(body); n && *n > 1 + kTcpStoreMaxWaitKeys)
        return refuse_request(c, "a wait request for " + std::to_string(*n - 1) +
                                     " keys exceeds the limit of " +
                                     std::to_string(kTcpStoreMaxWaitKeys) + " keys per request");
    auto m = decode(body);
    c.in_off += 4 + size;
    if (!m || !serve(c, std::move(*m))) return false;
  }
  if (c.in_off == c.in.size()) {
    c.in_off = 0;
    if (c.in.capacity() > (size_t{64} << 10)) std::string().swap(c.in);
    else c.in.clear();
  } else if (c.in_off > (size_t{64} << 10)) {
    c.in.erase(0, c.in_off);
    c.in_off = 0;
  }
  return true;
}

// A fenced process's request: refused with the fencing message, and the connection closed.
bool TcpStoreServer::refuse_fenced(Conn& c, const std::string& process) {
  std::optional<std::string> why = fenced(process);
  if (!why) return false;
  queue(c, encode({'Z', {*why}}));
  c.closing = true;
  c.in_off = c.in.size();  // what else it sent is not served
  return true;
}

bool TcpStoreServer::serve(Conn& c, Message m) {
  if (!c.process.empty() && refuse_fenced(c, c.process)) return true;
  if (m.type == 'W') return park(c, std::move(m));
  if (m.fields.empty()) return false;
  if (m.fields[0].size() > kTcpStoreMaxKey) return refuse_key(c, m.fields[0].size());
  const std::string& key = m.fields[0];
  if (m.type == 'I' && m.fields.size() == 1) {  // identify as a process
    if (refuse_fenced(c, key)) return true;
    c.process = key;
    queue(c, encode({'K', {}}));
    return true;
  }
  if (m.type == 'P' && m.fields.size() == 2) {  // fence a process
    if (m.fields[1].size() > kTcpStoreMaxKey)
      return refuse_request(c, "a fencing message of " + std::to_string(m.fields[1].size()) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(kTcpStoreMaxKey) + " bytes");
    fence(key, m.fields[1]);
    queue(c, encode({'K', {}}));
    return true;
  }
  if ((m.type == 'S' || m.type == 'X') && m.fields.size() == 2) {
    if (m.fields[1].size() > kTcpStoreMaxValue)
      return refuse_request(c, "a value of " + std::to_string(m.fields[1].size()) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(kTcpStoreMaxValue) + " bytes per value");
    std::string why;
    switch (insert(key, m.fields[1], &why)) {
      case SetResult::ok:
        queue(c, encode({'K', {}}));
        wake_key(key);
        break;
      case SetResult::exists:
        // 'X' (set if absent): the key existed, which is an answer, not an error.
        if (m.type == 'X') queue(c, encode({'F', {}}));
        else queue(c, encode({'E', {"key " + quote_untrusted(key) + " is already set"}}));
        break;
      case SetResult::full: queue(c, encode({'E', {why}})); break;
    }
    return true;
  }
  if (m.type == 'G' && m.fields.size() == 1) {
    std::optional<std::string_view> value;
    {
      std::lock_guard lock(mutex_);
      if (auto it = map_.find(key); it != map_.end()) value = it->second;
    }
    if (!value) {
      queue(c, encode({'N', {}}));
      return true;
    }
    // The value is sent from the map, not copied: every rank may read the same one.
    std::string head;
    put_u32(head, static_cast<uint32_t>(1 + 4 + value->size()));
    head += 'V';
    put_u32(head, static_cast<uint32_t>(value->size()));
    c.out.push_back({std::move(head), *value});
    return true;
  }
  if (m.type == 'C' && m.fields.size() == 1) {
    bool present = false;
    {
      std::lock_guard lock(mutex_);
      present = map_.count(key) != 0;  // never copies the value
    }
    queue(c, encode({present ? 'Y' : 'N', {}}));
    return true;
  }
  return false;
}

// 'W' {slice in ms, keys...}: answered when every key is set, or after the slice with
// those still missing.
bool TcpStoreServer::park(Conn& c, Message m) {
  if (m.fields.empty()) return false;
  long long slice = 0;
  const std::string& t = m.fields[0];
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), slice);
  if (ec != std::errc() || end != t.data() + t.size() || slice < 0) return false;
  for (size_t k = 1; k < m.fields.size(); ++k)
    if (m.fields[k].size() > kTcpStoreMaxKey) return refuse_key(c, m.fields[k].size());
  c.wait_keys.assign(std::make_move_iterator(m.fields.begin() + 1),
                     std::make_move_iterator(m.fields.end()));
  c.wait_next = 0;
  c.wait_until = Clock::now() + std::min<Ms>(Ms(slice), kMaxWaitSlice);
  c.parked = true;
  advance_wait(c, false);
  return true;
}

// Skips the keys of a parked wait that are set; answers it when none is left, else lists
// it under the first missing key (so that a set wakes one list, not every wait).
// `resume`: see finish_wait.
void TcpStoreServer::advance_wait(Conn& c, bool resume) {
  {
    std::lock_guard lock(mutex_);
    while (c.wait_next < c.wait_keys.size() && map_.count(c.wait_keys[c.wait_next]) != 0)
      ++c.wait_next;
  }
  if (c.wait_next == c.wait_keys.size()) {
    finish_wait(c, {}, resume);
    return;
  }
  auto& list = waiters_[c.wait_keys[c.wait_next]];
  c.wait_it = list.insert(list.end(), c.id);
  c.listed = true;
  if (!c.has_timer) set_timer(c, c.wait_until);
}

void TcpStoreServer::unlist(Conn& c) {
  if (!c.listed) return;
  c.listed = false;
  auto it = waiters_.find(c.wait_keys[c.wait_next]);
  if (it == waiters_.end()) return;
  it->second.erase(c.wait_it);
  if (it->second.empty()) waiters_.erase(it);
}

// Answers a parked wait. `resume`: the connection's later requests are served by the
// loop (resume_serving) rather than here, on another connection's call or a timer's, so
// that no chain of connections nests calls.
void TcpStoreServer::finish_wait(Conn& c, std::vector<std::string> missing, bool resume) {
  unlist(c);
  cancel_timer(c);
  c.parked = false;
  c.wait_keys.clear();
  queue(c, encode({'M', std::move(missing)}));
  if (resume) resume_.push_back(c.id);
}

void TcpStoreServer::resume_serving() {
  while (!resume_.empty()) {
    std::vector<uint64_t> ids;
    ids.swap(resume_);
    for (uint64_t id : ids) {
      Conn* c = find(id);
      if (c == nullptr || c->dead) continue;
      if (!c->parked && !serve_requests(*c)) kill(*c);
      if (!c->dead) {
        flush(*c);
        update_events(*c);
      }
    }
    sweep();
  }
}

void TcpStoreServer::wake_key(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::list<uint64_t> ids;
  ids.swap(it->second);
  waiters_.erase(it);
  for (uint64_t id : ids) {
    Conn* c = find(id);
    if (c == nullptr || c->dead || !c->parked || !c->listed) continue;
    c->listed = false;
    advance_wait(*c, true);
  }
}

// Sends what is queued until the socket is full; a failed send ends the connection.
void TcpStoreServer::flush(Conn& c) {
  while (!c.out.empty() && !c.dead) {
    std::array<iovec, 64> iov{};
    size_t n = 0;
    size_t skip = c.out_off;
    for (auto it = c.out.begin(); it != c.out.end() && n + 2 <= iov.size(); ++it) {
      std::string_view parts[2] = {it->head, it->body};
      for (std::string_view p : parts) {
        if (skip >= p.size()) {
          skip -= p.size();
          continue;
        }
        iov[n++] = {const_cast<char*>(p.data() + skip), p.size() - skip};
        skip = 0;
      }
    }
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = n;
    const ssize_t w = ::sendmsg(c.socket.get(), &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      kill(c);
      return;
    }
    size_t sent = static_cast<size_t>(w);
    while (sent > 0) {
      const size_t left = c.out.front().head.size() + c.out.front().body.size() - c.out_off;
      if (sent < left) {
        c.out_off += sent;
        break;
      }
      sent -= left;
      c.out.pop_front();
      c.out_off = 0;
    }
  }
  if (c.out.empty() && c.closing) kill(c);
}

void TcpStoreServer::update_events(Conn& c) {
  if (c.dead) return;
  const bool want_in = !c.closing && !(c.authed && (c.parked || c.out.size() >= kMaxQueued));
  const uint32_t events = EPOLLRDHUP | (want_in ? EPOLLIN : 0u) | (c.out.empty() ? 0u : EPOLLOUT);
  if (events == c.events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = c.id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.socket.get(), &ev) == 0) c.events = events;
  // A parked wait with requests already received resumes them when it is answered.
}

bool TcpStoreServer::refuse_request(Conn& c, const std::string& why) {
  queue(c, encode({'E', {"store at " + where_ + " refused this request: " + why}}));
  c.closing = true;
  c.in_off = c.in.size();  // nothing it sent is served
  return true;
}

bool TcpStoreServer::refuse_key(Conn& c, size_t bytes) {
  return refuse_request(c, "a key of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                               std::to_string(kTcpStoreMaxKey) + " bytes per key");
}

void TcpStoreServer::queue(Conn& c, std::string frame) { c.out.push_back({std::move(frame), {}}); }

}  // namespace commgrid::bootstrap::tcp
