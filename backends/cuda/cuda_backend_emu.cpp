// The emulated CUDA backend (docs/CUDA.md, "The emulated backend"): cuda_backend.cu compiled by the host
// C++ compiler, against kvq's emulated CUDA runtime and thread-model emulator (runtime.cuh), so that
// the tests run the CUDA backend's host code and kernels without a GPU. A test facility: the registry
// offers it only when KVQ_CUDA_EMULATOR=1 asks for it.
#include "cuda_backend.cu"
