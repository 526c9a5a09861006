// The memory store: ranks that are threads of one process.
#include <unordered_map>

#include "commgrid/store.hpp"
#include "secrets.hpp"

namespace commgrid {
namespace {

class MemoryStore final : public Store {
 public:
  // Its ranks are threads of this process; the secret still keeps a stranger on the
  // loopback out of their Gloo pairs.
  MemoryStore() { set_job_secret(bootstrap::random_hex(32)); }
  std::string uri() const override { return "memory"; }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    if (!map_.emplace(key, value).second)
      throw BackendError("store set on memory: key '" + key + "' is already set");
  }
  bool do_set_if_absent(const std::string& key, const std::vector<char>& value) override {
    return map_.emplace(key, value).second;
  }
  std::vector<char> do_get(const std::string& key) override { return map_.at(key); }
  bool do_has(const std::string& key) override { return map_.count(key) != 0; }

 private:
  std::unordered_map<std::string, std::vector<char>> map_;  // guarded by Store's mutex
};

}  // namespace

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

}  // namespace commgrid
