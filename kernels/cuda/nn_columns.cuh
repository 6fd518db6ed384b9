// Column sums over rows (dbias of a linear layer, dweight and dbias of LayerNorm) in two
// deterministic stages: each block sums kRowsPerChunk rows of a tile of columns into a partial
// row (one thread per column, rows in order), then one thread per column adds the partial rows
// in order and commits the total into the accumulating output. The CPU sums all rows in order;
// this order differs, so the results agree within the FP32 tolerance of a sum.
#pragma once

#include <cstdint>

#include "nn_common.cuh"
#include "nn_element.cuh"

namespace ampscope::cuda::nn::detail {
namespace {

constexpr int kRowsPerChunk = 32;
constexpr int kColumnThreads = 128;

inline int row_chunks(std::int64_t rows) {
  return static_cast<int>((rows + kRowsPerChunk - 1) / kRowsPerChunk);
}

inline dim3 column_partial_grid(std::int64_t rows, std::int64_t columns) {
  return dim3(static_cast<unsigned>((columns + kColumnThreads - 1) / kColumnThreads),
              static_cast<unsigned>(row_chunks(rows)));
}

// out (C) = store(out + round(sum over chunks of partials (chunks, C))).
__global__ void finish_columns_kernel(Array out, const float* partials, int chunks,
                                      std::int64_t columns, Format compute) {
  for (std::int64_t c = global_thread(); c < columns; c += grid_threads()) {
    float acc = 0.0f;
    for (int r = 0; r < chunks; ++r) acc += partials[static_cast<std::int64_t>(r) * columns + c];
    commit(out.data, out.dtype, c, acc, compute, true);
  }
}

inline void finish_columns(Array out, const float* partials, std::int64_t rows,
                           std::int64_t columns, Format compute, cudaStream_t stream) {
  finish_columns_kernel<<<elementwise_blocks(columns), kThreadsPerBlock, 0, stream>>>(
      out, partials, row_chunks(rows), columns, compute);
  check_launch();
}

}  // namespace
}  // namespace ampscope::cuda::nn::detail
