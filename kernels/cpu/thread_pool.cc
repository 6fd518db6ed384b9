#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace ampscope::detail {
namespace {

class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { run(); });
  }
  ~Pool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void submit(std::function<void()> task) {
    {
      std::lock_guard lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (stop_ && tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
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

void parallel_for(std::size_t count, int max_workers, const std::function<void(std::size_t)>& fn) {
  if (count == 0) return;
  const int workers = std::max(1, std::min({max_workers, pool_size(), static_cast<int>(count)}));
  if (workers == 1) {
    for (std::size_t i = 0; i < count; ++i) fn(i);
    return;
  }
  struct Shared {
    std::atomic<std::size_t> next{0};
    std::mutex mu;
    std::condition_variable done_cv;
    int active = 0;
    std::exception_ptr error;
  };
  auto shared = std::make_shared<Shared>();
  auto work = [shared, count, &fn] {
    for (;;) {
      const std::size_t i = shared->next.fetch_add(1);
      if (i >= count) break;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard lock(shared->mu);
        if (!shared->error) shared->error = std::current_exception();
      }
    }
  };
  shared->active = workers - 1;
  for (int w = 0; w < workers - 1; ++w) {
    pool().submit([shared, work] {
      work();
      std::lock_guard lock(shared->mu);
      if (--shared->active == 0) shared->done_cv.notify_all();
    });
  }
  work();
  std::unique_lock lock(shared->mu);
  shared->done_cv.wait(lock, [&] { return shared->active == 0; });
  if (shared->error) std::rethrow_exception(shared->error);
}

}  // namespace ampscope::detail
