// QJL keys in the fused logits pass (shaders/flash_logits.comp's KVQ_FLASH_SPLIT_SCORES hook): the
// workgroup scores its split's quantized tokens with the estimator of core/methods/qjl.h through
// lookup tables of signed sums (kvq_qjl_nibble_entry), instead of each token re-deriving the query's
// sketch parts (k outlier columns of S and S_o per 4 rows, read from global memory) for each head.
// First, the pages' outlier lists and the query's values at those channels (a vec4 of the quad's
// 4 heads per channel) into shared memory. Then per sketch part, quad of heads of the pass and chunk
// of sketch rows (KVQ_QJL_FLASH_ROWS / sets, at least 32):
//   1. per group of 4 rows and page of the split (the pages' outlier lists differ; without
//      outliers, or where the split's pages share one list, every page's parts are the same, so
//      one set: QJL k = 4 on keys with 4 persistent outlier channels, 171 -> 150 CPU ms per fused
//      call on lavapipe, docs/BENCH.md, "QJL pages that share an outlier list"), one invocation computes the 4 rows'
//      query parts for the quad's 4 heads (S's outlier columns read once for the 4 heads, the list
//      and the query's values once for the 4 rows, the 4 rows' S q with one load per head) and from
//      them, in registers, the group's table: its 8 entries with bit 3 set (the other 8 are their
//      negations, kvq_qjl_half_index), each a vec4 of the 4 heads' signed sums;
//   2. each token adds its rows / 4 table entries (a nibble of its sign words each, negated where
//      the nibble's bit 3 is clear) to a vec4 sum: one load per nibble for 4 heads, where llvmpipe,
//      which runs each divergent load lane by lane (docs/VULKAN.md), paid one load per nibble and
//      head with a table per head.
// Half tables and the one S q load: QJL k = 8's fused call on lavapipe 173 -> 160 CPU ms against
// exact fp16's 173 (2-core AMD EPYC, docs/BENCH.md, "QJL k8: half tables").
// The entries -e are exact negations, so the logits are the same floats as with 16-entry tables.
// Parts in registers, not in shared memory between a loop that computes them row by row and one
// that builds the tables, and the query's values read 4 heads at a time from shared memory: with
// outliers (k = 8) 309 -> 213 CPU ms per fused call on lavapipe, and with the two choices below 183,
// against exact fp16's 158 (docs/BENCH.md, "QJL outliers on the fused path"). On a GPU only sets x
// chunk / 4 invocations (all 64) build tables, a step that is short next to the lookups.
// Each head's sum takes the same entries in the same order as with a table per head, so the logits
// are the same floats. Rounding: core/methods/qjl.h says why docs/ACCURACY.md's QJL bound covers the
// tables' order.
// Nibbles rather than bytes (measured on lavapipe, docs/VULKAN.md): a byte table of 64 rows is 2048
// entries that the workgroup builds for the tokens of one page, more work per token than the 8
// lookups it saves; and a nibble table holds for any subgroup size, unlike broadcasting the parts.
// Loops whose trip count is not constant, for lavapipe's loop limit (docs/VULKAN.md), per
// invocation: sketch parts (<= 2) x quads (<= 2) x chunks (<= 16) x ((k + 3) + (chunk / 32 + 1)) (one
// group per invocation and chunk: sets x chunk / 4 <= 64; the token's sign words of the chunk), at
// most 2 x 2 x 16 x 38 = 2432 at m = m_o = 1024, k = 32, 16-token pages and 8 heads (36352 with a
// table per head and 64-row steps; the per-token path before those took 67584), 2 x 1 x 2 x 16 =
// 64 at m = m_o = 256, k = 8, 32-token pages and 4 heads; the lists' loop, at most 2 x 3 trips;
// and their comparison, at most 3 x 8 (pages after the first x words of a list).
#define KVQ_FLASH_SPLIT_SCORES

// The prepared queries (results) 4 floats a load, where a group's 4 rows of S q are read: llvmpipe
// runs each load lane by lane, so one uvec4 load costs much less than 4 scalar ones.
layout(std430, binding = KVQ_BINDING_RESULTS) readonly buffer KvqQjlResults4 { uvec4 kvq_qjl_results4[]; };

#define KVQ_QJL_FLASH_ROWS 256u                                 // sketch rows x sets of one chunk
#define KVQ_QJL_FLASH_PAGES (KVQ_FLASH_SPLIT / KVQ_MIN_PAGE_SIZE) // pages a split spans at most
shared uint kvq_qjl_lists[KVQ_QJL_FLASH_PAGES * KVQ_MAX_OUTLIERS];   // 512 bytes
// the query's values at the pages' outlier channels, [quad][page][j]: 4 KiB
shared vec4 kvq_qjl_query[KVQ_FLASH_HEADS_PER_PASS / 4u * KVQ_QJL_FLASH_PAGES * KVQ_MAX_OUTLIERS];
shared vec4 kvq_qjl_tables[KVQ_QJL_FLASH_ROWS / 4u * 8u];             // 8 KiB: [set][group][entry 8 + e], 4 heads

// One sketch part's terms of the logits (outer = 1: the outlier sketch S_o), added to logit (outer =
// 0 sets them). Called with a constant outer, so that every choice between the sketches (the matrix,
// the sign words' and norms' offsets, the part's formula) is made at compile time: llvmpipe runs
// both sides of a branch on a value it cannot see is constant (QJL k = 8's fused call on lavapipe:
// 213 to 193 CPU ms, docs/BENCH.md, "QJL outliers on the fused path").
void kvq_qjl_flash_part(uint outer, uint heads, uint sets, uint chunk, bool mine, uint block, uint tp, uint set,
                        uint row0, inout float logit[KVQ_FLASH_HEADS_PER_PASS]) {
  uint lane = gl_LocalInvocationID.x, P = pc.page_size, d = pc.head_dim, m = pc.sketch_dim;
  uint mo = pc.outlier_sketch_dim, k = pc.outliers;
  float c_d = uintBitsToFloat(pc.constant_bits);
  uint rows = outer != 0u ? mo : m;
  uint words = mine ? kvq_qjl_sign_word_at(block, outer, tp, 0u, P, m, mo) : 0u;
  float norm = mine ? kvq_qjl_norm(block, outer, tp, P, m, mo, k) : 0.0;
  for (uint h4 = 0u; h4 < heads; h4 += 4u) { // quads of heads
    vec4 sum = vec4(0.0);
    for (uint c0 = 0u; c0 < rows; c0 += chunk) {
      barrier(); // the lists and the query's values are in place; the previous chunk's readers of the tables are done
      uint used = min(rows - c0, chunk), groups = used / 4u; // used: a multiple of 32, as sketch dimensions are
      for (uint i = lane; i < sets * groups; i += KVQ_GPU_GROUP_SIZE) { // group i: set i / groups, 4 rows from row
        uint set_i = i / groups, row = c0 + 4u * (i % groups), q_at = (h4 / 4u * KVQ_QJL_FLASH_PAGES + set_i) * KVQ_MAX_OUTLIERS;
        // the 4 rows' parts for the quad's heads: S[row][c] read once for the 4 heads, each head's
        // products those of kvq_qjl_outlier_product summed over the list in order, and the list's
        // channel and the query there read once for the 4 rows
        vec4 o0 = vec4(0.0), o1 = vec4(0.0), o2 = vec4(0.0), o3 = vec4(0.0);
        for (uint j = 0u; j < k; j++) { // queries are fp32 here (flash_logits.comp): no KVQ_IN, whose fp16 path loops
          uint c = kvq_qjl_lists[set_i * KVQ_MAX_OUTLIERS + j];
          vec4 qc = kvq_qjl_query[q_at + j];
          o0 += kvq_qjl_sketch(outer, row, c, d) * qc;
          o1 += kvq_qjl_sketch(outer, row + 1u, c, d) * qc;
          o2 += kvq_qjl_sketch(outer, row + 2u, c, d) * qc;
          o3 += kvq_qjl_sketch(outer, row + 3u, c, d) * qc;
        }
        vec4 p0 = vec4(0.0), p1 = vec4(0.0), p2 = vec4(0.0), p3 = vec4(0.0);
        for (uint g = 0u; g < 4u; g++) { // constant trips (unrolled); heads past the pass's stay 0
          if (h4 + g >= heads) continue;
          // the 4 rows' (S q) with one load (the inlier sketch only): 16-byte aligned, as m and row
          // are multiples of 4
          vec4 sq = outer == 0u ? uintBitsToFloat(kvq_qjl_results4[((row0 + h4 + g) * kvq_prepared_floats() + row) / 4u])
                                : vec4(0.0);
          p0[g] = kvq_qjl_part_of(outer, sq.x, o0[g]);
          p1[g] = kvq_qjl_part_of(outer, sq.y, o1[g]);
          p2[g] = kvq_qjl_part_of(outer, sq.z, o2[g]);
          p3[g] = kvq_qjl_part_of(outer, sq.w, o3[g]);
        }
        // the group's table, straight from the parts (no barrier between parts and tables): entry v
        // is kvq_qjl_nibble_entry's ((+-p3 +- p2) +- p1) +- p0 for the 4 heads; with v and g constant
        // (unrolled) the signs fold and the partial sums that entries share are formed once
        for (uint v = 8u; v < 16u; v++) { // the entries with bit 3 set; the others are their negations
          vec4 entry;
          for (uint g = 0u; g < 4u; g++) entry[g] = kvq_qjl_nibble_entry(v, p0[g], p1[g], p2[g], p3[g]);
          kvq_qjl_tables[i * 8u + v - 8u] = entry;
        }
      }
      barrier();
      if (mine) { // set s's groups start at s * used / 4
        uint table = set * used * 2u;
        // a loop to used / 32 rather than a guarded loop of constant bound: llvmpipe would run the
        // guarded-off words' lookups masked (k = 8: 16 of 32 per chunk; 193 to 183 CPU ms)
        for (uint w = 0u; w < used / 32u; w++) {
          uint bits = pages[words + c0 / 32u + w];
          for (uint j = 0u; j < 8u; j++) {
            uint v = (bits >> (4u * j)) & 15u;
            vec4 e = kvq_qjl_tables[table + (w * 8u + j) * 8u + kvq_qjl_half_index(v)];
            sum += (v & 8u) != 0u ? e : -e;
          }
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
  // Whether the split's pages share one outlier list (persistent outlier channels): then one set of
  // parts and tables serves them all, as without outliers (each page's parts would be the same
  // floats). Whole words of the lists: the bytes past k are 0 (kvq_qjl_put_outliers).
  bool one_list = true;
  if (k > 0u) {
    uint list0 = kvq_qjl_list_at(kvq_slot_block(first, kvh), P, m, mo, k) / 4u;
    for (uint page = 1u; page < npages; page++) {
      uint list = kvq_qjl_list_at(kvq_slot_block(first + page * span, kvh), P, m, mo, k) / 4u;
      for (uint w = 0u; w < (k + 3u) / 4u; w++)
        if (pages[list + w] != pages[list0 + w]) one_list = false;
    }
  }
  uint sets = one_list ? 1u : npages;            // sets of parts and tables
  uint chunk = 32u * (KVQ_QJL_FLASH_ROWS / 32u / sets); // rows per chunk: sets x chunk <= KVQ_QJL_FLASH_ROWS
  bool mine = visible && t < quantized;
  uint block = mine ? kvq_slot_block(t, kvh) : 0u, tp = t % P;
  uint set = one_list ? 0u : (t - first) / span;
  uint row0 = (kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h0; // the pass's first query row
  for (uint i = lane; i < npages * k; i += KVQ_GPU_GROUP_SIZE) { // the pages' outlier lists and the query there
    uint page = i / k, at = kvq_qjl_list_at(kvq_slot_block(first + page * span, kvh), P, m, mo, k);
    uint c = kvq_io_u8(at + i % k);
    kvq_qjl_lists[page * KVQ_MAX_OUTLIERS + i % k] = c;
    for (uint h4 = 0u; h4 < heads; h4 += 4u) {
      vec4 qc; // a slot past the pass's heads reads the last head's query and is not used
      for (uint g = 0u; g < 4u; g++) qc[g] = uintBitsToFloat(src[(row0 + min(h4 + g, heads - 1u)) * d + c]);
      kvq_qjl_query[(h4 / 4u * KVQ_QJL_FLASH_PAGES + page) * KVQ_MAX_OUTLIERS + i % k] = qc;
    }
  }
  kvq_qjl_flash_part(0u, heads, sets, chunk, mine, block, tp, set, row0, logit);
  if (k > 0u) kvq_qjl_flash_part(1u, heads, sets, chunk, mine, block, tp, set, row0, logit);
}
