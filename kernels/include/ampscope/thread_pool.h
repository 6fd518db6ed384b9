// The project's one thread pool: a process-wide, bounded set of workers shared by every CPU
// kernel (tensor statistics, the trainer's CPU back end). Workers start on first use and live
// for the process; there are pool_size() - 1 of them, because the calling thread always works
// too.
//
// parallel_for(count, max_threads, fn) runs fn for every task in [0, count) on at most
// max_threads threads (the caller's included) and returns when all are done. Tasks are claimed
// from a shared counter, so which thread runs which task is not fixed: a task must not depend
// on it. fn may take (task) or (task, slot); `slot` in [0, max_threads) names the thread running
// the task within this call (the caller is slot 0), and no two tasks running at the same time
// share a slot, so a caller can hand out per-thread scratch by slot. The first exception a task
// throws is rethrown in the caller once every task has finished or been skipped.
//
// Nesting: a parallel_for called from inside a task (on a worker or on the caller's thread)
// runs all of its tasks inline on that thread, slot 0, in task order. Nested calls therefore
// never wait for workers that may all be busy with the outer call (no deadlock), and the
// compute_stats a trainer task triggers simply runs on the task's thread.
//
// Thread safety: parallel_for may be called from several threads at once; the calls share the
// workers and each returns when its own tasks are done. A caller never waits for a worker that
// has not started on its call.
#pragma once

#include <cstddef>
#include <type_traits>

namespace ampscope {

// Threads a parallel_for can use at most: the workers plus the caller.
int pool_size();

// Whether this thread is inside a parallel_for task (a nested call would run inline).
bool in_parallel_task();

namespace detail {
using TaskFn = void (*)(const void* fn, std::size_t task, int slot);
void parallel_run(std::size_t count, int max_threads, TaskFn call, const void* fn);
}  // namespace detail

template <class Fn>
void parallel_for(std::size_t count, int max_threads, const Fn& fn) {
  detail::parallel_run(
      count, max_threads,
      [](const void* f, std::size_t task, int slot) {
        const Fn& body = *static_cast<const Fn*>(f);
        if constexpr (std::is_invocable_v<const Fn&, std::size_t, int>) {
          body(task, slot);
        } else {
          body(task);
        }
      },
      &fn);
}

}  // namespace ampscope
