/* SHA-256 (FIPS 180-4): checksums of saved caches and golden files, fingerprints of matrices. */
#ifndef KVQ_CORE_SHA256_H
#define KVQ_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvq_sha256 {
  uint32_t state[8];
  uint64_t length; /* bytes hashed so far */
  uint8_t block[64];
  size_t fill;
} kvq_sha256;

void kvq_sha256_init(kvq_sha256 *h);
void kvq_sha256_update(kvq_sha256 *h, const void *data, size_t size);
void kvq_sha256_final(kvq_sha256 *h, uint8_t digest[32]);
void kvq_sha256_digest(const void *data, size_t size, uint8_t digest[32]);
/* Lowercase hex of a digest into out[65] (NUL-terminated). */
void kvq_sha256_hex(const uint8_t digest[32], char out[65]);

#endif
