// KIVI (backends/cpu/cpu_kivi.c): channel-wise asymmetric b-bit codes over groups of Gt tokens,
// with UNIFORM's quantizer. Work unit: one channel of one token group.


void kvq_encode_unit(uint block, uint unit, uint n, uint x) {
  uint d = pc.head_dim, b = pc.bits, Gt = pc.group;
  uint stride = pc.kv_heads * d;
  uint c = unit % d, t0 = unit / d * Gt;
  uint t1 = n - t0 < Gt ? n : t0 + Gt; // the group's valid tokens
  float mn = KVQ_READ_ELEMENT(src, pc.input_dtype, x + t0 * stride + c), mx = mn;
  for (uint t = t0 + 1u; t < t1; t++) {
    float v = KVQ_READ_ELEMENT(src, pc.input_dtype, x + t * stride + c);
    if (v < mn) mn = v;
    if (v > mx) mx = v;
  }
  uint word = kvq_uniform_params(mn, mx, b);
  pages[((block + kvq_kivi_params_offset(pc.page_size, d, b)) >> 2) + (t0 / Gt) * d + c] = word;
  float scale = kvq_uniform_param_scale(word), minimum = kvq_uniform_param_min(word);
  for (uint t = t0; t < t1; t++) {
    float v = KVQ_READ_ELEMENT(src, pc.input_dtype, x + t * stride + c);
    kvq_page_put_code(block >> 2, t * d + c, b, kvq_uniform_code(v, minimum, scale, b));
  }
}

float kvq_decode(uint block, uint t, uint c) {
  uint d = pc.head_dim, b = pc.bits;
  uint word = pages[((block + kvq_kivi_params_offset(pc.page_size, d, b)) >> 2) + (t / pc.group) * d + c];
  return kvq_uniform_value(kvq_uniform_param_min(word), kvq_uniform_param_scale(word), kvq_page_code(block >> 2, t * d + c, b));
}
