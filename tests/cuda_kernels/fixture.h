/*
 * The fixture file between the CPU reference (reference.c, linked with kvq) and the emulated CUDA
 * kernels' test (test_cuda_kernels.cpp, which does not link kvq, so that it builds under any
 * sanitizer): for every case, one side of a small cache built on the CPU backend. Read and written
 * in this order, little-endian, each case:
 *   kvq_fixture_case
 *   input        tokens x kv_heads x head_dim elements of input_dtype (what was appended)
 *   fixed[0..1]  fixed_floats[j] fp32 each (the side's matrices and codebooks, learned ones included)
 *   pages        pages x page_bytes: the side's pages (kvq_cache_read_pages), page e holds tokens
 *                [e * page_size, ...) of the input
 *   decoded      tokens x kv_heads x head_dim fp32: kvq_dequantize of the same tokens
 *   errors       pages x page_size x kv_heads fp32: the CPU's QUANTIZE errors of the same pages
 *                (the backend's quantize job run again on them; entries past a page's valid tokens 0)
 *   whole_pages  pages x page_size x kv_heads x head_dim fp32: the backend's dequantize job of those
 *                pages, every token of each (past the valid count: decoded from the zero padding)
 *   queries      query_rows x head_dim fp32: query rows, row r of query head r % query_heads
 *   prepared     query_rows x prepared_floats fp32: the CPU backend's PREPARE_QUERY of those rows
 *                against this side's layout and fixed arrays (values sides too: the math is the same)
 *   dots         query_rows x tokens fp32: SCORE's q.k of those rows against the pages' tokens before
 *                scaling, as the CPU backend computes them (the method's dot_page, else decode and dot)
 */
#ifndef KVQ_TESTS_CUDA_KERNELS_FIXTURE_H
#define KVQ_TESTS_CUDA_KERNELS_FIXTURE_H

#include <stdint.h>

#define KVQ_FIXTURE_SIDE_FIELDS 16u /* core/layout.h's KVQ_SIDE_FIELD_COUNT (checked by both sides) */

typedef struct kvq_fixture_case {
  char name[128];
  uint32_t side[KVQ_FIXTURE_SIDE_FIELDS]; /* KVQ_SIDE_FIELDS, in that order */
  uint32_t head_bytes, page_bytes;
  float qjl_constant;
  uint32_t input_dtype; /* KVQ_LAYOUT_F32, F16 or BF16 */
  uint32_t tokens, pages;
  uint32_t fixed_floats[2];
  uint32_t query_rows, query_heads; /* rows [position][query head] */
  uint32_t prepared_floats;         /* per query row (core/config.c's kvq_prepared_floats; 0: none) */
} kvq_fixture_case;

#endif
