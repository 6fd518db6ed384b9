// Tensor views shared by every back end.
#include "ampscope/check.h"
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

}  // namespace ampscope::trainer
