// The thread pool under stress, run by thread-pool.test.ts: thousands of calls with random task
// counts, chunk sizes and task lengths on 1 to 8 threads, with pauses between calls that send
// the workers to sleep and calls whose tasks outlast the polling (so the caller sleeps too), and
// the active thread count changed between calls (no thread beyond it may run a range), then
// again with the count changed from another thread at random moments, mid-call included (as the
// engine does when a grammar compile ends).
// Half the calls run inside submitted tasks (the driver thread as their caller, as a forward pass
// runs), so the gaps between passes, short and long, drive the polling between passes too.
// Every task must run exactly once, in a range handed to one thread at a time (a call of one
// chunk: the caller's, whole), and a call must not return before its tasks are done; a lost
// wake-up hangs, and the test's timeout fails it.
//
//   thread_pool_stress SEED [NUM_CALLS_PER_THREAD_COUNT]
// Prints one line per thread count; exits non-zero on the first violation, naming the seed.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "../src/thread_pool.h"

namespace {

int32_t g_seed = 0;

[[noreturn]] void fail(const char* what, int32_t num_threads, int32_t call, int64_t detail) {
  std::fprintf(stderr, "thread_pool_stress: seed %d, %d threads, call %d: %s (%lld)\n", g_seed, num_threads, call, what,
               static_cast<long long>(detail));
  std::exit(1);
}

// Busy work of about the given length, which the compiler cannot drop.
void spin_for_ns(int64_t ns) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (std::chrono::steady_clock::now() < until) {
  }
}

struct Shape {
  int32_t num_tasks;
  int32_t min_chunk_tasks;
  int64_t task_ns;      // each task's work (0 for most)
  int64_t pause_ns;     // the caller's pause before the call (sends waiting workers to sleep)
  bool every_thread;    // on_every_thread instead of parallel_for
  bool submitted;       // made by a task submitted to the driver thread
};

// Runs call on the pool's driver thread and waits for it to end, as the event loop waits for a
// forward pass.
void run_submitted(conduit::ThreadPool& pool, const std::function<void()>& call) {
  struct Pass {
    const std::function<void()>* call;
    std::mutex mutex;
    std::condition_variable ended;
    bool done = false;
  } pass;
  pass.call = &call;
  pool.submit([](void* context) {
    Pass& p = *static_cast<Pass*>(context);
    (*p.call)();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.done = true;
    p.ended.notify_one();
  }, &pass);
  std::unique_lock<std::mutex> lock(pass.mutex);
  pass.ended.wait(lock, [&] { return pass.done; });
}

Shape draw_shape(std::mt19937_64& rng) {
  Shape shape{};
  const uint64_t kind = rng() % 100;
  if (kind < 40) {
    shape.num_tasks = int32_t(rng() % 5);  // 0 to 4 tasks: fewer than the threads
  } else if (kind < 80) {
    shape.num_tasks = int32_t(rng() % 200);
  } else {
    shape.num_tasks = int32_t(rng() % 20000);
  }
  shape.min_chunk_tasks = rng() % 4 == 0 ? int32_t(1 + rng() % 16) : 1;
  const uint64_t length = rng() % 100;
  shape.task_ns = length < 70 ? 0 : length < 98 ? int64_t(rng() % 2000) : int64_t(rng() % 400'000);
  if (shape.task_ns > 2000) shape.num_tasks = int32_t(rng() % 8);  // long tasks: the caller waits, then sleeps
  if (shape.num_tasks > 200) shape.task_ns = std::min<int64_t>(shape.task_ns, 200);
  const uint64_t pause = rng() % 100;
  shape.pause_ns = pause < 90 ? 0 : pause < 98 ? int64_t(rng() % 300'000) : int64_t(rng() % 3'000'000);
  shape.every_thread = rng() % 20 == 0;
  shape.submitted = rng() % 2 == 0;
  return shape;
}

void stress(int32_t num_threads, int32_t num_calls, std::mt19937_64& rng, bool changed_concurrently) {
  conduit::ThreadPool pool(num_threads);
  int32_t active_threads_cell = 0;
  pool.set_active_threads(&active_threads_cell);
  const auto set_active_threads = [&active_threads_cell](int32_t count) { __atomic_store_n(&active_threads_cell, count, __ATOMIC_SEQ_CST); };
  // The other thread's changes: any count (0: all), every 0-50 us; on_every_thread is left out,
  // as it needs every thread.
  std::atomic<bool> changing{changed_concurrently};
  std::thread changer([&, seed = rng()] {
    std::mt19937_64 changer_rng(seed);
    while (changing.load()) {
      set_active_threads(int32_t(changer_rng() % uint64_t(num_threads + 1)));
      std::this_thread::sleep_for(std::chrono::microseconds(changer_rng() % 50));
    }
  });
  constexpr int32_t kMaxTasks = 20000;
  std::vector<std::atomic<int32_t>> runs(kMaxTasks);
  std::vector<std::atomic<int32_t>> busy(static_cast<size_t>(num_threads));
  int64_t num_tasks_run = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int32_t call = 0; call < num_calls; ++call) {
    Shape shape = draw_shape(rng);
    if (changed_concurrently) shape.every_thread = false;
    if (shape.pause_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(shape.pause_ns));
    // 0 (all) for on_every_thread, which needs every thread.
    if (!changed_concurrently && (shape.every_thread || rng() % 4 == 0)) set_active_threads(shape.every_thread ? 0 : int32_t(rng() % (num_threads + 1)));
    // Changed concurrently, the count a call goes by is unknown here: at most all threads.
    const int32_t num_active = changed_concurrently ? num_threads : pool.active_threads();
    const auto enter = [&](int32_t thread_index) {
      if (thread_index < 0 || thread_index >= num_threads) fail("thread index out of range", num_threads, call, thread_index);
      if (thread_index >= num_active) fail("a thread beyond the active count ran a range", num_threads, call, thread_index);
      if (busy[size_t(thread_index)].exchange(1) != 0) fail("two ranges at once on one thread index", num_threads, call, thread_index);
    };
    const auto leave = [&](int32_t thread_index) { busy[size_t(thread_index)].store(0); };
    int32_t expected_tasks = shape.every_thread ? num_threads : shape.num_tasks;
    const std::function<void()> call_pool = [&] {
      if (shape.every_thread) {
        pool.on_every_thread([&](int32_t thread_index) {
          enter(thread_index);
          runs[size_t(thread_index)].fetch_add(1);
          spin_for_ns(shape.task_ns);
          leave(thread_index);
        });
      } else {
        pool.parallel_for(shape.num_tasks, shape.min_chunk_tasks, [&](int32_t thread_index, int32_t begin, int32_t end) {
          enter(thread_index);
          if (begin < 0 || end > shape.num_tasks || begin >= end) fail("bad range", num_threads, call, begin);
          // A call of one chunk has nothing to share: the caller runs it whole.
          if (shape.min_chunk_tasks >= shape.num_tasks && (thread_index != 0 || end - begin != shape.num_tasks)) {
            fail("a call of one chunk left the caller", num_threads, call, thread_index);
          }
          for (int32_t task = begin; task < end; ++task) {
            runs[size_t(task)].fetch_add(1);
            spin_for_ns(shape.task_ns);
          }
          leave(thread_index);
        });
      }
    };
    if (shape.submitted) {
      run_submitted(pool, call_pool);
    } else {
      call_pool();
    }
    // Returned: every task ran exactly once, none is still running, and nothing ran past the end.
    for (int32_t task = 0; task < std::min(kMaxTasks, expected_tasks + 64); ++task) {
      const int32_t count = runs[size_t(task)].exchange(0);
      if (count != (task < expected_tasks ? 1 : 0)) fail("a task ran other than exactly once", num_threads, call, task);
    }
    for (int32_t t = 0; t < num_threads; ++t) {
      if (busy[size_t(t)].load() != 0) fail("returned while a range was still running", num_threads, call, t);
    }
    num_tasks_run += expected_tasks;
  }
  changing.store(false);
  changer.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d threads%s: %d calls, %lld tasks, each exactly once, %.2f s; wake-up %.1f us at start, polling %.1f us now\n",
              num_threads, changed_concurrently ? " (count changed from another thread)" : "", num_calls, static_cast<long long>(num_tasks_run), seconds, pool.wake_latency_ns() / 1e3,
              pool.spin_ns() / 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: thread_pool_stress SEED [NUM_CALLS_PER_THREAD_COUNT]\n");
    return 2;
  }
  g_seed = std::atoi(argv[1]);
  const int32_t num_calls = argc > 2 ? std::atoi(argv[2]) : 2000;
  std::mt19937_64 rng(static_cast<uint64_t>(g_seed));
  for (int32_t num_threads = 1; num_threads <= 8; ++num_threads) {
    stress(num_threads, num_calls, rng, false);
    stress(num_threads, num_calls, rng, true);
  }
  return 0;
}
