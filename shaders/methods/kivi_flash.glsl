// KIVI keys in the fused logits pass (shaders/flash_logits.comp's KVQ_FLASH_SPLIT_SCORES hook). A
// KIVI key channel decodes to min_c + code_tc scale_c with min_c and scale_c shared by the tokens of
// a token group, so over a group (the math: core/methods/kivi.h, kvq_kivi_fold_scale,
// kvq_kivi_fold_bias and kvq_kivi_code_at; this file decides who computes what)
//   q . k_t = sum_c q_c min_c + sum_c (q_c scale_c) code_tc:
// the workgroup folds the query into the parameters once per head of the pass and token group of
// the split (the folded query q_c scale_c into shared memory, 4 channels a vec4, and the bias
// sum_c q_c min_c), and each token then sums its codes against it, a run of 8 channels from one code
// word where the width allows. Per token and channel that leaves a shift, a mask, a conversion and
// one FMA per head, where decoding first (kvq_decode_token) read a parameter word, converted its
// two fp16 halves and did two more operations, for each channel of each token; and one shared load
// serves 4 channels, where the query was read a float at a time (llvmpipe runs every load lane by
// lane, docs/VULKAN.md). Issue 11 asks for this folding.
// Rounding: the sum is no longer kvq_decode's values dotted with q, so the logits are not the same
// floats as the unfused SCORE's; docs/ACCURACY.md's KIVI row bounds both orders (its A sums
// |q_c| (|min_c| + code scale_c), which covers the folded terms, tools/golden/reference.c).
// Shared memory: the folded query of the split's groups (slots) must fit KVQ_KIVI_FOLDED_QUADS
// vec4s; where it does not (small token groups with 8 heads a pass and head_dim 256), the tokens are
// scored by decoding, as before. Both choices are uniform over the workgroup (push constants).
#define KVQ_FLASH_SPLIT_SCORES

#define KVQ_KIVI_FOLDED_QUADS 512u                  // 8 KiB: [slot][head][channel / 4]
#define KVQ_KIVI_BIASES (KVQ_KIVI_FOLDED_QUADS / 4u) // [slot][head]: head_dim >= 16, so slots x heads <= this
shared vec4 kvq_kivi_folded[KVQ_KIVI_FOLDED_QUADS];
shared float kvq_kivi_bias[KVQ_KIVI_BIASES];

// sum[g] += the folded query of head g at the 8 channels of quad `at` (and the next) times their codes.
void kvq_kivi_add_run(uint at, uint d4, uint heads, float code[8], inout float sum[KVQ_FLASH_HEADS_PER_PASS]) {
  for (uint g = 0u; g < KVQ_FLASH_HEADS_PER_PASS; g++) { // constant indices into sum
    if (g >= heads) continue;
    vec4 f0 = kvq_kivi_folded[at + g * d4], f1 = kvq_kivi_folded[at + g * d4 + 1u];
    sum[g] += f0.x * code[0] + f0.y * code[1] + f0.z * code[2] + f0.w * code[3] + f1.x * code[4] + f1.y * code[5] +
              f1.z * code[6] + f1.w * code[7];
  }
}

// logit[g] = q.k_t for the invocation's token t = first + lane where it is visible and quantized,
// for each head g < heads of the pass (query row r, heads h0 ..); other tokens' logits are left as
// they are. Called by every invocation of the workgroup (barriers).
void kvq_flash_split_scores(uint r, uint kvh, uint h0, uint heads, uint first, bool visible,
                            inout float logit[KVQ_FLASH_HEADS_PER_PASS]) {
  uint quantized = kvq_seq(KVQ_SEQ_QUANTIZED);
  if (quantized <= first) return; // uniform: the split is all window tokens
  uint lane = gl_LocalInvocationID.x, t = first + lane, P = pc.page_size, d = pc.head_dim, b = pc.bits;
  uint Gt = pc.group, d4 = d / 4u, row0 = (kvq_seq(KVQ_SEQ_QUERY_FIRST) + r) * pc.query_heads + h0;
  uint group_log2 = kvq_log2_pow2(Gt);
  // The split's token groups that hold quantized tokens: a group lies in one page (Gt divides P,
  // core/config.c), and splits start at multiples of 64, so a group of 64 or more tokens holds the
  // whole split.
  uint span = min(Gt, KVQ_FLASH_SPLIT), slots = (min(quantized, first + KVQ_FLASH_SPLIT) - first + span - 1u) / span;
  bool mine = visible && t < quantized;
  uint block = mine ? kvq_slot_block(t, kvh) : 0u, tp = t & (P - 1u);
  if (slots * heads * d4 > KVQ_KIVI_FOLDED_QUADS) { // uniform: decode each channel (kivi.glsl)
    if (mine) {
      uvec3 token = kvq_token(block, tp);
      for (uint c = 0u; c < d; c++) {
        float k = kvq_decode_token(token, c);
        for (uint g = 0u; g < heads; g++) logit[g] += uintBitsToFloat(src[(row0 + g) * d + c]) * k;
      }
    }
    return;
  }
  // The folded query: entry i is channels 4j .. 4j + 3 of head g for slot s.
  for (uint i = lane; i < slots * heads * d4; i += KVQ_GPU_GROUP_SIZE) {
    uint s = i / (heads * d4), g = i / d4 % heads, c = (i % d4) * 4u, t0 = first + s * span;
    uint params = kvq_kivi_token_params(kvq_slot_block(t0, kvh), t0 & (P - 1u), P, d, b, Gt) + c;
    vec4 folded;
    for (uint j = 0u; j < 4u; j++) // (scale, minimum) of channel c + j
      folded[j] = kvq_kivi_fold_scale(uintBitsToFloat(src[(row0 + g) * d + c + j]), KVQ_PAGE(params + j));
    kvq_kivi_folded[i] = folded;
  }
  for (uint i = lane; i < slots * heads; i += KVQ_GPU_GROUP_SIZE) { // the biases, channels in order
    uint s = i / heads, g = i % heads, t0 = first + s * span;
    uint params = kvq_kivi_token_params(kvq_slot_block(t0, kvh), t0 & (P - 1u), P, d, b, Gt);
    float bias = 0.0;
    for (uint c = 0u; c < d; c++) bias = kvq_kivi_fold_bias(bias, uintBitsToFloat(src[(row0 + g) * d + c]), KVQ_PAGE(params + c));
    kvq_kivi_bias[i] = bias;
  }
  barrier();
  if (!mine) return;
  uint s = (t - first) >> group_log2, at = s * heads * d4, codes = block >> 2u, i0 = tp * d;
  float sum[KVQ_FLASH_HEADS_PER_PASS];
  for (uint g = 0u; g < KVQ_FLASH_HEADS_PER_PASS; g++) sum[g] = 0.0;
  // 1-, 2- and 4-bit codes: a run of 8 channels starts a whole run into a word (code index
  // tp * d + c0, a multiple of 8) and fills part of it: one load. 3- and 8-bit codes: one per channel.
  if ((b & (b - 1u)) == 0u && b <= 4u) { // uniform; the branch outside the loops, which llvmpipe would run both sides of
    uint per_word_log2 = 5u - kvq_log2_pow2(b);
    for (uint c0 = 0u; c0 < d; c0 += 8u) {
      uint i = i0 + c0, word = KVQ_PAGE(codes + (i >> per_word_log2)) >> ((i & ((1u << per_word_log2) - 1u)) * b);
      float code[8];
      for (uint j = 0u; j < 8u; j++) code[j] = kvq_kivi_code_at(word, j, b); // constant trips: unrolled
      kvq_kivi_add_run(at + c0 / 4u, d4, heads, code, sum);
    }
  } else {
    for (uint c0 = 0u; c0 < d; c0 += 8u) {
      float code[8];
      for (uint j = 0u; j < 8u; j++) code[j] = float(kvq_io_code(codes, i0 + c0 + j, b));
      kvq_kivi_add_run(at + c0 / 4u, d4, heads, code, sum);
    }
  }
  for (uint g = 0u; g < KVQ_FLASH_HEADS_PER_PASS; g++)
    if (g < heads) logit[g] = kvq_kivi_bias[s * heads + g] + sum[g];
}
