// src/engine/thread_pool.cpp: the CPU engine's fixed pool of worker threads
#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/thread_pool.h"

namespace luminav {
namespace cpu {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) {
    num_threads = static_cast<int>(std::thread::hardware_concurrency());
    if (num_threads <= 0) num_threads = 1;
  }
  size_ = num_threads;
  // The calling thread is worker 0; the pool holds the others.
  for (int t = 1; t < size_; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_part(int t) {
  const std::int64_t begin = job_n_ * t / size_;
  const std::int64_t end = job_n_ * (t + 1) / size_;
  if (begin >= end) return;
  try {
    (*job_)(begin, end);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::worker_loop(int t) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_part(t);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
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
    error_ = nullptr;
    pending_ = size_ - 1;
    ++generation_;
  }
  wake_.notify_all();
  run_part(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
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
