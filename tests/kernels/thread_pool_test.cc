// The process's one pool (ampscope/thread_pool.h): every task runs once, slots name distinct
// threads, nested calls run inline instead of waiting for busy workers, concurrent callers share
// the workers, and the first exception reaches the caller.
#include "ampscope/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ampscope/tensor_stats.h"

namespace ampscope {
namespace {

TEST(ThreadPoolTest, RunsEveryTaskOnce) {
  std::vector<std::atomic<int>> runs(1000);
  parallel_for(runs.size(), pool_size(), [&](std::size_t i) { runs[i].fetch_add(1); });
  for (std::size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].load(), 1) << i;
}

TEST(ThreadPoolTest, NoTwoRunningTasksShareASlot) {
  const int threads = 4;
  std::vector<std::atomic<int>> busy(threads);
  std::atomic<int> clashes{0}, out_of_range{0};
  parallel_for(400, threads, [&](std::size_t, int slot) {
    if (slot < 0 || slot >= threads) {
      out_of_range.fetch_add(1);
      return;
    }
    if (busy[slot].fetch_add(1) != 0) clashes.fetch_add(1);
    std::this_thread::yield();
    busy[slot].fetch_sub(1);
  });
  EXPECT_EQ(out_of_range.load(), 0);
  EXPECT_EQ(clashes.load(), 0);
}

TEST(ThreadPoolTest, ASingleThreadRunsTheTasksInOrderOnTheCaller) {
  std::vector<std::size_t> order;
  const auto caller = std::this_thread::get_id();
  bool elsewhere = false;
  parallel_for(50, 1, [&](std::size_t i, int slot) {
    order.push_back(i);
    elsewhere |= std::this_thread::get_id() != caller || slot != 0;
  });
  ASSERT_EQ(order.size(), 50u);
  for (std::size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], i);
  EXPECT_FALSE(elsewhere);
}

// Every outer task (on every worker and the caller) starts an inner call; with a wait for
// workers these would all block on each other.
TEST(ThreadPoolTest, NestedCallsRunInlineOnTheTasksThread) {
  const std::size_t outer = 64, inner = 100;
  std::vector<std::atomic<int>> runs(outer * inner);
  std::atomic<int> moved{0}, not_nested{0};
  parallel_for(outer, pool_size(), [&](std::size_t o) {
    if (!in_parallel_task()) not_nested.fetch_add(1);
    const auto self = std::this_thread::get_id();
    parallel_for(inner, pool_size(), [&](std::size_t i, int slot) {
      if (std::this_thread::get_id() != self || slot != 0) moved.fetch_add(1);
      runs[o * inner + i].fetch_add(1);
    });
  });
  EXPECT_EQ(not_nested.load(), 0);
  EXPECT_EQ(moved.load(), 0);
  for (std::size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].load(), 1) << i;
  EXPECT_FALSE(in_parallel_task());
}

// The agent measuring on the training thread: compute_stats (which uses the pool) inside a
// trainer task gives the same result as outside.
TEST(ThreadPoolTest, ComputeStatsInsideATaskMatchesItOutside) {
  std::vector<float> x(1 << 20);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 1000) - 500.0f;
  StatsOptions options;
  options.parallel_threshold = 1;
  const TensorStats outside = compute_stats(x.data(), x.size(), Format::kFP32, {}, options);
  std::vector<TensorStats> inside(4);
  parallel_for(inside.size(), pool_size(), [&](std::size_t i) {
    inside[i] = compute_stats(x.data(), x.size(), Format::kFP32, {}, options);
  });
  for (const TensorStats& s : inside) {
    EXPECT_EQ(s.numel, outside.numel);
    EXPECT_EQ(s.zeros, outside.zeros);
    EXPECT_EQ(s.histogram.counts, outside.histogram.counts);
    EXPECT_EQ(s.sum, outside.sum);
  }
}

TEST(ThreadPoolTest, ConcurrentCallersEachGetTheirOwnTasks) {
  std::vector<std::vector<std::atomic<int>>> runs(4);
  for (auto& r : runs) r = std::vector<std::atomic<int>>(500);
  std::vector<std::thread> callers;
  for (auto& r : runs) {
    callers.emplace_back([&r] {
      for (int round = 0; round < 20; ++round) {
        parallel_for(r.size(), pool_size(), [&](std::size_t i) { r[i].fetch_add(1); });
      }
    });
  }
  for (auto& t : callers) t.join();
  for (const auto& r : runs) {
    for (std::size_t i = 0; i < r.size(); ++i) EXPECT_EQ(r[i].load(), 20) << i;
  }
}

TEST(ThreadPoolTest, TheFirstExceptionReachesTheCaller) {
  EXPECT_THROW(parallel_for(100, pool_size(),
                            [](std::size_t i) {
                              if (i == 37) throw std::runtime_error("task 37");
                            }),
               std::runtime_error);
  // The pool still works afterwards.
  std::atomic<int> n{0};
  parallel_for(100, pool_size(), [&](std::size_t) { n.fetch_add(1); });
  EXPECT_EQ(n.load(), 100);
}

}  // namespace
}  // namespace ampscope
