// QJL keys in the fused logits pass (shaders/flash_logits.comp's KVQ_FLASH_SPLIT_SCORES hook): the
// workgroup scores its split's quantized tokens with the estimator of core/methods/qjl.h through
// lookup tables of signed sums (kvq_qjl_nibble_entry), instead of each token re-deriving the query's
// sketch parts (k outlier columns of S and S_o per 4 rows, read from global memory) for each head.
// Per sketch part, head of the pass and step of KVQ_QJL_FLASH_ROWS rows:
//   1. the query parts of the step's rows, once per page of the split (the pages' outlier lists
//      differ; without outliers every page's parts are S q's, so one set), a row per invocation;
//   2. their tables, 16 entries per 4 rows, a few per invocation;
//   3. each token adds its rows / 4 table entries (a nibble of its sign words each) to its sum.
// Rounding: core/methods/qjl.h says why docs/ACCURACY.md's QJL bound covers the tables' order.
// Nibbles rather than bytes (measured on lavapipe, docs/VULKAN.md): a byte table of 64 rows is 2048
// entries that the workgroup builds for the tokens of one page, more work per token than the 8
// lookups it saves; and a nibble table holds for any subgroup size, unlike broadcasting the parts.
// Loops whose trip count is not constant, for lavapipe's loop limit (docs/VULKAN.md), per
// invocation: sketch parts (<= 2) x heads (<= 8) x steps (<= 16) x (sets (<= 4) x (k + 3) + 2),
// at most 2 x 8 x 16 x 142 = 36352 at m = m_o = 1024, k = 32, 16-token pages and 8 heads (the
// per-token path this replaces took 8 x 256 x 33 = 67584 there), 2 x 4 x 4 x 24 = 768 at
// m = m_o = 256, k = 8, 32-token pages and 4 heads.
#define KVQ_FLASH_SPLIT_SCORES

#define KVQ_QJL_FLASH_ROWS 64u                                  // sketch rows per step: two sign words
#define KVQ_QJL_FLASH_PAGES (KVQ_FLASH_SPLIT / KVQ_MIN_PAGE_SIZE) // pages a split spans at most
#define KVQ_QJL_FLASH_TABLE (KVQ_QJL_FLASH_ROWS / 4u * 16u)     // entries of one page's tables of a step
shared uint kvq_qjl_lists[KVQ_QJL_FLASH_PAGES * KVQ_MAX_OUTLIERS];                // 512 bytes
shared float kvq_qjl_parts[KVQ_QJL_FLASH_PAGES * KVQ_QJL_FLASH_ROWS];             // 1 KiB
shared float kvq_qjl_tables[KVQ_QJL_FLASH_PAGES * KVQ_QJL_FLASH_TABLE];           // 4 KiB

// logit[g] = q.k_t by the estimator for the invocation's token t = first + lane where it is visible
// and quantized, for each head g < heads of the pass (query row r, heads h0 ..); other tokens' logits
// are left as they are. Called by every invocation of the workgroup (barriers).
void kvq_flash_split_scores(uint r, uint kvh, uint h0, uint heads, uint first, bool visible,
                            inout float logit[KVQ_FLASH_HEADS_PER_PASS]) {
  uint quantized = kvq_seq(KVQ_SEQ_QUANTIZED);
  if (quantized <= first) return; // uniform: the split is all window tokens
  uint lane = gl_LocalInvocationID.x, t = first + lane, P = pc.page_size, d = pc.head_dim, m = pc.sketch_dim;
  uint mo = pc.outlier_sketch_dim, k = pc.outliers;
  uint span = min(P, KVQ_FLASH_SPLIT), end = min(quantized, first + KVQ_FLASH_SPLIT);
  uint npages = (end - first + span - 1u) / span; // the split's quantized tokens lie on these pages
  uint sets = k > 0u ? npages : 1u;              // sets of parts and tables
  bool mine = visible && t < quantized;
  uint block = mine ? kvq_slot_block(t, kvh) : 0u, tp = t % P;
  uint set = k > 0u ? (t - first) / span : 0u;
  for (uint i = lane; i < npages * k; i += KVQ_GPU_GROUP_SIZE) { // the pages' outlier lists
    uint page = i / k, at = kvq_qjl_list_at(kvq_slot_block(first + page * span, kvh), P, m, mo, k);
    kvq_qjl_lists[page * KVQ_MAX_OUTLIERS + i % k] = kvq_io_u8(at + i % k);
  }
  uint row0 = (kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h0; // the pass's first query row
  float c_d = uintBitsToFloat(pc.constant_bits);
  for (uint outer = 0u; outer < (k > 0u ? 2u : 1u); outer++) {
    uint rows = outer != 0u ? mo : m;
    uint words = mine ? kvq_qjl_sign_word_at(block, outer, tp, 0u, P, m, mo) : 0u;
    float norm = mine ? kvq_qjl_norm(block, outer, tp, P, m, mo, k) : 0.0;
    for (uint g = 0u; g < heads; g++) {
      uint q = (row0 + g) * d, p = (row0 + g) * kvq_prepared_floats();
      float sum = 0.0;
      for (uint c0 = 0u; c0 < rows; c0 += KVQ_QJL_FLASH_ROWS) {
        barrier(); // the lists are in place; the previous step's readers of parts and tables are done
        uint used = min(rows - c0, KVQ_QJL_FLASH_ROWS); // 32 or 64: sketch dimensions are multiples of 32
        for (uint s = 0u; s < sets; s++) { // parts: a row per invocation
          if (lane >= used) continue;
          kvq_acc outliers = 0.0;
          for (uint j = 0u; j < k; j++) { // queries are fp32 here (flash_logits.comp): no KVQ_IN, whose fp16 path loops
            uint c = kvq_qjl_lists[s * KVQ_MAX_OUTLIERS + j];
            outliers += kvq_qjl_outlier_product(outer, c0 + lane, c, uintBitsToFloat(src[q + c]), d);
          }
          kvq_qjl_parts[s * KVQ_QJL_FLASH_ROWS + lane] = kvq_qjl_query_part_from(outer, c0 + lane, p, outliers);
        }
        barrier();
        for (uint s = 0u; s < sets; s++) { // tables: 4 entries of one group per invocation, its parts read once
          uint at = s * KVQ_QJL_FLASH_ROWS + (lane / 4u) * 4u, v0 = (lane % 4u) * 4u;
          float p0 = kvq_qjl_parts[at], p1 = kvq_qjl_parts[at + 1u], p2 = kvq_qjl_parts[at + 2u], p3 = kvq_qjl_parts[at + 3u];
          for (uint y = 0u; y < 4u; y++)
            kvq_qjl_tables[s * KVQ_QJL_FLASH_TABLE + (lane / 4u) * 16u + v0 + y] = kvq_qjl_nibble_entry(v0 + y, p0, p1, p2, p3);
        }
        barrier();
        if (mine) { // constant trip counts: unrolled, nothing counted against the loop limit
          uint table = set * KVQ_QJL_FLASH_TABLE, bits = pages[words + c0 / 32u];
          for (uint j = 0u; j < 8u; j++) sum += kvq_qjl_tables[table + j * 16u + ((bits >> (4u * j)) & 15u)];
          if (used > 32u) {
            bits = pages[words + c0 / 32u + 1u];
            for (uint j = 0u; j < 8u; j++) sum += kvq_qjl_tables[table + (8u + j) * 16u + ((bits >> (4u * j)) & 15u)];
          }
        }
      }
      if (mine) {
        float e = kvq_qjl_estimate(c_d, rows, norm, sum);
        logit[g] = outer == 0u ? e : logit[g] + e;
      }
    }
  }
}
