// Whether CUDA work can run here at all. Callers (the agent, the trainer, the CUDA tests) ask
// this before touching anything else in ampscope/cuda/ so that a machine without a driver or a
// device degrades to the CPU path instead of failing.
// Thread safety: safe to call from any thread; the answer is computed once per process.
#pragma once

namespace ampscope::cuda {

// True when the CUDA runtime finds a driver and at least one device. Never throws and prints
// nothing. When it is false, leave the rest of CUDA alone: without a driver the runtime reports
// its failed initialisation from every later call (cudaGetLastError included) for the life of
// the process.
bool cuda_device_available();

}  // namespace ampscope::cuda
