/* Fault injection (docs/RELIABILITY.md, "Fault injection"): every point where kvq asks the host or a
 * device for something that can fail (a host allocation, a device allocation, a device object, a map,
 * a copy, a kernel launch, a submission, a wait) asks kvq_fault_point first. In the shipped library
 * kvq_fault_point is the constant 0 and costs nothing; in the fault-injection test build
 * (KVQ_FAULT_INJECTION, tests/meson.build) it counts the points a call passes and makes the armed one
 * fail, so that a test can fail each of them in turn (tests/test_fault.c). Not part of the API.
 * C and C++ (the CUDA backend's host code). */
#ifndef KVQ_CORE_FAULT_H
#define KVQ_CORE_FAULT_H

#include <stdint.h>

/* What a point asks for; the kind decides the error the point returns when it fails. */
typedef enum kvq_fault_kind {
  KVQ_FAULT_HOST_ALLOC,   /* malloc, calloc, realloc */
  KVQ_FAULT_DEVICE_ALLOC, /* device memory: vkAllocateMemory, cudaMalloc */
  KVQ_FAULT_OBJECT,       /* a device object: buffer, pipeline, descriptor set, command buffer, stream, event */
  KVQ_FAULT_MAP,          /* mapping device memory for the host */
  KVQ_FAULT_COPY,         /* a host<->device copy or fill */
  KVQ_FAULT_LAUNCH,       /* recording or launching device work */
  KVQ_FAULT_SUBMIT,       /* vkQueueSubmit */
  KVQ_FAULT_WAIT,         /* a fence wait, a stream or event synchronization */
  KVQ_FAULT_KINDS
} kvq_fault_kind;

#ifdef KVQ_FAULT_INJECTION
#ifdef __cplusplus
extern "C" {
#endif
/* Whether this point must fail: 1 for the armed point (kvq_fault_arm), else 0. */
int kvq_fault_point(kvq_fault_kind kind);
/* Whether the armed failure is a lost device (the device-lost mode of kvq_fault_arm): device points
 * then fail with the backend's device-lost error instead of their kind's. */
int kvq_fault_lost(void);

/* Test-only control (tests/test_fault.c). Not thread-safe: points are counted on the calling thread's
 * order, so a test runs kvq on one thread while it counts. */
/* Count from 0 again and fail the k-th point the mode fails (1-based; 0: fail none, count only):
 * every kind but KVQ_FAULT_WAIT (a failed wait is a lost device), or with `lost` the submissions and
 * waits, as a lost device. */
void kvq_fault_arm(uint64_t k, int lost);
/* As kvq_fault_arm(k, 0), and then the first point of kind `then` after point k fails too: a second
 * failure, in what a call does after its first (tests/test_fault_undo.c: the copies that put back
 * what a failed call overwrote). kvq_fault_then_fired says whether it did. */
void kvq_fault_arm_then(uint64_t k, kvq_fault_kind then);
int kvq_fault_then_fired(void);
/* Points passed since kvq_fault_arm (all kinds; those the armed mode fails), and whether the armed
 * one was reached. */
uint64_t kvq_fault_count(void);
uint64_t kvq_fault_eligible(void);
int kvq_fault_fired(void);
/* The kind of the point that failed; KVQ_FAULT_KINDS when none did. */
kvq_fault_kind kvq_fault_fired_kind(void);
/* The kind of point `i` (1-based) since kvq_fault_arm, for the first KVQ_FAULT_TRACE points;
 * KVQ_FAULT_KINDS past them. */
enum { KVQ_FAULT_TRACE = 1 << 16 };
kvq_fault_kind kvq_fault_kind_at(uint64_t i);
/* Host blocks kvq's C code holds now: its malloc/calloc/realloc minus its free (core/fault_alloc.h). */
int64_t kvq_fault_live_blocks(void);
#ifdef __cplusplus
}
#endif
#else
#define kvq_fault_point(kind) 0
#define kvq_fault_lost() 0
#endif

#endif /* KVQ_CORE_FAULT_H */
