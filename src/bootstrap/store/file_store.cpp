// The file store: one 0600 file per key in a folder, for processes of one machine or a
// shared file system; the folder is claimed for one job (job_claim.hpp).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "commgrid/store.hpp"
#include "job_claim.hpp"
#include "text.hpp"

namespace commgrid {
namespace {

// One file per key in a folder. A key (a rank's address) is the job's business only: each
// file is written private (0600) from its creation under a temporary name in the same
// folder, then linked into place, which also refuses a key that exists and makes a reader
// see either no file or the whole value. Keys may hold any byte, so file names are the
// key in hex.
class FileStore final : public Store {
 public:
  FileStore(std::string folder, std::string secret) : folder_(std::move(folder)) {
    set_job_secret(std::move(secret));
  }
  [[nodiscard]] std::string uri() const override { return "file://" + folder_; }

 protected:
  void do_set(const std::string& key, const std::vector<char>& data) override {
    if (!link_new(key, data))
      throw BackendError("file store " + folder_ + ": key '" + key + "' is already set");
  }
  // link(2) refuses a name that exists, atomically on the file system (NFS included), so
  // of the processes racing for a key exactly one links its file.
  bool do_set_if_absent(const std::string& key, const std::vector<char>& data) override {
    return link_new(key, data);
  }
  std::vector<char> do_get(const std::string& key) override {
    std::ifstream in(path_of(key), std::ios::binary);
    if (!in) throw BackendError("file store " + folder_ + ": cannot read key '" + key + "'");
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  bool do_has(const std::string& key) override { return ::access(path_of(key).c_str(), F_OK) == 0; }

 private:
  // Writes `data` under a temporary name and links it to the key's file: false when the key
  // exists.
  bool link_new(const std::string& key, const std::vector<char>& data) {
    static std::atomic<unsigned long> serial{0};
    const std::string path = path_of(key);
    const std::string tmp =
        folder_ + "/.tmp-" + std::to_string(::getpid()) + "-" + std::to_string(serial.fetch_add(1));
    auto fail = [&](const std::string& what, int err) -> BackendError {
      return BackendError("file store " + folder_ + ": " + what + " for key '" + key +
                          "': " + std::strerror(err));
    };
    const int fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) throw fail("cannot create " + tmp, errno);
    size_t done = 0;
    int err = 0;
    while (done < data.size()) {
      const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : EIO;
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0 && err == 0) err = errno;
    const int linked = err == 0 ? ::link(tmp.c_str(), path.c_str()) : -1;
    const int link_err = errno;
    ::unlink(tmp.c_str());
    if (err != 0) throw fail("cannot write " + tmp, err);
    if (linked != 0) {
      if (link_err == EEXIST) return false;
      throw fail("cannot link " + tmp + " to " + path, link_err);
    }
    return true;
  }
  [[nodiscard]] std::string path_of(const std::string& key) const {
    return folder_ + "/key-" + bootstrap::hex_of(key);
  }
  std::string folder_;
};

// Claims a file store folder: the record is written to a private file and linked into
// place, which fails if a claim exists (rename would replace it). Returns the job secret.
std::string claim_folder(const std::string& folder, const StoreOptions& o) {
  const std::string path = folder + "/commgrid-job";
  const std::string mine = bootstrap::new_claim(o);
  std::string tmp = folder + "/.commgrid-job-XXXXXX";
  int fd = ::mkstemp(tmp.data());  // 0600
  if (fd < 0)
    throw BackendError("file store " + folder + ": cannot write a claim: " + std::strerror(errno));
  const bool written = ::write(fd, mine.data(), mine.size()) == static_cast<ssize_t>(mine.size());
  ::close(fd);
  const int linked = written ? ::link(tmp.c_str(), path.c_str()) : -1;
  const int link_errno = errno;
  ::unlink(tmp.c_str());
  if (!written) throw BackendError("file store " + folder + ": cannot write a claim");
  if (linked == 0) return bootstrap::parse_claim(mine).secret;
  if (link_errno != EEXIST)
    throw BackendError("file store " + folder + ": cannot claim: " + std::strerror(link_errno));
  std::ifstream in(path, std::ios::binary);
  std::string found((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return bootstrap::accept_claim("file://" + folder, found, o);
}

}  // namespace

std::shared_ptr<Store> make_file_store(const std::string& folder, const StoreOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec))
    throw ConfigError("store", "file store '" + folder + "': not an existing folder");
  auto store = std::make_shared<FileStore>(folder, claim_folder(folder, options));
  bootstrap::join_as_rank(*store, options);
  return store;
}

}  // namespace commgrid
