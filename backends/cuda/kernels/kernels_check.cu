// Build-time check (backends/cuda/meson.build) that the kernels are real CUDA: nvcc compiles them for
// every architecture kvq targets, every warning an error.
#include "convert.cuh"
#include "dequantize.cuh"
#include "flash.cuh"
#include "key_dots.cuh"
#include "kmeans.cuh"
#include "prepare.cuh"
#include "quantize.cuh"
#include "score.cuh"
#include "softmax.cuh"
#include "token_check.cuh"
#include "weighted_sum.cuh"
