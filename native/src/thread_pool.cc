#include "thread_pool.h"

namespace conduit {

ThreadPool::ThreadPool(int32_t num_threads) : num_threads_(num_threads) {
  workers_.reserve(size_t(num_threads));
  for (int32_t i = 0; i < num_threads; ++i) workers_.emplace_back(&ThreadPool::worker_loop, this, i);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::run(int32_t num_tasks, Invoke invoke, const void* context) {
  if (num_tasks <= 0) return;
  std::unique_lock<std::mutex> lock(mutex_);
  num_tasks_ = num_tasks;
  invoke_ = invoke;
  context_ = context;
  num_busy_ = num_threads();
  ++generation_;
  work_ready_.notify_all();
  work_done_.wait(lock, [this] { return num_busy_ == 0; });
}

void ThreadPool::worker_loop(int32_t thread_index) {
  uint64_t seen_generation = 0;
  for (;;) {
    int32_t num_tasks;
    Invoke invoke;
    const void* context;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
      num_tasks = num_tasks_;
      invoke = invoke_;
      context = context_;
    }
    const int32_t begin = int32_t(num_tasks * int64_t(thread_index) / int64_t(num_threads_));
    const int32_t end = int32_t(num_tasks * int64_t(thread_index + 1) / int64_t(num_threads_));
    if (begin < end) invoke(context, thread_index, begin, end);
    std::lock_guard<std::mutex> lock(mutex_);
    if (--num_busy_ == 0) work_done_.notify_one();
  }
}

}  // namespace conduit
