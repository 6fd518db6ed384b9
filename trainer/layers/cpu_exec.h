// Where a layer's CPU version runs: scratch memory, the threads of its parallel loops (the
// process's one pool, ampscope/thread_pool.h) and the SIMD level of its vector code. The CPU
// back end owns one CpuExec and hands it to every layer; layers work on FP32 arrays that the
// back end has already read and rounded to the compute format (see ../src/cpu_backend.cc).
//
// Determinism: task boundaries depend only on the shapes (kChunk elements, or rows_per_task
// rows) and partial sums are combined in task order, so a result does not depend on the thread
// count or on which thread ran which task.
// Thread safety: a CpuExec is used by one thread at a time (the back end's owner); its scratch
// is handed out on that thread before parallel tasks start.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "ampscope/cpu_features.h"
#include "ampscope/thread_pool.h"

namespace ampscope::trainer::layers {

// Reusable FP32 working buffers; a handle returns its vector to the pool when it goes away.
// Used from the calling thread only: parallel tasks get their scratch before they start.
class ScratchPool {
 public:
  class Handle {
   public:
    Handle(ScratchPool* pool, std::vector<float> v) : pool_(pool), v_(std::move(v)) {}
    Handle(Handle&& o) noexcept : pool_(o.pool_), v_(std::move(o.v_)) { o.pool_ = nullptr; }
    Handle& operator=(Handle&&) = delete;
    ~Handle() {
      if (pool_ != nullptr) pool_->free_.push_back(std::move(v_));
    }
    float* data() { return v_.data(); }

   private:
    ScratchPool* pool_;
    std::vector<float> v_;
  };

  Handle get(std::size_t n) {
    // Best fit among the free vectors, else a new one.
    std::size_t best = free_.size();
    for (std::size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].size() >= n && (best == free_.size() || free_[i].size() < free_[best].size())) {
        best = i;
      }
    }
    std::vector<float> v;
    if (best < free_.size()) {
      v = std::move(free_[best]);
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    } else {
      v.resize(std::max<std::size_t>(n, 1));
    }
    return Handle(this, std::move(v));
  }

 private:
  std::vector<std::vector<float>> free_;
};

// A share of the process's pool: parallel work on at most `threads` threads.
// run(count, fn) calls fn(task, slot) with slot < threads() (ampscope::parallel_for).
class Workers {
 public:
  explicit Workers(int threads) : threads_(threads) {}
  int threads() const { return threads_; }
  template <class Fn>
  void run(std::size_t count, const Fn& fn) const {
    parallel_for(count, threads_, fn);
  }

 private:
  int threads_;
};

// Elements per parallel task of the elementwise passes (64 KiB of FP32): large enough to
// amortise a task, small enough to keep a task's arrays in L2 and both cores busy.
inline constexpr std::size_t kChunk = 16384;

// fn(begin, end) over [0, n) in kChunk pieces on the workers.
template <class Fn>
void for_chunks(const Workers& workers, std::size_t n, const Fn& fn) {
  const std::size_t tasks = (n + kChunk - 1) / kChunk;
  workers.run(tasks, [&](std::size_t t, int) { fn(t * kChunk, std::min(n, (t + 1) * kChunk)); });
}

// Rows per task for row-wise work on rows of `width` elements.
inline std::size_t rows_per_task(std::int64_t width) {
  return std::max<std::size_t>(1,
                               kChunk / static_cast<std::size_t>(std::max<std::int64_t>(width, 1)));
}

// fn(first_row, end_row) over [0, rows) in rows_per_task(width) pieces on the workers.
template <class Fn>
void for_rows(const Workers& workers, std::size_t rows, std::int64_t width, const Fn& fn) {
  const std::size_t per = rows_per_task(width);
  workers.run((rows + per - 1) / per,
              [&](std::size_t task, int) { fn(task * per, std::min(rows, (task + 1) * per)); });
}

struct CpuExec {
  ScratchPool& scratch;
  const Workers& workers;
  SimdLevel level;
};

}  // namespace ampscope::trainer::layers
