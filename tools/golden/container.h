/*
 * The golden container (docs/FORMAT.md, "Golden files"): named records in one checksummed file.
 *   "KVQGOLD\0", u32 version 1, u32 record count, u64 file bytes,
 *   records: u32 name bytes, name, zero pad to 4, u32 kind, u32 0, u64 payload bytes, payload, pad to 4
 *   trailer: SHA-256 of everything before it.
 * Kinds: GOLDEN_BYTES (raw), GOLDEN_U32 (little-endian uint32 array), GOLDEN_F32 (little-endian fp32).
 */
#ifndef KVQ_TOOLS_GOLDEN_CONTAINER_H
#define KVQ_TOOLS_GOLDEN_CONTAINER_H

#include <stddef.h>
#include <stdint.h>

enum { GOLDEN_BYTES = 0, GOLDEN_U32 = 1, GOLDEN_F32 = 2 };

typedef struct golden_record {
  char *name;
  uint32_t kind;
  uint64_t bytes;
  uint8_t *data;
} golden_record;

typedef struct golden_file {
  golden_record *records;
  size_t count, capacity;
} golden_file;

/* Adds a record (copies name and data). Returns 0 or -1 when out of memory. */
int golden_add(golden_file *g, const char *name, uint32_t kind, const void *data, uint64_t bytes);
int golden_add_u32(golden_file *g, const char *name, const uint32_t *values, uint64_t count);
int golden_add_f32(golden_file *g, const char *name, const float *values, uint64_t count);
/* The record of that name, or NULL. */
const golden_record *golden_find(const golden_file *g, const char *name);
/* Records of kind U32 / F32 as host arrays (little-endian hosts: the payload itself). */
const uint32_t *golden_u32(const golden_record *r, uint64_t *count);
const float *golden_f32(const golden_record *r, uint64_t *count);

int golden_save(const golden_file *g, const char *path, char *error, size_t error_size);
/* Reads and verifies a container; on failure writes why into error. */
int golden_load(golden_file *g, const char *path, char *error, size_t error_size);
void golden_free(golden_file *g);

#endif
