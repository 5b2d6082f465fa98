/* The saved-cache file format (docs/FORMAT.md, "Saved caches") and the config record that the
 * golden files share with it. */
#ifndef KVQ_CORE_SAVEFILE_H
#define KVQ_CORE_SAVEFILE_H

#include "bytes.h"
#include "internal.h"

#define KVQ_FILE_MAGIC "KVQCACHE"
#define KVQ_FILE_VERSION 1u
#define KVQ_FILE_HEADER_BYTES 64u

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
