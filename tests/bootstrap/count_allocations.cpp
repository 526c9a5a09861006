// Every byte the store test program allocates with operator new, counted (to see what a
// call copies). In a file of its own: the replaced operators are not inlined where the
// compiler would take them for a mismatched pair.
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace commgrid::test {
std::atomic<std::size_t> g_allocated{0};
}

void* operator new(std::size_t n) {
  commgrid::test::g_allocated.fetch_add(n, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
