// tests/test_thread_pool.cpp: the CPU engine's pool (src/engine/thread_pool.cpp): its own threads,
// and the team of an OpenMP runtime already loaded in the process (as torch loads libgomp)
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <dlfcn.h>
#endif

#include "engine/thread_pool.h"
#include "luminav/error.h"

namespace cpu = luminav::cpu;

namespace {

// Every index of [0, n) handed out exactly once, in ranges inside [0, n).
void expect_each_index_once(cpu::ThreadPool& pool, std::int64_t n) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  for (auto& h : hits) h.store(0);
  std::atomic<bool> out_of_range{false};
  pool.parallel_for(n, [&](std::int64_t begin, std::int64_t end) {
    if (begin < 0 || end > n || begin >= end) out_of_range.store(true);
    for (std::int64_t i = begin; i < end && i < n; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
  });
  EXPECT_FALSE(out_of_range.load());
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << "index " << i;
}

void expect_first_error_rethrown(cpu::ThreadPool& pool) {
  EXPECT_THROW(pool.parallel_for(1000,
                                 [&](std::int64_t begin, std::int64_t end) {
                                   if (begin <= 500 && 500 < end) throw std::runtime_error("block of 500");
                                 }),
               std::runtime_error);
  expect_each_index_once(pool, 1000);  // the pool still works after a failed job
}

#if defined(__linux__)
// libgomp loaded as torch loads it (once, for the rest of the test program), or null.
void* load_libgomp() {
  static void* handle = dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL);
  return handle;
}
#endif

struct PoolEnv {  // LUMINAV_CPU_POOL for one test
  explicit PoolEnv(const char* value) { setenv("LUMINAV_CPU_POOL", value, 1); }
  ~PoolEnv() { unsetenv("LUMINAV_CPU_POOL"); }
};

}  // namespace

TEST(ThreadPool, OwnThreadsHandOutEveryIndexOnce) {
  PoolEnv env("threads");
  auto pool = cpu::make_thread_pool(3);
  EXPECT_EQ(pool->kind(), "threads");
  EXPECT_EQ(pool->size(), 3);
  for (std::int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) expect_each_index_once(*pool, n);
  expect_first_error_rethrown(*pool);
}

TEST(ThreadPool, RunsOnTheTeamOfALoadedOpenMpRuntime) {
#if defined(__linux__)
  void* gomp = load_libgomp();
  if (!gomp) GTEST_SKIP() << "no libgomp.so.1 on this machine: " << dlerror();
  auto max_threads = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_get_max_threads"));
  auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(gomp, "omp_set_num_threads"));
  ASSERT_NE(max_threads, nullptr);
  ASSERT_NE(set_threads, nullptr);
  auto pool = cpu::make_thread_pool(0);
  EXPECT_EQ(pool->kind().rfind("openmp (libgomp", 0), 0u) << pool->kind();
  EXPECT_EQ(pool->size(), max_threads());
  const int before = max_threads();
  set_threads(3);  // as torch.set_num_threads(3): the next job runs on three threads
  EXPECT_EQ(pool->size(), 3);
  std::mutex mutex;
  std::set<std::thread::id> ids;
  pool->parallel_for(3000, [&](std::int64_t, std::int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_GE(ids.size(), 1u);
  EXPECT_LE(ids.size(), 3u);
  for (std::int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) expect_each_index_once(*pool, n);
  expect_first_error_rethrown(*pool);
  set_threads(before);
#else
  GTEST_SKIP() << "the pool looks for a loaded OpenMP runtime on Linux only";
#endif
}

TEST(ThreadPool, KeepsItsOwnThreadsWhenAskedTo) {
#if defined(__linux__)
  if (!load_libgomp()) GTEST_SKIP() << "no libgomp.so.1 on this machine";
#endif
  {
    PoolEnv env("threads");
    auto pool = cpu::make_thread_pool(0);
    EXPECT_EQ(pool->kind(), "threads");
    EXPECT_EQ(pool->size(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    expect_each_index_once(*pool, 1000);
  }
  PoolEnv env("threads");
  auto explicit_count = cpu::make_thread_pool(2);
  EXPECT_EQ(explicit_count->kind(), "threads");
  EXPECT_EQ(explicit_count->size(), 2);
}

TEST(ThreadPool, RunsAnExplicitCountOnTheTeam) {
#if defined(__linux__)
  void* gomp = load_libgomp();
  if (!gomp) GTEST_SKIP() << "no libgomp.so.1 on this machine: " << dlerror();
  // a count of its own runs on the runtime's threads too: a team of that many, whatever
  // omp_get_max_threads() says
  for (int n : {1, 2, 3}) {
    auto pool = cpu::make_thread_pool(n);
    EXPECT_EQ(pool->kind().rfind("openmp (libgomp", 0), 0u) << pool->kind();
    EXPECT_EQ(pool->size(), n);
    std::mutex mutex;
    std::set<std::thread::id> ids;
    pool->parallel_for(3000, [&](std::int64_t, std::int64_t) {
      std::lock_guard<std::mutex> lock(mutex);
      ids.insert(std::this_thread::get_id());
    });
    EXPECT_GE(ids.size(), 1u);
    EXPECT_LE(ids.size(), static_cast<std::size_t>(n));
    for (std::int64_t k : {1, 2, 7, 1000, 4097}) expect_each_index_once(*pool, k);
  }
#else
  GTEST_SKIP() << "the pool looks for a loaded OpenMP runtime on Linux only";
#endif
}

TEST(ThreadPool, RefusesAPoolNameItDoesNotKnow) {
  PoolEnv env("omp");
  try {
    cpu::make_thread_pool(0);
    FAIL() << "LUMINAV_CPU_POOL=omp was taken";
  } catch (const luminav::Error& e) {
    EXPECT_EQ(e.status(), luminav::Status::kInvalidArgument);
    const std::string what = e.what();
    EXPECT_NE(what.find("LUMINAV_CPU_POOL='omp'"), std::string::npos) << what;
    EXPECT_NE(what.find("use threads"), std::string::npos) << what;
  }
}

TEST(ThreadPool, OpenMpAskedForIsTheRuntimesTeam) {
#if defined(__linux__)
  if (!load_libgomp()) GTEST_SKIP() << "no libgomp.so.1 on this machine";
  PoolEnv env("openmp");
  auto pool = cpu::make_thread_pool(0);
  EXPECT_EQ(pool->kind().rfind("openmp (", 0), 0u) << pool->kind();
  expect_each_index_once(*pool, 1000);
#else
  GTEST_SKIP() << "the pool looks for a loaded OpenMP runtime on Linux only";
#endif
}
