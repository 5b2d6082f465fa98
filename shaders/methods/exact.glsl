// EXACT (backends/cpu/cpu_exact.c): tokens stored as they are, in fp32, fp16 or bf16.
// Work unit: one token.


void kvq_encode_unit(uint block, uint t, uint n, uint x) {
  uint stride = pc.kv_heads * pc.head_dim;
  for (uint c = 0u; c < pc.head_dim; c++) {
    float v = KVQ_READ_ELEMENT(src, pc.input_dtype, x + t * stride + c);
    uint at = block + kvq_exact_offset(pc.head_dim, pc.dtype, t, c);
    if (pc.dtype == KVQ_LAYOUT_F32) pages[at >> 2] = floatBitsToUint(v);
    else kvq_page_put_u16(at, pc.dtype == KVQ_LAYOUT_F16 ? kvq_f32_to_f16_bits(v) : kvq_f32_to_bf16_bits(v));
  }
}

float kvq_decode(uint block, uint t, uint c) {
  uint at = block + kvq_exact_offset(pc.head_dim, pc.dtype, t, c);
  if (pc.dtype == KVQ_LAYOUT_F32) return uintBitsToFloat(pages[at >> 2]);
  uint h = kvq_page_u16(at);
  return pc.dtype == KVQ_LAYOUT_F16 ? kvq_f16_bits_to_f32(h) : kvq_bf16_bits_to_f32(h);
}
