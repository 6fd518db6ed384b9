// A small bounded worker pool shared by the CPU kernels. Workers start on first use and live
// for the process. parallel_for runs `fn(i)` for i in [0, count) on at most `max_workers`
// threads, the caller's thread included, and returns when all are done. Exceptions thrown by
// fn are rethrown in the caller (the first one wins).
// Thread safety: parallel_for may be called from several threads at once.
#pragma once

#include <cstddef>
#include <functional>

namespace ampscope::detail {

int pool_size();
void parallel_for(std::size_t count, int max_workers, const std::function<void(std::size_t)>& fn);

}  // namespace ampscope::detail
