# The trainer's layers, one directory each (trainer/layers/<layer>/): <layer>.h (contract),
# <layer>_reference.cc, <layer>_cpu.cc and <layer>.cu. Included by trainer/CMakeLists.txt (the CPU
# parts, in ampscope::trainer) and kernels/cuda/CMakeLists.txt (the kernels, in
# ampscope::kernels_cuda_nn), so both build the same list.
set(AMPSCOPE_TRAINER_LAYERS attention cross_entropy elementwise embedding gelu layernorm matmul)
