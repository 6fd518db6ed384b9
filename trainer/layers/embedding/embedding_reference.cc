// The embedding from its definition (embedding.h), one element at a time: the tests' oracle.
#include "layers/embedding/embedding.h"

namespace ampscope::trainer::layers {

void embedding_forward_reference(float* out, const std::int32_t* tokens, const float* wte,
                                 const float* wpe, std::size_t B, std::size_t T, std::size_t C) {
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t t = 0; t < T; ++t) {
      const auto tok = static_cast<std::size_t>(tokens[b * T + t]);
      for (std::size_t c = 0; c < C; ++c) {
        out[(b * T + t) * C + c] = wte[tok * C + c] + wpe[t * C + c];
      }
    }
  }
}

void embedding_backward_reference(float* dwte, float* dwpe, const float* dout,
                                  const std::int32_t* tokens, std::size_t B, std::size_t T,
                                  std::size_t C) {
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t t = 0; t < T; ++t) {
      const auto tok = static_cast<std::size_t>(tokens[b * T + t]);
      for (std::size_t c = 0; c < C; ++c) {
        dwte[tok * C + c] += dout[(b * T + t) * C + c];
        dwpe[t * C + c] += dout[(b * T + t) * C + c];
      }
    }
  }
}

}  // namespace ampscope::trainer::layers
