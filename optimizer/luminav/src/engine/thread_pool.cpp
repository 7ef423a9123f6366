// src/engine/thread_pool.cpp: the CPU engine's fixed pool of worker threads
#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
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

ThreadPool::ThreadPool(int num_threads) {
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

void ThreadPool::parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (n <= 0) return;
  // One caller at a time: the pool is shared by every group of an engine.
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  if (size_ == 1 || n == 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    // a few blocks per thread, so a thread that starts late still gets its share
    block_ = std::max<std::int64_t>(1, n / (4 * static_cast<std::int64_t>(size_)));
    next_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
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
