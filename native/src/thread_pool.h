// The runtime's own persistent threads. A forward pass is a sequence of parallel calls, each
// splitting its tasks into one contiguous range per thread (parallel_for) or handing them out
// in chunks to whichever thread claims them (parallel_for_dynamic). The calling thread works too,
// with numThreads - 1 workers, so a pass never has more than numThreads threads busy, and no
// other libuv thread ever computes. Inside a forward pass (a Pass scope) a worker
// polls for the next call: a decode step is ~80 calls microseconds apart, and a futex wake per
// call would cost more than the work of many of them. Outside one it sleeps almost at once, so
// between steps the cores belong to the event loop and the gateway.
#pragma once

#include <algorithm>
#include <atomic>
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

  // Scopes a forward pass: wakes sleeping workers on entry so they poll by the first call, and
  // lets them sleep again on exit.
  class Pass {
   public:
    explicit Pass(ThreadPool& pool) : pool_(pool) { pool_.begin_pass(); }
    ~Pass() { pool_.end_pass(); }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;

   private:
    ThreadPool& pool_;
  };

  // Calls body(thread_index, begin, end) on every thread with its share of [0, num_tasks) and
  // returns when all are done. One caller at a time, never from inside a body.
  template <typename Body>
  void parallel_for(int32_t num_tasks, const Body& body) {
    run(num_tasks, [](const void* context, int32_t thread_index, int32_t begin, int32_t end) {
      (*static_cast<const Body*>(context))(thread_index, begin, end);
    }, &body);
  }

  // Like parallel_for, but threads claim chunks in turn until none is left, so a thread slowed
  // down (a busier core, less memory bandwidth, a late wake-up) takes fewer. Chunks shrink as
  // the tasks run out (a quarter of what is left per thread, at least min_chunk_tasks), so the
  // threads finish close together. Only for bodies whose results do not depend on the thread.
  template <typename Body>
  void parallel_for_dynamic(int32_t num_tasks, int32_t min_chunk_tasks, const Body& body) {
    next_task_.store(0, std::memory_order_relaxed);
    parallel_for(num_threads_, [&](int32_t thread_index, int32_t, int32_t) {
      int32_t begin = next_task_.load(std::memory_order_relaxed);
      for (;;) {
        if (begin >= num_tasks) return;
        const int32_t guided = (num_tasks - begin) / (4 * num_threads_);
        const int32_t end = std::min(num_tasks, begin + std::max(min_chunk_tasks, guided));
        if (next_task_.compare_exchange_weak(begin, end, std::memory_order_relaxed)) {
          body(thread_index, begin, end);
          begin = next_task_.load(std::memory_order_relaxed);
        }
      }
    });
  }

 private:
  using Invoke = void (*)(const void* context, int32_t thread_index, int32_t begin, int32_t end);

  void run(int32_t num_tasks, Invoke invoke, const void* context);
  void run_share(int32_t thread_index) const;
  void worker_loop(int32_t thread_index);
  void begin_pass();
  void end_pass();
  // Polls ready() (tens of microseconds inside a pass, a few outside), then sleeps on changed_
  // until it holds or a pass begins.
  template <typename Ready>
  void await(const Ready& ready);
  void wake_sleepers();

  const int32_t num_threads_;
  std::vector<std::thread> workers_;

  // The current call, written by the caller before it bumps generation_.
  int32_t num_tasks_ = 0;
  Invoke invoke_ = nullptr;
  const void* context_ = nullptr;

  std::atomic<int32_t> next_task_{0};  // parallel_for_dynamic's next unclaimed task
  std::atomic<uint64_t> generation_{0};
  std::atomic<int32_t> num_busy_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<int32_t> num_sleepers_{0};
  std::atomic<bool> in_pass_{false};
  std::atomic<uint64_t> pass_epoch_{0};
  std::mutex mutex_;
  std::condition_variable changed_;
};

}  // namespace conduit
