// The runtime's own persistent threads. A forward pass is a sequence of parallel_for calls, each
// splitting its tasks into one contiguous range per thread; the calling thread only waits, so the
// compute never runs on libuv's pool.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace conduit {

class ThreadPool {
 public:
  explicit ThreadPool(int32_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t num_threads() const { return num_threads_; }

  // Calls body(thread_index, begin, end) on every thread with its share of [0, num_tasks) and
  // returns when all are done. One caller at a time, never from inside a body.
  template <typename Body>
  void parallel_for(int32_t num_tasks, const Body& body) {
    run(num_tasks, [](const void* context, int32_t thread_index, int32_t begin, int32_t end) {
      (*static_cast<const Body*>(context))(thread_index, begin, end);
    }, &body);
  }

 private:
  using Invoke = void (*)(const void* context, int32_t thread_index, int32_t begin, int32_t end);

  void run(int32_t num_tasks, Invoke invoke, const void* context);
  void worker_loop(int32_t thread_index);

  const int32_t num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  uint64_t generation_ = 0;
  int32_t num_busy_ = 0;
  bool stopping_ = false;
  int32_t num_tasks_ = 0;
  Invoke invoke_ = nullptr;
  const void* context_ = nullptr;
};

}  // namespace conduit
