// UNIFORM (backends/cpu/cpu_uniform.c): token-wise asymmetric b-bit codes in groups of G channels,
// decided by core/quantize_math.h exactly as the CPU reference decides them. Work unit: one token.


void kvq_encode_unit(uint block, uint t, uint n, uint x) {
  uint d = pc.head_dim, b = pc.bits, G = pc.group;
  uint stride = pc.kv_heads * d;
  uint params = (block + kvq_uniform_params_offset(pc.page_size, d, b)) >> 2;
  for (uint g = 0u; g < d / G; g++) {
    float mn = KVQ_READ_ELEMENT(src, pc.input_dtype, x + t * stride + g * G), mx = mn;
    for (uint c = g * G + 1u; c < (g + 1u) * G; c++) {
      float v = KVQ_READ_ELEMENT(src, pc.input_dtype, x + t * stride + c);
      if (v < mn) mn = v;
      if (v > mx) mx = v;
    }
    uint word = kvq_uniform_params(mn, mx, b);
    pages[params + t * (d / G) + g] = word;
    float scale = kvq_uniform_param_scale(word), minimum = kvq_uniform_param_min(word);
    for (uint c = g * G; c < (g + 1u) * G; c++) {
      float v = KVQ_READ_ELEMENT(src, pc.input_dtype, x + t * stride + c);
      kvq_page_put_code(block >> 2, t * d + c, b, kvq_uniform_code(v, minimum, scale, b));
    }
  }
}

float kvq_decode(uint block, uint t, uint c) {
  uint d = pc.head_dim, b = pc.bits;
  uint word = pages[((block + kvq_uniform_params_offset(pc.page_size, d, b)) >> 2) + t * (d / pc.group) + c / pc.group];
  return kvq_uniform_value(kvq_uniform_param_min(word), kvq_uniform_param_scale(word), kvq_page_code(block >> 2, t * d + c, b));
}
