// Tensor views shared by every back end.
#include <cstddef>
#include <vector>

#include "ampscope/check.h"
#include "ampscope/convert.h"
#include "ampscope/trainer/backend.h"

namespace ampscope::trainer {

Tensor::Tensor(void* data_in, Format dtype_in, std::initializer_list<std::int64_t> shape,
               Device device_in)
    : data(data_in), dtype(dtype_in), device(device_in), rank(static_cast<int>(shape.size())) {
  AMPSCOPE_CHECK(shape.size() <= kMaxRank, "tensor rank ", shape.size(), " above ", kMaxRank);
  std::size_t i = 0;
  for (auto d : shape) dims[i++] = d;
}

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[static_cast<std::size_t>(i)];
  return rank == 0 ? 0 : n;
}

Tensor Tensor::as(Format new_dtype) const {
  Tensor t = *this;
  t.dtype = new_dtype;
  return t;
}

void Backend::quantized_matmul_forward(const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, Format, const MatmulForwardRecipes&) {
  throw Error("the " + name() + " back end does not implement FP8/FP4 GEMM recipes");
}

void Backend::quantized_matmul_backward(const Tensor&, const Tensor&, const Tensor&,
                                        const Tensor&, const Tensor&, const Tensor&, Format,
                                        const MatmulBackwardRecipes&) {
  throw Error("the " + name() + " back end does not implement FP8/FP4 GEMM recipes");
}

RecipeCounts Backend::gemm_operand_counts(const Tensor& operand, Format compute,
                                          const Recipe& recipe) {
  AMPSCOPE_CHECK(operand.rank >= 1 && operand.numel() > 0, "a GEMM operand needs elements");
  const auto n = static_cast<std::size_t>(operand.numel());
  std::vector<std::byte> stored(operand.bytes());
  copy_to_host(stored.data(), operand.data, stored.size());
  std::vector<float> values(n);
  convert_to_fp32(stored.data(), values.data(), n, operand.dtype);
  if (compute != Format::kFP32 && compute != operand.dtype) {
    round_through(values.data(), n, compute);
  }
  const auto cols = static_cast<std::size_t>(operand.dim(operand.rank - 1));
  return recipe_counts(values.data(), n, Format::kFP32, cols, recipe);
}

}  // namespace ampscope::trainer
