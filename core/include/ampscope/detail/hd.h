// AMPSCOPE_HD marks small constexpr helpers usable from both host and CUDA device code.
#pragma once

#if defined(__CUDACC__)
#define AMPSCOPE_HD __host__ __device__
#else
#define AMPSCOPE_HD
#endif
