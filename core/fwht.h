/* The in-place Walsh-Hadamard butterflies of PolarQuant's Hadamard rotation, in the order
 * docs/FORMAT.md fixes (for len = 1, 2, .., d/2, for each block of 2 len, for j in its first half:
 * a = z[j], b = z[j + len]; z[j] = a + b; z[j + len] = a - b). One definition for every element
 * type: KVQ_DEFINE_FWHT(name, type) defines `static void name(type *z, uint32_t d)`. Codes are
 * decided by the fp32 form of the shared method header, kvq_polar_butterflies (core/methods/polar.h);
 * this macro serves host code in other types (core/learn.c rotates calibration data in double). */
#ifndef KVQ_CORE_FWHT_H
#define KVQ_CORE_FWHT_H

#include <stdint.h>

#define KVQ_DEFINE_FWHT(name, type)                                                                              \
  static void name(type *z, uint32_t d) {                                                                        \
    for (uint32_t len = 1; len < d; len <<= 1)                                                                   \
      for (uint32_t i = 0; i < d; i += 2 * len)                                                                  \
        for (uint32_t j = i; j < i + len; j++) {                                                                 \
          const type a = z[j], b = z[j + len];                                                                   \
          z[j] = a + b;                                                                                          \
          z[j + len] = a - b;                                                                                    \
        }                                                                                                        \
  }

#endif
