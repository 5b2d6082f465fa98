/* The fault-injection build's host allocations (core/fault.h): tests/meson.build force-includes this
 * header (-include) in every C file of that library variant, so that each malloc, calloc, realloc and
 * free of kvq's C code goes through core/fault.c, which fails the armed one and counts the blocks
 * held, without a wrapper at every call site of the shipped code. The C headers that declare them come
 * first, so that their declarations are not rewritten. Never included by the shipped library. */
#ifndef KVQ_CORE_FAULT_ALLOC_H
#define KVQ_CORE_FAULT_ALLOC_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

void *kvq_fault_malloc(size_t size);
void *kvq_fault_calloc(size_t count, size_t size);
void *kvq_fault_realloc(void *block, size_t size);
void kvq_fault_free(void *block);

#define malloc(size) kvq_fault_malloc(size)
#define calloc(count, size) kvq_fault_calloc(count, size)
#define realloc(block, size) kvq_fault_realloc(block, size)
#define free(block) kvq_fault_free(block)

#endif /* KVQ_CORE_FAULT_ALLOC_H */
