// Build-time check (tests/cuda_emu/meson.build) that the kernels the emulator tests run are real
// CUDA: nvcc compiles them for sm_80 with every warning an error.
#include "emu_bugs.cuh"
#include "emu_kernels.cuh"

template __global__ void emu_block_sum<128>(const float *__restrict__, float *__restrict__, float *, int *, int);
template __global__ void emu_block_sum<256>(const float *__restrict__, float *__restrict__, float *, int *, int);
template __global__ void emu_block_sum<1024>(const float *__restrict__, float *__restrict__, float *, int *, int);
