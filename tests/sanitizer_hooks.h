/* Two functions of the sanitizer allocator's interface (compiler-rt's
 * sanitizer/allocator_interface.h, which gcc 12 does not ship; libasan exports them): tests count
 * what a call allocates with them. Only in builds with AddressSanitizer (SANITIZER_HOOKS is then 1). */
#ifndef KVQ_TESTS_SANITIZER_HOOKS_H
#define KVQ_TESTS_SANITIZER_HOOKS_H

#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZER_HOOKS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZER_HOOKS 1
#endif
#endif

#ifdef SANITIZER_HOOKS
/* Called on every malloc (pointer, size) and free (pointer) of the process; up to 5 pairs. */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
/* The size of a live allocation. */
size_t __sanitizer_get_allocated_size(const volatile void *p);
#endif

#endif
