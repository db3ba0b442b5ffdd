#include "thread_pool.h"

namespace conduit {

namespace {

// Inside a pass, polling (tens of microseconds) outlasts the serial steps between two calls; a
// longer poll (milliseconds) only mattered when the OS preempted the caller, and then the poller
// held a core the gateway needed (conduit-tiny served to 16 clients: 1,890-2,120 tok/s polling
// 2,000,000 iterations, 2,260-2,710 at 50,000, 2,230-2,550 before passes existed; batch-1 decode
// of the 125 M model no slower). Outside a pass, a few microseconds: polling through the
// JavaScript between two steps made the runtime alone faster but the served model slower,
// because on 2 cores the polling thread takes the core that the worker's event loop and the
// gateway need (16 clients: 1,820-2,580 tok/s polling long, 2,580-2,730 short). No PAUSE: under
// KVM a run of PAUSEs trips pause-loop exiting and the hypervisor deschedules the polling vCPU
// (measured: decode -40%).
constexpr int32_t kPassSpinIterations = 50000;
constexpr int32_t kIdleSpinIterations = 2000;

inline void cpu_relax() { __asm__ __volatile__("" ::: "memory"); }

}  // namespace

ThreadPool::ThreadPool(int32_t num_threads) : num_threads_(num_threads) {
  workers_.reserve(size_t(num_threads - 1));
  for (int32_t i = 1; i < num_threads; ++i) workers_.emplace_back(&ThreadPool::worker_loop, this, i);
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  wake_sleepers();
  for (std::thread& worker : workers_) worker.join();
}

template <typename Ready>
void ThreadPool::await(const Ready& ready) {
  for (;;) {
    const uint64_t pass_epoch = pass_epoch_.load();
    for (int32_t i = 0; i < kPassSpinIterations; ++i) {
      if (ready()) return;
      if (i >= kIdleSpinIterations && !in_pass_.load(std::memory_order_relaxed)) break;
      cpu_relax();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    num_sleepers_.fetch_add(1);
    changed_.wait(lock, [&] { return ready() || pass_epoch_.load() != pass_epoch; });
    num_sleepers_.fetch_sub(1);
    if (ready()) return;
  }
}

void ThreadPool::begin_pass() {
  in_pass_.store(true);
  pass_epoch_.fetch_add(1);
  wake_sleepers();
}

void ThreadPool::end_pass() { in_pass_.store(false); }

// After every change someone may await. Taking the mutex orders the notification after a
// sleeper's last look at its condition.
void ThreadPool::wake_sleepers() {
  if (num_sleepers_.load() == 0) return;
  { std::lock_guard<std::mutex> lock(mutex_); }
  changed_.notify_all();
}

void ThreadPool::run(int32_t num_tasks, Invoke invoke, const void* context) {
  if (num_tasks <= 0) return;
  num_tasks_ = num_tasks;
  invoke_ = invoke;
  context_ = context;
  num_busy_.store(num_threads_ - 1);
  generation_.fetch_add(1);
  wake_sleepers();
  run_share(0);
  await([this] { return num_busy_.load() == 0; });
}

void ThreadPool::run_share(int32_t thread_index) const {
  const int32_t begin = int32_t(num_tasks_ * int64_t(thread_index) / int64_t(num_threads_));
  const int32_t end = int32_t(num_tasks_ * int64_t(thread_index + 1) / int64_t(num_threads_));
  if (begin < end) invoke_(context_, thread_index, begin, end);
}

void ThreadPool::worker_loop(int32_t thread_index) {
  uint64_t seen_generation = 0;
  for (;;) {
    await([&] { return stopping_.load() || generation_.load() != seen_generation; });
    if (stopping_.load()) return;
    seen_generation = generation_.load();
    run_share(thread_index);
    if (num_busy_.fetch_sub(1) == 1) wake_sleepers();
  }
}

}  // namespace conduit
