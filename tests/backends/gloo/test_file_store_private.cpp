// File store keys are private from the moment they exist: with umask 022, a thread that
// watches the folder (inotify) never sees a key's file, or its temporary file, with any
// group or other permission bit, and every value reads back as written.
#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <poll.h>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "commgrid/store.hpp"

namespace commgrid::test {
namespace {

// Sets the process umask for the scope (tests run one at a time in this process).
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : before_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(before_); }

 private:
  mode_t before_;
};

// Stats every file the folder reports as created, moved in, written or changed, as soon as
// it is told, and keeps the names seen with a group or other permission bit.
class FolderWatcher {
 public:
  explicit FolderWatcher(std::string folder) : folder_(std::move(folder)) {
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ < 0) return;
    if (::inotify_add_watch(fd_, folder_.c_str(),
                            IN_CREATE | IN_MOVED_TO | IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB) < 0)
      return;
    thread_ = std::jthread([this] { run(); });
  }
  ~FolderWatcher() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return thread_.joinable(); }
  int events() const { return events_.load(); }
  // Stops after the events already queued are handled.
  std::vector<std::string> finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return open_;
  }

 private:
  void run() {
    alignas(inotify_event) char buf[64 * 1024];
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, 20);
      if (ready <= 0) {
        if (stop_) return;
        continue;
      }
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      for (ssize_t at = 0; n > 0 && at < n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf + at);
        at += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
        if (ev->len == 0) continue;
        ++events_;
        const std::string path = folder_ + "/" + ev->name;
        struct stat st {};
        if (::lstat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
          open_.push_back(std::string(ev->name) + " mode " + std::to_string(st.st_mode & 0777));
      }
    }
  }

  std::string folder_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> events_{0};
  std::vector<std::string> open_;
  std::jthread thread_;
};

TEST(GlooFileStoreModes, KeyFilesAreNeverSeenWithGroupOrOtherPermissions) {
  ScopedUmask mask(022);
  std::string pattern = (std::filesystem::temp_directory_path() / "commgrid-modes-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::string dir = pattern;
  {
    FolderWatcher watcher(dir);
    if (!watcher.ok()) GTEST_SKIP() << "inotify is not available here: " << std::strerror(errno);
    auto store = open_store("file://" + dir, StoreOptions{"modes", "t0k", std::chrono::seconds(5)});
    constexpr int kKeys = 400;
    for (int k = 0; k < kKeys; ++k) {
      const std::string v =
          "value " + std::to_string(k) + std::string(static_cast<size_t>(k % 97), 'x');
      store->set("key/" + std::to_string(k), std::span<const char>(v.data(), v.size()));
    }
    for (int k = 0; k < kKeys; ++k) {
      const std::string v =
          "value " + std::to_string(k) + std::string(static_cast<size_t>(k % 97), 'x');
      ASSERT_TRUE(store->has("key/" + std::to_string(k)));
      const std::vector<char> got = store->get("key/" + std::to_string(k));
      ASSERT_EQ(std::string(got.begin(), got.end()), v) << "key " << k;
    }
    // A key is written once.
    const std::string again = "again";
    EXPECT_THROW(store->set("key/0", std::span<const char>(again.data(), again.size())),
                 BackendError);
    const std::vector<std::string> seen = watcher.finish();
    EXPECT_GE(watcher.events(), kKeys) << "the watcher saw too little to mean anything";
    EXPECT_TRUE(seen.empty()) << seen.size() << " files seen readable by others, e.g. "
                              << seen.front();
    // And at rest: every file in the folder is private, no temporary file is left over.
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      struct stat st {};
      ASSERT_EQ(::lstat(entry.path().c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 0777, 0600u) << entry.path();
      EXPECT_NE(entry.path().filename().string().front(), '.') << "left over: " << entry.path();
      ++files;
    }
    EXPECT_EQ(files, kKeys + 1);  // the keys and the job's claim
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace commgrid::test
