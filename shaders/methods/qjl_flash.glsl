// QJL keys in the fused logits pass (shaders/flash_logits.comp's KVQ_FLASH_SPLIT_SCORES hook): the
// workgroup scores its split's quantized tokens with the estimator of core/methods/qjl.h through
// lookup tables of signed sums (kvq_qjl_nibble_entry), instead of each token re-deriving the query's
// sketch parts (k outlier columns of S and S_o per 4 rows, read from global memory) for each head.
// Per sketch part, quad of heads of the pass and chunk of sketch rows (KVQ_QJL_FLASH_ROWS / sets,
// at least 32):
//   1. the query parts of the chunk's rows for the quad's 4 heads, once per page of the split (the
//      pages' outlier lists differ; without outliers every page's parts are S q's, so one set), a
//      row of every head per invocation;
//   2. their tables, 16 entries per 4 rows, each entry a vec4 of the 4 heads' signed sums;
//   3. each token adds its rows / 4 table entries (a nibble of its sign words each) to a vec4 sum:
//      one load per nibble for 4 heads, where llvmpipe, which runs each divergent load lane by lane
//      (docs/VULKAN.md), paid one load per nibble and head with a table per head.
// Each head's sum takes the same entries in the same order as with a table per head, so the logits
// are the same floats. Rounding: core/methods/qjl.h says why docs/ACCURACY.md's QJL bound covers the
// tables' order.
// Nibbles rather than bytes (measured on lavapipe, docs/VULKAN.md): a byte table of 64 rows is 2048
// entries that the workgroup builds for the tokens of one page, more work per token than the 8
// lookups it saves; and a nibble table holds for any subgroup size, unlike broadcasting the parts.
// Loops whose trip count is not constant, for lavapipe's loop limit (docs/VULKAN.md), per
// invocation: sketch parts (<= 2) x quads (<= 2) x chunks (<= 32) x (parts (<= 2) x (k + 1) + 6),
// at most 2 x 2 x 32 x 72 = 9216 at m = m_o = 1024, k = 32, 16-token pages and 8 heads (36352 with
// a table per head and 64-row steps; the per-token path before those took 67584), 2 x 1 x 4 x 24 =
// 192 at m = m_o = 256, k = 8, 32-token pages and 4 heads.
#define KVQ_FLASH_SPLIT_SCORES

#define KVQ_QJL_FLASH_ROWS 128u                                 // sketch rows x sets of one chunk
#define KVQ_QJL_FLASH_PAGES (KVQ_FLASH_SPLIT / KVQ_MIN_PAGE_SIZE) // pages a split spans at most
shared uint kvq_qjl_lists[KVQ_QJL_FLASH_PAGES * KVQ_MAX_OUTLIERS];   // 512 bytes
shared vec4 kvq_qjl_parts[KVQ_QJL_FLASH_ROWS];                        // 2 KiB: [set][row], 4 heads
shared vec4 kvq_qjl_tables[KVQ_QJL_FLASH_ROWS / 4u * 16u];            // 8 KiB: [set][group][nibble], 4 heads

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
  uint chunk = 32u * (KVQ_QJL_FLASH_ROWS / 32u / sets); // rows per chunk: sets x chunk <= KVQ_QJL_FLASH_ROWS
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
    for (uint h4 = 0u; h4 < heads; h4 += 4u) { // quads of heads
      vec4 sum = vec4(0.0);
      for (uint c0 = 0u; c0 < rows; c0 += chunk) {
        barrier(); // the lists are in place; the previous chunk's readers of parts and tables are done
        uint used = min(rows - c0, chunk); // a multiple of 32: sketch dimensions are
        for (uint i = lane; i < sets * used; i += KVQ_GPU_GROUP_SIZE) { // parts: set i / used, row c0 + i % used
          uint s = i / used, row = c0 + i % used;
          // S[row][c] read once for the quad's heads (each head's products those of
          // kvq_qjl_outlier_product, summed over the list in order); a slot past the pass's heads
          // reads the last head's query and is not used
          vec4 outliers = vec4(0.0), part = vec4(0.0);
          for (uint j = 0u; j < k; j++) { // queries are fp32 here (flash_logits.comp): no KVQ_IN, whose fp16 path loops
            uint c = kvq_qjl_lists[s * KVQ_MAX_OUTLIERS + j];
            kvq_acc s_rc = kvq_qjl_sketch(outer, row, c, d);
            for (uint g = 0u; g < 4u; g++) outliers[g] += s_rc * uintBitsToFloat(src[(row0 + min(h4 + g, heads - 1u)) * d + c]);
          }
          for (uint g = 0u; g < 4u; g++) // constant trips (unrolled); heads past the pass's stay 0
            if (h4 + g < heads) part[g] = kvq_qjl_query_part_from(outer, row, (row0 + h4 + g) * kvq_prepared_floats(), outliers[g]);
          kvq_qjl_parts[i] = part;
        }
        barrier();
        for (uint i = lane; i < sets * used; i += KVQ_GPU_GROUP_SIZE) { // tables: 4 entries of group i / 4, its parts read once
          uint at = (i / 4u) * 4u, v0 = (i % 4u) * 4u;
          vec4 p0 = kvq_qjl_parts[at], p1 = kvq_qjl_parts[at + 1u], p2 = kvq_qjl_parts[at + 2u], p3 = kvq_qjl_parts[at + 3u];
          for (uint y = 0u; y < 4u; y++) {
            vec4 e;
            for (uint g = 0u; g < 4u; g++) e[g] = kvq_qjl_nibble_entry(v0 + y, p0[g], p1[g], p2[g], p3[g]);
            kvq_qjl_tables[at * 4u + v0 + y] = e;
          }
        }
        barrier();
        if (mine) { // set s's groups start at s * used / 4; constant trip counts (unrolled, guarded)
          uint table = set * used * 4u;
          for (uint w = 0u; w < KVQ_QJL_FLASH_ROWS / 32u; w++) {
            if (w * 32u >= used) continue;
            uint bits = pages[words + c0 / 32u + w];
            for (uint j = 0u; j < 8u; j++) sum += kvq_qjl_tables[table + (w * 8u + j) * 16u + ((bits >> (4u * j)) & 15u)];
          }
        }
      }
      if (mine) {
        for (uint g = 0u; g < KVQ_FLASH_HEADS_PER_PASS; g++) { // constant indices into logit
          if (g < h4 || g >= h4 + 4u || g >= heads) continue;
          float e = kvq_qjl_estimate(c_d, rows, norm, sum[g - h4]);
          logit[g] = outer == 0u ? e : logit[g] + e;
        }
      }
    }
  }
}
