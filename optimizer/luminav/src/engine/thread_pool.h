// src/engine/thread_pool.h: the CPU engine's fixed pool of worker threads
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace luminav {
namespace cpu {

class ThreadPool;

// A fixed pool of worker threads; parallel_for splits [0, n) into contiguous ranges.
// Work assignment never changes results: every reduction the engine does is over fixed
// chunks combined in index order.
std::shared_ptr<ThreadPool> make_thread_pool(int num_threads);  // <= 0: hardware_concurrency
int thread_pool_size(const ThreadPool& pool);

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }
  // Calls fn(begin, end) on contiguous, disjoint ranges covering [0, n), one per thread, and
  // returns when all are done; the first exception thrown by any range is rethrown here.
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn);

 private:
  void worker_loop(int t);
  void run_part(int t);

  int size_ = 1;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(std::int64_t, std::int64_t)>* job_ = nullptr;
  std::int64_t job_n_ = 0;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace cpu
}  // namespace luminav
