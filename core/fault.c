/* The fault-injection build's counter (core/fault.h): compiled into the fault-injection library
 * variant only (tests/meson.build). */
#include "fault.h"

#include "fault_alloc.h"

#include <stdlib.h>

/* core/fault_alloc.h renames the allocator in this variant: this file calls the real one. */
#undef malloc
#undef calloc
#undef realloc
#undef free

static uint64_t armed, passed;
static int lost, fired;
static int64_t live;
static unsigned char trace[KVQ_FAULT_TRACE];

/* The points the armed mode fails, in their own count: every point but a wait (a failed wait is a
 * lost device), or, as a lost device, submissions and waits. Counting them apart keeps k naming a
 * point of the right kind even where a backend passes a few more or fewer points from one run to the
 * next (the CUDA backend creates its timing events as its ring of spans turns). */
static uint64_t eligible;
static kvq_fault_kind fired_kind;
static int counts_for(kvq_fault_kind kind) {
  return lost ? kind == KVQ_FAULT_SUBMIT || kind == KVQ_FAULT_WAIT : kind != KVQ_FAULT_WAIT;
}

/* kvq_fault_arm_then: the kind whose first point after the armed one fails too (KVQ_FAULT_KINDS:
 * none), and whether it did. */
static kvq_fault_kind then_kind = KVQ_FAULT_KINDS;
static int then_fired;

int kvq_fault_point(kvq_fault_kind kind) {
  passed++;
  if (passed <= KVQ_FAULT_TRACE) trace[passed - 1] = (unsigned char)kind;
  if (fired && !then_fired && kind == then_kind) return then_fired = 1;
  if (!counts_for(kind) || ++eligible != armed) return 0;
  fired = 1;
  fired_kind = kind;
  return 1;
}

int kvq_fault_lost(void) { return lost; }

void kvq_fault_arm(uint64_t k, int as_lost) {
  armed = k;
  lost = as_lost;
  passed = eligible = 0;
  fired = 0;
  then_kind = KVQ_FAULT_KINDS;
  then_fired = 0;
}

void kvq_fault_arm_then(uint64_t k, kvq_fault_kind then) {
  kvq_fault_arm(k, 0);
  then_kind = then;
}

int kvq_fault_then_fired(void) { return then_fired; }

uint64_t kvq_fault_count(void) { return passed; }
uint64_t kvq_fault_eligible(void) { return eligible; }
int kvq_fault_fired(void) { return fired; }
kvq_fault_kind kvq_fault_fired_kind(void) { return fired ? fired_kind : KVQ_FAULT_KINDS; }
kvq_fault_kind kvq_fault_kind_at(uint64_t i) {
  return i >= 1 && i <= passed && i <= KVQ_FAULT_TRACE ? (kvq_fault_kind)trace[i - 1] : KVQ_FAULT_KINDS;
}
int64_t kvq_fault_live_blocks(void) { return live; }

void *kvq_fault_malloc(size_t size) {
  if (kvq_fault_point(KVQ_FAULT_HOST_ALLOC)) return NULL;
  void *p = malloc(size);
  if (p) live++;
  return p;
}

void *kvq_fault_calloc(size_t count, size_t size) {
  if (kvq_fault_point(KVQ_FAULT_HOST_ALLOC)) return NULL;
  void *p = calloc(count, size);
  if (p) live++;
  return p;
}

/* A failed realloc leaves the block as it was, as the real one does. */
void *kvq_fault_realloc(void *block, size_t size) {
  if (kvq_fault_point(KVQ_FAULT_HOST_ALLOC)) return NULL;
  void *p = realloc(block, size);
  if (p && !block) live++;
  return p;
}

void kvq_fault_free(void *block) {
  if (block) live--;
  free(block);
}
