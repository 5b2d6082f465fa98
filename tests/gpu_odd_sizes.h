/* The odd-size matrix of the GPU suite: configurations the CPU writes golden files for and every GPU
 * backend is checked against. Shared by tests/test_gpu.c (Criterion, every GPU backend) and
 * tests/test_gpu_matrices.c (the emulated CUDA backend under ThreadSanitizer and without sanitizers), so that both run the same
 * matrix. */
#ifndef KVQ_TESTS_GPU_ODD_SIZES_H
#define KVQ_TESTS_GPU_ODD_SIZES_H

#include <stdint.h>

#include "golden/cases.h"

enum { GPU_ODD_SIZE_MAX = 48, GPU_ODD_SIZE_NAME = 64 };

/*
 * 1 token, a page + 1, many pages; GQA ratios 1, 4, 7 and 8, and 12 (more query heads than the fused
 * attention takes per pass); every input dtype; with and without a residual window. Each case's two
 * sequences get different lengths, so the batch mixes them. Fills cases (names points into names) and
 * returns how many.
 */
uint32_t gpu_odd_size_cases(golden_case cases[GPU_ODD_SIZE_MAX], char names[GPU_ODD_SIZE_MAX][GPU_ODD_SIZE_NAME]);

#endif
