// tests/fakes/counting_new.cpp: the program's operator new, counted, for the tests that assert a
// step makes no host allocation (linked only into them: it replaces the whole program's allocator)
//
// The replacement pair is malloc/free on both sides; GCC, seeing free() in a replaced operator
// delete, cannot tell that the matching operator new is replaced too, hence the pragma.
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

#include "fakes/fake_cuda_device.h"

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
std::atomic<long long> g_news{0};
}  // namespace

void* operator new(std::size_t n) {
  ++g_news;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// The nothrow form too (std::stable_sort's temporary buffer takes it): left to the runtime, it
// would be the sanitizer's allocation freed here by free(), an alloc-dealloc mismatch.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  ++g_news;
  return std::malloc(n == 0 ? 1 : n);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

long long luminav_test::host_allocations() { return g_news.load(); }
