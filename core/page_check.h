/* Checks that a page image is one kvq could have written (for loading files: a correct checksum
 * does not make the content trustworthy). */
#ifndef KVQ_CORE_PAGE_CHECK_H
#define KVQ_CORE_PAGE_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* 0 if the image (all kv heads) is well formed with `valid` tokens (0..P), for every layout: QJL
 * outlier lists strictly ascending and below head_dim, stored side data finite (norms, scales and
 * radii not negative), every code bit and side datum of tokens past `valid` and every padding byte
 * zero. Otherwise -1 and a reason. */
int kvq_page_image_check(const kvq_side_layout *layout, const uint8_t *image, uint32_t valid, char *why, size_t why_size);

#endif
