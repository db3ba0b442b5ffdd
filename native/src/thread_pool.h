// The runtime's own persistent threads: num_threads - 1 workers that join the calling thread in
// parallel calls, and a driver thread that runs submitted tasks (forward passes) as that caller,
// so a pass needs no thread but the runtime's own.
//
// A parallel call publishes a job and the threads claim chunks of its tasks until none is left;
// it returns once every task has run. The caller claims like any worker, so a call never waits
// for a thread that has not shown up: a worker that is asleep, descheduled or late simply finds
// the tasks taken, and a call of one task costs the caller no more than the task.
//
// Waiting threads poll for about as long as waking a sleeping thread takes on this machine, then
// sleep on a condition variable: polling as long as blocking would cost is never worse than
// twice the best choice made in hindsight, whatever the wait turns out to be. The wake-up
// latency is measured when the pool starts and then follows the wake-ups seen in operation
// (inside a server, other threads compete for the cores and a wake-up costs more than on a quiet
// machine). A forward pass is dozens of calls microseconds apart, so inside it the threads poll
// flat out and a hand-off is a few atomic operations, no system call. Between passes (the
// driver waiting for the next, the workers once a pass has ended) they poll politely, yielding
// the CPU at every poll: the event loop and the gateway get a core the moment they want one, yet
// a pass that follows within a wake-up finds every thread already running, which matters most
// where wake-ups are slow. Where the recent gaps between passes were short (a decode loop: the
// event loop's own wake-up and a step's bookkeeping), they poll politely through a gap like those,
// up to a few wake-ups. A longer gap (an idle server) puts them to sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace conduit {

// Element-wise work over rows (norms, rotary, residual adds, summing partials) is split between
// threads only in chunks of at least this many elements: below it a hand-off costs more than the
// half it saves. PyTorch's at::parallel_for grain size, not a figure of this machine.
constexpr int64_t kElementsPerChunk = 32768;
// The min_chunk_tasks for rows of elements_per_row elements each.
inline int32_t rows_per_chunk(int64_t elements_per_row) {
  return int32_t(elements_per_row >= kElementsPerChunk ? 1 : (kElementsPerChunk + elements_per_row - 1) / elements_per_row);
}

class ThreadPool {
 public:
  explicit ThreadPool(int32_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t num_threads() const { return num_threads_; }
  // How many of the threads take part in parallel calls: the caller and workers 1..count-1, the
  // others asleep until the count includes them again. The count lives in *cell, which any thread
  // may store to at any time (a 32-bit atomic store; a grammar thread the moment its compile ends,
  // not when the event loop hears of it); each parallel call reads it, so a call in flight keeps
  // its count and the next follows the new one. Out of [1, num_threads] (0 among them) means all.
  // Until this is called the cell is the pool's own, 0. The cell must outlive the pool or the
  // next call. The work is the same whichever threads claim it (no result depends on
  // thread_index), so the count changes only how fast a call runs: fewer threads leave cores to
  // other work of the process (a grammar compiling) instead of a call waiting on a thread that
  // shares its core.
  void set_active_threads(const int32_t* cell);
  int32_t active_threads() const {
    const int32_t count = __atomic_load_n(active_cell_.load(std::memory_order_acquire), __ATOMIC_SEQ_CST);
    return count < 1 || count > num_threads_ ? num_threads_ : count;
  }
  // Median nanoseconds from notifying a sleeping thread to it running, measured at start.
  int64_t wake_latency_ns() const { return wake_latency_ns_; }
  // How long a waiting thread polls before it sleeps now.
  int64_t spin_ns() const;

  // Calls body(thread_index, begin, end) on chunks of [0, num_tasks) claimed by whichever thread
  // comes first, and returns when all have run. Chunks shrink as the tasks run out (a quarter of
  // what is left per thread, at least min_chunk_tasks), so the threads finish close together.
  // thread_index (0 for the caller) names per-thread scratch; no result may depend on it. A call
  // whose tasks fit one chunk runs on the caller alone, with no hand-off. One caller at a time,
  // never from inside a body.
  template <typename Body>
  void parallel_for(int32_t num_tasks, int32_t min_chunk_tasks, const Body& body) {
    run(num_tasks, min_chunk_tasks, false, invoke_body<Body>, &body);
  }

  // Runs task(context) on the driver thread, which calls the parallel calls inside it, and returns
  // at once. One task at a time: the next is submitted only once this one has reported its end
  // (its own business), and the driver has read a task before it runs it.
  using Task = void (*)(void* context);
  void submit(Task task, void* context);

  // Calls body(thread_index) once on every thread, all at the same time (the probes measure
  // what all threads together reach), and returns when all have run. Every thread must be active.
  template <typename Body>
  void on_every_thread(const Body& body) {
    const auto per_task = [&body](int32_t thread_index, int32_t, int32_t) { body(thread_index); };
    run(num_threads_, 1, true, invoke_body<decltype(per_task)>, &per_task);
  }

 private:
  using Invoke = void (*)(const void* context, int32_t thread_index, int32_t begin, int32_t end);

  template <typename Body>
  static void invoke_body(const void* context, int32_t thread_index, int32_t begin, int32_t end) {
    (*static_cast<const Body*>(context))(thread_index, begin, end);
  }

  // The published job, read by the workers under the seqlock protocol of job_word_.
  struct Job {
    std::atomic<int32_t> num_tasks{0};
    std::atomic<int32_t> min_chunk_tasks{1};
    std::atomic<bool> one_task_per_thread{false};
    std::atomic<int32_t> num_active_threads{1};
    std::atomic<Invoke> invoke{nullptr};
    std::atomic<const void*> context{nullptr};
  };
  struct JobSnapshot {
    uint64_t word;
    int32_t num_tasks;
    int32_t min_chunk_tasks;
    bool one_task_per_thread;
    int32_t num_active_threads;
    Invoke invoke;
    const void* context;
  };

  // Threads waiting for one kind of change: the workers for a job, the caller for its end.
  struct Sleepers {
    std::atomic<int32_t> count{0};
    std::condition_variable wakeup;
    std::atomic<uint64_t> first_notify_ticks{0};  // the first notify since one of them last woke
  };

  void run(int32_t num_tasks, int32_t min_chunk_tasks, bool one_task_per_thread, Invoke invoke, const void* context);
  // Reads the job of generation(word) (false once another generation replaces it).
  bool read_job(uint64_t word, JobSnapshot& job) const;
  // Claims and runs chunks of the job until none is left or it is replaced.
  void claim_chunks(int32_t thread_index, JobSnapshot job);
  // Whether a worker below count waits among the inactive.
  bool inactive_waiting_below(int32_t count) const;
  void finish_tasks(int32_t num_tasks_done, int32_t num_tasks);
  void worker_loop(int32_t thread_index);
  void driver_loop();
  // Polls ready() for spin_ticks_, yielding the CPU between polls while politely() holds, then
  // sleeps among sleepers until a notify finds it true.
  template <typename Ready, typename Politely>
  void await(Sleepers& sleepers, const Ready& ready, const Politely& politely);
  // After a change that sleepers may await: a system call only if one sleeps.
  void wake(Sleepers& sleepers);
  // How long a thread polls between passes: through a gap like the recent ones where that is
  // short, else as long as a wake-up.
  int64_t between_passes_spin_ticks() const;
  void observe_gap(uint64_t gap_ticks);
  int64_t measure_wake_latency_ns();
  void observe_wake_latency(uint64_t latency_ticks);

  const int32_t num_threads_;
  std::vector<std::thread> workers_;
  std::thread driver_;
  int64_t wake_latency_ns_ = 0;
  // How long a waiting thread polls: the wake-up latency measured at start, then a running
  // estimate of the wake-ups seen since.
  std::atomic<int64_t> spin_ticks_{0};
  std::atomic<double> ticks_per_ns_{1.0};
  // False once a submitted task (a forward pass) has ended, until the next task or parallel call:
  // then the workers, like the driver, wait politely.
  std::atomic<bool> in_task_{true};
  std::atomic<bool> measuring_{false};
  // When the last submitted task ended (0 before the first), and a running estimate of the gap
  // from a task's end to the next submit.
  std::atomic<uint64_t> task_ended_ticks_{0};
  std::atomic<int64_t> gap_ticks_{0};
  uint64_t last_submitted_ticks_ = 0;  // the submitting thread's own

  // Generation (high 32 bits) and the job's next unclaimed task (low 32 bits); kWriting while the
  // caller rewrites job_, so a late worker can never pair an old generation with the new job.
  std::atomic<uint64_t> job_word_{0};
  Job job_;
  std::atomic<int32_t> num_tasks_done_{0};
  std::atomic<bool> stopping_{false};

  // The submitted task, written before num_submitted_ counts it.
  std::atomic<Task> task_{nullptr};
  std::atomic<void*> task_context_{nullptr};
  std::atomic<uint64_t> num_submitted_{0};

  std::mutex mutex_;
  Sleepers workers_asleep_;
  Sleepers caller_asleep_;
  Sleepers driver_asleep_;
  // Workers outside the active count wait here, not for jobs: no wake-up per parallel call. The
  // count grows by another thread's store, with no call into the pool, so a parallel call that
  // finds a waiting worker inside its count wakes them. Bit i % 64 of word i / 64 of
  // inactive_waiting_ is set while worker i waits there.
  Sleepers inactive_asleep_;
  std::unique_ptr<std::atomic<uint64_t>[]> inactive_waiting_;
  int32_t own_active_threads_ = 0;
  std::atomic<const int32_t*> active_cell_{&own_active_threads_};
};

}  // namespace conduit
