/* The saved-cache and codebook file formats (docs/FORMAT.md): the pieces core/savefile_cache.c,
 * core/savefile_codebooks.c and core/savefile_policy.c share, and the config record that the golden
 * files share with them. */
#ifndef KVQ_CORE_SAVEFILE_H
#define KVQ_CORE_SAVEFILE_H

#include "bytes.h"
#include "internal.h"

#define KVQ_FILE_MAGIC "KVQCACHE"
#define KVQ_FILE_VERSION 1u
#define KVQ_FILE_HEADER_BYTES 64u

/* Section tags: four ASCII characters read as a little-endian u32. */
enum {
  KVQ_TAG_CONF = 0x464e4f43u, /* "CONF" */
  KVQ_TAG_MATX = 0x5854414du, /* "MATX" */
  KVQ_TAG_SEQS = 0x53514553u, /* "SEQS" */
  KVQ_TAG_PAGE = 0x45474150u, /* "PAGE" */
  KVQ_TAG_WIND = 0x444e4957u, /* "WIND" */
  KVQ_TAG_CODE = 0x45444f43u, /* "CODE" */
  KVQ_TAG_PLCY = 0x59434c50u, /* "PLCY" */
};

/* ---- What cache and codebook files share (core/savefile_sections.c) ---------------------------- */

/* The 64-byte header (magic, version, header bytes, file bytes patched by kvq_file_end, flags,
 * section count, 32 zero bytes); returns where the file-bytes field is. */
uint64_t kvq_file_begin(kvq_writer *w, const char *magic, uint32_t flags, uint32_t sections);
/* Patches the file's size into its header and appends the SHA-256 of everything before it. */
void kvq_file_end(kvq_writer *w, uint64_t file_bytes_at);
/* Checks a whole file's framing: magic (else BAD_FORMAT, or TRUNCATED for a prefix of it), version
 * (VERSION), header and file sizes (TRUNCATED, BAD_FORMAT for trailing bytes), SHA-256 (CHECKSUM),
 * zero reserved bytes. Gives the header's flags and section count and a reader over the sections.
 * `kind` ("cache", "codebook") and `who` (the public function) word the messages. */
kvq_status kvq_file_open(kvq_context *ctx, const void *buffer, size_t size, const char *magic, const char *kind,
                         const char *who, uint32_t *flags, uint32_t *sections, kvq_reader *body);

/* A section: u32 tag, u32 0, u64 payload bytes, the payload, zero padding to 8 bytes. Begin returns
 * where the size goes; end pads and patches it. */
uint64_t kvq_section_begin(kvq_writer *w, uint32_t tag);
void kvq_section_end(kvq_writer *w, uint64_t at);
/* The next section, which must carry `tag`: its payload as a reader, `file` moved past its zero
 * padding. 0 when it is missing, another one, or malformed. */
int kvq_next_section(kvq_reader *file, uint32_t tag, kvq_reader *out);
/* Whether a section's payload was read to its last byte, and no further. */
int kvq_section_finished(const kvq_reader *r);

/* A fixed-array section: every matrix and codebook of the cache, or with learned_only its learned
 * codebooks (u32 count, then per array u32 layer, side, index, kind, ready, 0, u64 floats, SHA-256,
 * the floats). */
void kvq_put_fixed(kvq_writer *w, const kvq_cache *cache, int learned_only);
/* Reads one into dest[(layer * 2 + side) * KVQ_SIDE_FIXED + index] (arrays sized as the cache's);
 * ready[layer * 2 + side] receives learned codebooks' readiness. Every array the cache needs (with
 * learned_only, every learned one) must appear once, with the cache's kind and size, finite values
 * and a matching SHA-256; random and computed arrays must equal the ones already in dest (what the
 * seed and config give), learned ones pass kvq_fixed_check. `who` words the messages. */
kvq_status kvq_get_fixed(kvq_context *ctx, const kvq_cache *cache, kvq_reader *r, int learned_only, float **dest, int *ready,
                         const char *who);

/* The three ways to save, written once: the size (write into a NULL writer), into caller memory,
 * and to a file (assembled in memory, written to path + ".tmp-kvq", synced and renamed over path).
 * `write` writes (or, with w->data == NULL, measures) the whole file; `who` words the messages. */
typedef kvq_status (*kvq_file_writer)(kvq_cache *cache, kvq_writer *w);
kvq_status kvq_file_save_size(kvq_cache *cache, kvq_file_writer write, uint64_t *bytes, const char *who);
kvq_status kvq_file_save_to_memory(kvq_cache *cache, kvq_file_writer write, void *buffer, size_t capacity,
                                   size_t *written, const char *who);
kvq_status kvq_file_save(kvq_cache *cache, kvq_file_writer write, const char *path, const char *who);
/* Reads a whole file into a malloc'ed buffer (free() it). */
kvq_status kvq_file_read(kvq_context *ctx, const char *path, uint8_t **out, size_t *out_size, const char *who);

/* The config record: 8 u32/u64 fields, then per layer 3 u32 and two method records (docs/FORMAT.md). */
#define KVQ_METHOD_RECORD_WORDS 23
void kvq_put_config(kvq_writer *w, const kvq_cache_config *config);
/* Reads a config record; *layers is allocated (free() it). Returns 0, or -1 on a short read or
 * when layer_count is beyond the file's size or 4096. The config is not validated here. */
int kvq_get_config(kvq_reader *r, kvq_cache_config *config, kvq_layer_config **layers);

/* A token policy: 6 u32 (kind, sinks, recent, heavy, heavy_fraction and lambda as fp32 bits). */
void kvq_put_policy(kvq_writer *w, const kvq_policy_config *policy);
void kvq_get_policy(kvq_reader *r, kvq_policy_config *policy);

/* A token statistics record in the PLCY section: u32 position, fp64 attention, fp32 key and value errors. */
#define KVQ_STATISTICS_RECORD_BYTES 20u
/* The policy section's checks pass over a sequence's positions at most this many times, each pass
 * visiting the positions of its page-table entries and those past its pages (the window): what tests
 * bound loading work with (kvq_load_work, core/internal.h). */
#define KVQ_POLICY_POSITION_PASSES 5u

/* The PLCY section (core/savefile_policy.c). Reading needs the sequences loaded; it validates
 * everything and sets the cache's policy. */
void kvq_put_policy_section(kvq_writer *w, const kvq_cache *cache);
kvq_status kvq_get_policy_section(kvq_cache *cache, kvq_reader *r);
/* Without a PLCY section: page e is page number e, every token kept. */
void kvq_default_page_numbers(kvq_cache *cache, kvq_sequence *seq);

#endif
