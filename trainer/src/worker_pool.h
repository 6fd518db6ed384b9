// A small worker pool for the CPU back end (cpu_backend.cc): the thread that owns the back end
// and a few workers share each parallel operation, claiming tasks from a counter.
// Thread safety: see WorkerPool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace ampscope::trainer::detail {

// Runs fn(task, slot) for every task in [0, count) on the calling thread and threads() - 1
// workers, and returns when all are done. Tasks are claimed from a shared counter; `slot`
// (< threads()) names the thread running a task, for per-thread scratch. A task must not
// depend on which thread runs it. The first exception a task throws is rethrown here.
// Thread safety: run() is called by one thread at a time (the back end's owner).
class WorkerPool {
 public:
  explicit WorkerPool(int threads) {
    for (int slot = 1; slot < threads; ++slot) workers_.emplace_back([this, slot] { work(slot); });
  }
  ~WorkerPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  template <class Fn>
  void run(std::size_t count, const Fn& fn) {
    if (workers_.empty() || count <= 1) {
      for (std::size_t i = 0; i < count; ++i) fn(i, 0);
      return;
    }
    const Job job{
        &fn, [](const void* f, std::size_t i, int slot) { (*static_cast<const Fn*>(f))(i, slot); }};
    run_job(count, job);
  }

 private:
  struct Job {
    const void* fn;
    void (*call)(const void*, std::size_t, int);
  };

  void run_job(std::size_t count, const Job& job) {
    {
      std::unique_lock lock(mu_);
      // A worker that woke late for the previous job may still be looking at its counter.
      done_.wait(lock, [this] { return busy_ == 0; });
      job_ = job;
      count_ = count;
      next_.store(0, std::memory_order_relaxed);
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    drain(job, count, 0);
    std::unique_lock lock(mu_);
    done_.wait(lock, [this] { return busy_ == 0; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  void drain(const Job& job, std::size_t count, int slot) {
    for (std::size_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < count;) {
      try {
        job.call(job.fn, i, slot);
      } catch (...) {
        std::lock_guard lock(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  void work(int slot) {
    std::uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const Job job = job_;
      const std::size_t count = count_;
      ++busy_;
      lock.unlock();
      drain(job, count, slot);
      lock.lock();
      if (--busy_ == 0) done_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, error_mu_;
  std::condition_variable wake_, done_;
  Job job_{};
  std::size_t count_ = 0;
  std::atomic<std::size_t> next_{0};
  std::uint64_t generation_ = 0;
  int busy_ = 0;  // workers inside a job
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace ampscope::trainer::detail
