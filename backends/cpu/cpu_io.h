/*
 * The C definition of the accessors of the shared method headers (core/methods/io.h): a kvq_io holds
 * the base pointers, and the CPU addresses one head block at a time, so its pool is the head block
 * (byte offset 0) and its input the method's fp32 workspace. Include this, then core/methods/<method>.h.
 */
#ifndef KVQ_BACKENDS_CPU_CPU_IO_H
#define KVQ_BACKENDS_CPU_CPU_IO_H

#include <stdint.h>

#include "core/bytes.h"
#include "cpu.h"

typedef struct kvq_io {
  uint8_t *page;         /* the head block: byte 0 of the pool the shared code addresses */
  const float *in;       /* the input: tokens being encoded, or the query being prepared */
  const float *fixed0;   /* the side's fixed arrays (NULL if absent) */
  const float *fixed1;
  const float *prepared; /* the prepared query, when scoring */
} kvq_io;

static inline void kvq_cpu_set_word(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kvq_cpu_or_word(uint8_t *p, uint32_t v) { kvq_cpu_set_word(p, kvq_le32(p) | v); }

#define KVQ_IO_PARAM const kvq_io *io,
#define KVQ_IO io,
#define KVQ_IN(i) (io->in[(i)])
#define KVQ_PAGE(w) kvq_le32(io->page + 4u * (uint64_t)(w))
#define KVQ_PAGE_SET(w, v) kvq_cpu_set_word(io->page + 4u * (uint64_t)(w), (v))
#define KVQ_PAGE_OR(w, v) kvq_cpu_or_word(io->page + 4u * (uint64_t)(w), (v))
#define KVQ_FIXED0(i) (io->fixed0[(i)])
#define KVQ_FIXED1(i) (io->fixed1[(i)])
#define KVQ_PREPARED(i) (io->prepared[(i)])

#include "core/methods/io.h"

/* The accessors of one head block. Decoding only reads the block: the cast lets one struct serve. */
static inline kvq_io kvq_cpu_io(const cpu_head *h, const uint8_t *block, const float *in, const float *prepared) {
  return (kvq_io){.page = (uint8_t *)block, .in = in, .fixed0 = h->fixed[0], .fixed1 = h->fixed[1], .prepared = prepared};
}

#endif
