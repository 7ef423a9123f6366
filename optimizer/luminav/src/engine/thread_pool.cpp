// src/engine/thread_pool.cpp: the CPU engine's fixed pool of worker threads
#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/thread_pool.h"
#include "luminav/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
#endif

namespace luminav {
namespace cpu {

namespace {

constexpr int kDoneSpins = 4000;  // pause()s: some tens of microseconds

inline void pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

// The GOMP entry points of an OpenMP runtime loaded in the process (libgomp's ABI, which
// libiomp5 and LLVM's libomp also export).
struct OpenMpTeam {
  void (*parallel)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) = nullptr;
  int (*max_threads)() = nullptr;
  std::string library;  // the file name, for kind()
};

namespace {

#if defined(__linux__)
bool is_openmp_runtime(const char* path) {
  const char* slash = std::strrchr(path, '/');
  const char* base = slash ? slash + 1 : path;
  for (const char* prefix : {"libgomp", "libiomp5", "libomp"})
    if (std::strncmp(base, prefix, std::strlen(prefix)) == 0) return true;
  return false;
}

int find_runtime(struct dl_phdr_info* info, size_t, void* out) {
  if (info->dlpi_name && *info->dlpi_name && is_openmp_runtime(info->dlpi_name)) {
    *static_cast<std::string*>(out) = info->dlpi_name;
    return 1;
  }
  return 0;
}

// A runtime that is already loaded (never loads one), looked up until one is found; then that
// one for the rest of the process (its handle stays open, the entry points in a static).
const OpenMpTeam* loaded_openmp() {
  static std::mutex mutex;
  static OpenMpTeam team;
  static bool found = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (found) return &team;
  std::string path;
  dl_iterate_phdr(find_runtime, &path);
  if (path.empty()) return nullptr;
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!handle) return nullptr;
  team.parallel = reinterpret_cast<decltype(team.parallel)>(dlsym(handle, "GOMP_parallel"));
  team.max_threads = reinterpret_cast<decltype(team.max_threads)>(dlsym(handle, "omp_get_max_threads"));
  if (!team.parallel || !team.max_threads) {
    dlclose(handle);
    return nullptr;
  }
  const char* slash = std::strrchr(path.c_str(), '/');
  team.library = slash ? slash + 1 : path;
  found = true;
  return &team;
}
#else
const OpenMpTeam* loaded_openmp() { return nullptr; }
#endif

// LUMINAV_CPU_POOL: unset or empty (a loaded OpenMP runtime's team, else own threads),
// "threads" or "openmp" (which then must be there).
enum class PoolChoice { kAuto, kThreads, kOpenMp };

PoolChoice pool_choice() {
  const char* env = std::getenv("LUMINAV_CPU_POOL");
  if (!env || !*env) return PoolChoice::kAuto;
  if (std::strcmp(env, "threads") == 0) return PoolChoice::kThreads;
  if (std::strcmp(env, "openmp") == 0) return PoolChoice::kOpenMp;
  throw Error(Status::kInvalidArgument,
              std::string("LUMINAV_CPU_POOL='") + env + "' is not a pool: use threads (the engine's own) or openmp "
              "(the OpenMP runtime loaded in the process, torch's), or unset it for openmp where there is one");
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const PoolChoice choice = pool_choice();
  if (choice != PoolChoice::kThreads) omp_ = loaded_openmp();
  if (choice == PoolChoice::kOpenMp && !omp_)
    throw Error(Status::kInvalidArgument,
                "LUMINAV_CPU_POOL=openmp, but no OpenMP runtime with GOMP_parallel is loaded in this process (torch "
                "loads one where its build uses OpenMP); unset it or use threads");
  if (omp_) {
    size_ = num_threads > 0 ? num_threads : 0;  // 0: the team's size, read at each job
    return;
  }
  if (num_threads <= 0) {
    num_threads = static_cast<int>(std::thread::hardware_concurrency());
    if (num_threads <= 0) num_threads = 1;
  }
  size_ = num_threads;
  // The calling thread works too; the pool holds the others.
  for (int t = 1; t < size_; ++t) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_blocks() {
  for (;;) {
    const std::int64_t begin = next_.fetch_add(block_, std::memory_order_relaxed);
    if (begin >= job_n_) return;
    const std::int64_t end = std::min(job_n_, begin + block_);
    try {
      (*job_)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_.load(std::memory_order_acquire) ||
                                    generation_.load(std::memory_order_acquire) != seen; });
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    run_blocks();
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
  }
}

int ThreadPool::size() const { return omp_ && size_ == 0 ? std::max(1, omp_->max_threads()) : size_; }

std::string ThreadPool::kind() const { return omp_ ? "openmp (" + omp_->library + ")" : "threads"; }

void ThreadPool::run_blocks_entry(void* pool) { static_cast<ThreadPool*>(pool)->run_blocks(); }

void ThreadPool::prepare_job(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn,
                             int threads) {
  std::lock_guard<std::mutex> lock(mutex_);
  job_ = &fn;
  job_n_ = n;
  // a few blocks per thread, so a thread that starts late still gets its share
  block_ = std::max<std::int64_t>(1, n / (4 * static_cast<std::int64_t>(threads)));
  next_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
}

void ThreadPool::parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (n <= 0) return;
  // One caller at a time: the pool is shared by every group of an engine.
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  const int threads = size();
  if (threads == 1 || n == 1) {
    fn(0, n);
    return;
  }
  prepare_job(n, fn, threads);
  if (omp_) {
    // the team runs the blocks (run_blocks catches every exception: none crosses the runtime)
    // and GOMP_parallel returns once every thread of it is done
    omp_->parallel(&ThreadPool::run_blocks_entry, this, static_cast<unsigned>(threads), 0);
  } else {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.store(size_ - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    run_blocks();
    // The workers end their last blocks within microseconds of the caller (the blocks are small
    // and taken in turn): a short spin on pending_ before sleeping saves the caller's futex sleep
    // and wake-up on most jobs. Only the caller spins, only here; the workers still sleep.
    for (int spin = 0; spin < kDoneSpins && pending_.load(std::memory_order_acquire) != 0; ++spin) pause();
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
  }
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

std::shared_ptr<ThreadPool> make_thread_pool(int num_threads) {
  return std::make_shared<ThreadPool>(num_threads);
}

int thread_pool_size(const ThreadPool& pool) { return pool.size(); }

}  // namespace cpu
}  // namespace luminav
