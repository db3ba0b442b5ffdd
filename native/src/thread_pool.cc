#include "thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

namespace conduit {

namespace {

constexpr uint64_t kTaskMask = 0xFFFFFFFFu;
constexpr uint32_t kWriting = 0xFFFFFFFFu;

uint32_t generation_of(uint64_t word) { return uint32_t(word >> 32); }
uint64_t job_word(uint32_t generation, uint32_t next_task) { return uint64_t(generation) << 32 | next_task; }

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The polling loop's clock: the time-stamp counter where there is one (a few cycles, never a
// system call, whatever clock source the kernel uses), steady_clock elsewhere.
uint64_t now_ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return uint64_t(steady_ns());
#endif
}

// Wake-ups measured at start. Each first leaves the worker idle long enough that its CPU stops
// polling for work on its own (guest and host halt-polling last up to a few hundred
// microseconds), as between two forward passes of a quiet server.
constexpr int32_t kWakeSamples = 15;
constexpr int64_t kIdleBeforeWakeNs = 1'000'000;
// A wake-up that took longer (a preempted thread, a stalled host) counts as this long, so one
// outlier cannot have threads polling for milliseconds.
constexpr int64_t kMaxWakeLatencyNs = 1'000'000;
// Weight of each wake-up seen in operation in the running estimate.
constexpr int64_t kWakeEstimateWeight = 8;
// Between passes the threads poll through a gap like the recent ones if it is at most this many
// wake-ups long: a decode loop's next pass comes after a steady gap (the event loop's own wake-up
// and a step's bookkeeping), and polling through it, yielding at every poll, spends idle CPU time
// nobody else asked for to save a wake-up per pass. A longer gap (an idle server) leaves them to
// poll for one wake-up and sleep.
constexpr int64_t kMaxPolledGapWakeUps = 8;
// Weight of each gap between passes in the running estimate.
constexpr int64_t kGapEstimateWeight = 4;

// Lets any other runnable thread have this CPU: a system call, made only between passes.
void yield_cpu() {
#if defined(__linux__)
  sched_yield();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int32_t num_threads)
    : num_threads_(num_threads), inactive_waiting_(new std::atomic<uint64_t>[size_t(num_threads + 63) / 64]) {
  for (int32_t word = 0; word < (num_threads + 63) / 64; ++word) inactive_waiting_[size_t(word)].store(0);
  workers_.reserve(size_t(num_threads - 1));
  for (int32_t i = 1; i < num_threads; ++i) workers_.emplace_back(&ThreadPool::worker_loop, this, i);
  driver_ = std::thread(&ThreadPool::driver_loop, this);
  const int64_t start_ns = steady_ns();
  const uint64_t start_ticks = now_ticks();
  measuring_ = true;
  wake_latency_ns_ = measure_wake_latency_ns();
  measuring_ = false;
  ticks_per_ns_.store(double(now_ticks() - start_ticks) / double(steady_ns() - start_ns));
  spin_ticks_.store(int64_t(double(wake_latency_ns_) * ticks_per_ns_.load()));
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  wake(workers_asleep_);
  wake(driver_asleep_);
  wake(inactive_asleep_);
  for (std::thread& worker : workers_) worker.join();
  driver_.join();
}

void ThreadPool::set_active_threads(const int32_t* cell) {
  active_cell_.store(cell, std::memory_order_release);
  wake(inactive_asleep_);
}

int64_t ThreadPool::spin_ns() const { return int64_t(double(spin_ticks_.load()) / ticks_per_ns_.load()); }

int64_t ThreadPool::between_passes_spin_ticks() const {
  const int64_t spin = spin_ticks_.load(std::memory_order_relaxed);
  const int64_t gap = gap_ticks_.load(std::memory_order_relaxed);
  // Half as long again as the recent gaps: the gap varies from pass to pass.
  return gap <= kMaxPolledGapWakeUps * spin ? std::max(spin, gap + gap / 2) : spin;
}

// Only gaps between a pass's end and the next submit count; one long pause moves the estimate
// no further than a gap just too long to poll through, so polling resumes a few passes after it.
void ThreadPool::observe_gap(uint64_t gap_ticks) {
  const int64_t limit = (kMaxPolledGapWakeUps + 1) * spin_ticks_.load(std::memory_order_relaxed);
  const int64_t sample = std::min(int64_t(gap_ticks), limit);
  const int64_t estimate = gap_ticks_.load(std::memory_order_relaxed);
  gap_ticks_.store(estimate + (sample - estimate) / kGapEstimateWeight, std::memory_order_relaxed);
}

// The driver's wake-ups, from a task submitted while it sleeps to the task running. While this
// runs, spin_ticks_ is 0: every waiting thread sleeps at once. The submitting thread stays busy
// through the idle time and the wake-up, as the event loop does, so the driver wakes on another
// CPU (woken on the submitter's, it would only measure a context switch).
int64_t ThreadPool::measure_wake_latency_ns() {
  struct Sample {
    std::atomic<int64_t> ran_ns{0};
  } sample;
  std::vector<int64_t> samples;
  for (int32_t i = 0; i < kWakeSamples; ++i) {
    while (driver_asleep_.count.load() == 0) std::this_thread::yield();
    const int64_t idle_until_ns = steady_ns() + kIdleBeforeWakeNs;
    while (steady_ns() < idle_until_ns) {
    }
    sample.ran_ns.store(0);
    const int64_t submitted_ns = steady_ns();
    submit([](void* context) { static_cast<Sample*>(context)->ran_ns.store(steady_ns()); }, &sample);
    while (sample.ran_ns.load() == 0) {
    }
    samples.push_back(std::min(kMaxWakeLatencyNs, sample.ran_ns.load() - submitted_ns));
  }
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

// Every wake-up seen in operation moves the polling time toward it: what waking a thread costs
// inside a running server (other threads competing for the cores, the host's scheduling) is
// what polling should match, and the measurement at start only approximates it.
void ThreadPool::observe_wake_latency(uint64_t latency_ticks) {
  const int64_t sample = std::min(int64_t(latency_ticks), int64_t(double(kMaxWakeLatencyNs) * ticks_per_ns_.load()));
  const int64_t estimate = spin_ticks_.load(std::memory_order_relaxed);
  spin_ticks_.store(estimate + (sample - estimate) / kWakeEstimateWeight, std::memory_order_relaxed);
}

template <typename Ready, typename Politely>
void ThreadPool::await(Sleepers& sleepers, const Ready& ready, const Politely& politely) {
  if (ready()) return;
  // No PAUSE: under KVM a run of PAUSEs trips pause-loop exiting, and the hypervisor deschedules
  // the polling vCPU (measured: decode -40%).
  const uint64_t started_ticks = now_ticks();
  const uint64_t deadline = started_ticks + uint64_t(spin_ticks_.load(std::memory_order_relaxed));
  for (uint32_t i = 1;; ++i) {
    if (ready()) return;
    const bool polite = politely();
    if (polite) yield_cpu();
    if (i % 8 == 0) {
      // Between passes the polling is counted from the end of the last pass.
      const uint64_t polite_deadline = std::max(started_ticks, task_ended_ticks_.load(std::memory_order_relaxed)) +
                                       uint64_t(between_passes_spin_ticks());
      if (now_ticks() >= (polite ? std::max(deadline, polite_deadline) : deadline)) break;
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t slept_ticks = now_ticks();
  sleepers.count.fetch_add(1);
  sleepers.wakeup.wait(lock, ready);
  sleepers.count.fetch_sub(1);
  const uint64_t notified_ticks = sleepers.first_notify_ticks.exchange(0);
  if (!measuring_ && notified_ticks > slept_ticks) observe_wake_latency(now_ticks() - notified_ticks);
}

// The change came first (sequentially consistent), then this load of the sleepers, and a
// sleeper counts itself before it checks its condition: either it sees the change or it is
// counted here. Taking the mutex orders the notification after its last check.
void ThreadPool::wake(Sleepers& sleepers) {
  if (sleepers.count.load() == 0) return;
  uint64_t unset = 0;
  sleepers.first_notify_ticks.compare_exchange_strong(unset, now_ticks());
  { std::lock_guard<std::mutex> lock(mutex_); }
  sleepers.wakeup.notify_all();
}

void ThreadPool::run(int32_t num_tasks, int32_t min_chunk_tasks, bool one_task_per_thread, Invoke invoke,
                     const void* context) {
  if (num_tasks <= 0) return;
  const int32_t num_active = one_task_per_thread ? num_threads_ : active_threads();
  // Threads the count has included since they last looked may be asleep: they come up while this
  // call runs. (Their bit is set before they read the count, and this reads the count first.)
  if (inactive_waiting_below(num_active)) wake(inactive_asleep_);
  // A call that fits one chunk runs on the caller without publishing it: there is nothing to share,
  // and a polling worker could otherwise claim it and leave the caller waiting on another core's
  // caches (a decode's per-token steps).
  if (num_active == 1 || (!one_task_per_thread && min_chunk_tasks >= num_tasks)) {
    invoke(context, 0, 0, num_tasks);
    return;
  }
  if (!in_task_.load(std::memory_order_relaxed)) in_task_.store(true, std::memory_order_relaxed);
  // Seqlock: the writing mark, then the job, then the generation opened at task 0. A worker that
  // read part of the new job under the old generation sees the generation moved on.
  const uint32_t generation = generation_of(job_word_.load(std::memory_order_relaxed)) + 1;
  job_word_.store(job_word(generation, kWriting), std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  job_.num_tasks.store(num_tasks, std::memory_order_relaxed);
  job_.min_chunk_tasks.store(std::max(1, min_chunk_tasks), std::memory_order_relaxed);
  job_.one_task_per_thread.store(one_task_per_thread, std::memory_order_relaxed);
  job_.num_active_threads.store(num_active, std::memory_order_relaxed);
  job_.invoke.store(invoke, std::memory_order_relaxed);
  job_.context.store(context, std::memory_order_relaxed);
  num_tasks_done_.store(0, std::memory_order_relaxed);
  const uint64_t word = job_word(generation, 0);
  job_word_.store(word);
  wake(workers_asleep_);
  if (one_task_per_thread) {
    invoke(context, 0, 0, 1);
    finish_tasks(1, num_tasks);
  } else {
    claim_chunks(0, JobSnapshot{word, num_tasks, std::max(1, min_chunk_tasks), false, num_active, invoke, context});
  }
  await(caller_asleep_, [&] { return num_tasks_done_.load(std::memory_order_acquire) == num_tasks; }, [] { return false; });
}

bool ThreadPool::inactive_waiting_below(int32_t count) const {
  for (int32_t word = 0; word * 64 < count; ++word) {
    const int32_t bits = std::min(64, count - word * 64);
    const uint64_t below = bits == 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1;
    if ((inactive_waiting_[size_t(word)].load() & below) != 0) return true;
  }
  return false;
}

bool ThreadPool::read_job(uint64_t word, JobSnapshot& job) const {
  job.word = word;
  job.num_tasks = job_.num_tasks.load(std::memory_order_relaxed);
  job.min_chunk_tasks = job_.min_chunk_tasks.load(std::memory_order_relaxed);
  job.one_task_per_thread = job_.one_task_per_thread.load(std::memory_order_relaxed);
  job.num_active_threads = job_.num_active_threads.load(std::memory_order_relaxed);
  job.invoke = job_.invoke.load(std::memory_order_relaxed);
  job.context = job_.context.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  return generation_of(job_word_.load(std::memory_order_relaxed)) == generation_of(word);
}

void ThreadPool::claim_chunks(int32_t thread_index, JobSnapshot job) {
  uint64_t word = job.word;
  while (generation_of(word) == generation_of(job.word)) {
    const int32_t next = int32_t(word & kTaskMask);
    if (next >= job.num_tasks) return;
    const int32_t guided = (job.num_tasks - next) / (4 * job.num_active_threads);
    const int32_t end = std::min(job.num_tasks, next + std::max(job.min_chunk_tasks, guided));
    // A failed exchange reloads word: another thread claimed first, or the job was replaced.
    if (job_word_.compare_exchange_weak(word, job_word(generation_of(word), uint32_t(end)),
                                        std::memory_order_acq_rel, std::memory_order_acquire)) {
      job.invoke(job.context, thread_index, next, end);
      finish_tasks(end - next, job.num_tasks);
      word = job_word_.load(std::memory_order_acquire);
    }
  }
}

void ThreadPool::finish_tasks(int32_t num_tasks_done, int32_t num_tasks) {
  if (num_tasks_done_.fetch_add(num_tasks_done) + num_tasks_done == num_tasks) wake(caller_asleep_);
}

// The submitting thread (the event loop's) also wakes sleeping workers, so they come up while the
// driver starts the task instead of after its first parallel call.
void ThreadPool::submit(Task task, void* context) {
  // A task reports its end (to the event loop) before the driver marks it: a submit that comes
  // before the mark found no gap at all.
  const uint64_t ended_ticks = task_ended_ticks_.load(std::memory_order_relaxed);
  const uint64_t submitted_ticks = now_ticks();
  if (!measuring_ && ended_ticks != 0) observe_gap(ended_ticks >= last_submitted_ticks_ ? submitted_ticks - ended_ticks : 0);
  last_submitted_ticks_ = submitted_ticks;
  task_.store(task, std::memory_order_relaxed);
  task_context_.store(context, std::memory_order_relaxed);
  // Counted before it is marked in a task: the driver, marking the last task's end, sees the count
  // or this mark comes after its own (driver_loop).
  num_submitted_.fetch_add(1);
  in_task_.store(true);
  wake(driver_asleep_);
  wake(workers_asleep_);
}

// Waiting for a task is waiting between passes: politely.
void ThreadPool::driver_loop() {
  uint64_t num_run = 0;
  for (;;) {
    await(driver_asleep_, [&] {
      return stopping_.load(std::memory_order_relaxed) || num_submitted_.load(std::memory_order_acquire) != num_run;
    }, [] { return true; });
    if (stopping_.load()) return;
    ++num_run;
    task_.load(std::memory_order_relaxed)(task_context_.load(std::memory_order_relaxed));
    if (!measuring_) task_ended_ticks_.store(now_ticks(), std::memory_order_relaxed);
    // The next task may have been submitted while this one reported its end: the workers would
    // then poll its parallel calls politely, a system call per poll.
    in_task_.store(false);
    if (num_submitted_.load() != num_run) in_task_.store(true);
  }
}

void ThreadPool::worker_loop(int32_t thread_index) {
  uint32_t seen_generation = 0;
  for (;;) {
    if (thread_index >= active_threads()) {
      std::atomic<uint64_t>& waiting = inactive_waiting_[size_t(thread_index / 64)];
      const uint64_t bit = uint64_t(1) << (thread_index % 64);
      waiting.fetch_or(bit);
      await(inactive_asleep_, [&] {
        return stopping_.load(std::memory_order_relaxed) || thread_index < active_threads();
      }, [] { return true; });
      waiting.fetch_and(~bit);
    }
    uint64_t word = 0;
    await(workers_asleep_, [&] {
      word = job_word_.load(std::memory_order_acquire);
      return stopping_.load(std::memory_order_relaxed) ||
             (generation_of(word) != seen_generation && uint32_t(word) != kWriting);
    }, [this] { return !in_task_.load(std::memory_order_relaxed); });
    if (stopping_.load()) return;
    JobSnapshot job;
    if (!read_job(word, job)) continue;  // replaced while being read: look again
    seen_generation = generation_of(word);
    if (thread_index >= job.num_active_threads) continue;  // not this call's: back to wait
    if (job.one_task_per_thread) {
      job.invoke(job.context, thread_index, thread_index, thread_index + 1);
      finish_tasks(1, job.num_tasks);
    } else {
      claim_chunks(thread_index, job);
    }
  }
}

}  // namespace conduit
