// src/engine/thread_pool.h: the CPU engine's fixed pool of worker threads
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace luminav {
namespace cpu {

class ThreadPool;

// A fixed pool of worker threads; parallel_for hands out [0, n) in contiguous blocks, taken in
// turn by whichever thread is free (the caller works too). Work assignment never changes
// results: every reduction the engine does is over fixed chunks combined in index order.
// (Workers sleep between jobs: spinning for the next one made a step slower where torch's own
// OpenMP threads spin on the same cores after the backward pass.)
//
// With an OpenMP runtime already loaded in the process (torch's libgomp, or another runtime with
// the GOMP entry points: libiomp5, libomp), the pool makes no threads of its own: parallel_for
// runs its blocks on that runtime's team (GOMP_parallel): num_threads of them, or with
// num_threads <= 0 as many as omp_get_max_threads(), which torch.set_num_threads sets. Its
// threads are the ones torch's own CPU kernels use, already awake after the backward pass, so
// the step's passes neither wait for a wake-up nor compete for the cores with threads that spin
// (the pool's own threads did, with an explicit count too: on 2 cores a step with two of them
// took longer than with one). LUMINAV_CPU_POOL=threads keeps the pool's own threads, =openmp
// asks for the runtime's team (Error kInvalidArgument without one, or for any other value).
// Only Linux looks for a runtime; elsewhere the pool is its own.
std::shared_ptr<ThreadPool> make_thread_pool(int num_threads);  // <= 0: hardware_concurrency
int thread_pool_size(const ThreadPool& pool);

// The OpenMP runtime a pool runs on (thread_pool.cpp): GOMP_parallel and omp_get_max_threads
// of a loaded library, or null.
struct OpenMpTeam;

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads a job runs on (an OpenMP team's: omp_get_max_threads() now).
  int size() const;
  // "threads" (the pool's own) or "openmp (<library file>)".
  std::string kind() const;
  // Calls fn(begin, end) on contiguous, disjoint ranges covering [0, n), and returns when all
  // are done; the first exception thrown by any range is rethrown here.
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn);

 private:
  void worker_loop();
  void run_blocks();
  static void run_blocks_entry(void* pool);  // an OpenMP team thread's body
  void prepare_job(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn, int threads);

  const OpenMpTeam* omp_ = nullptr;

  int size_ = 1;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(std::int64_t, std::int64_t)>* job_ = nullptr;
  std::int64_t job_n_ = 0;
  std::int64_t block_ = 1;
  std::atomic<std::int64_t> next_{0};        // first index not yet handed out
  std::atomic<std::uint64_t> generation_{0};  // bumped (under mutex_) for every job
  std::atomic<int> pending_{0};               // workers still in the current job
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
};

}  // namespace cpu
}  // namespace luminav
