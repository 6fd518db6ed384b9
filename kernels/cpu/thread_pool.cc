// The process-wide pool (ampscope/thread_pool.h). A call is a Job: tasks are claimed from its
// counter by the caller (slot 0) and by up to max_threads - 1 helper tickets queued for the
// workers (slots 1, 2, ...). A ticket a worker picks up after its job is closed does nothing, so
// the caller waits only for helpers that are inside its job, never for a busy queue.
#include "ampscope/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ampscope {
namespace {

thread_local bool t_in_task = false;

struct Job {
  detail::TaskFn call;
  const void* fn;
  std::size_t count;
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  std::condition_variable left;
  int inside = 0;       // helpers running tasks of this job
  bool closed = false;  // the caller is done claiming: late helpers must not start
  std::exception_ptr error;

  // Runs tasks until none is left; after a task throws, the tasks not yet claimed are skipped.
  void drain(int slot) {
    const bool outer = t_in_task;
    t_in_task = true;
    for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) {
      try {
        call(fn, i, slot);
      } catch (...) {
        next.store(count, std::memory_order_relaxed);
        std::lock_guard lock(mu);
        if (!error) error = std::current_exception();
      }
    }
    t_in_task = outer;
  }

  void help(int slot) {
    {
      std::lock_guard lock(mu);
      if (closed) return;
      ++inside;
    }
    drain(slot);
    std::lock_guard lock(mu);
    if (--inside == 0) left.notify_all();
  }
};

struct Ticket {
  std::shared_ptr<Job> job;
  int slot;
};

class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  void submit(const std::shared_ptr<Job>& job, int helpers) {
    {
      std::lock_guard lock(mu_);
      for (int slot = 1; slot <= helpers; ++slot) tickets_.push_back({job, slot});
    }
    if (helpers == 1) {
      cv_.notify_one();
    } else {
      cv_.notify_all();
    }
  }
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void work() {
    for (;;) {
      Ticket ticket;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !tickets_.empty(); });
        if (tickets_.empty()) return;  // stopping
        ticket = std::move(tickets_.front());
        tickets_.pop_front();
      }
      ticket.job->help(ticket.slot);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Ticket> tickets_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

int default_pool_size() {
  const unsigned hc = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(hc == 0 ? 1u : hc, 1u, 16u));
}

Pool& pool() {
  // The caller's thread also works, so the pool holds one thread fewer than the target.
  static Pool p(default_pool_size() - 1);
  return p;
}

}  // namespace

int pool_size() { return pool().size() + 1; }

bool in_parallel_task() { return t_in_task; }

namespace detail {

void parallel_run(std::size_t count, int max_threads, TaskFn call, const void* fn) {
  if (count == 0) return;
  const auto job = std::make_shared<Job>();
  job->call = call;
  job->fn = fn;
  job->count = count;
  // Nested calls run inline: their thread is already one of the outer call's.
  const std::size_t allowed =
      t_in_task ? 1 : static_cast<std::size_t>(std::max(1, std::min(max_threads, pool_size())));
  const int threads = static_cast<int>(std::min(count, allowed));
  if (threads > 1) pool().submit(job, threads - 1);
  job->drain(0);
  std::unique_lock lock(job->mu);
  job->closed = true;
  job->left.wait(lock, [&] { return job->inside == 0; });
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace detail
}  // namespace ampscope
