// What SCORE, SOFTMAX and WEIGHTED_SUM share: the job's sequence views in `meta` and the masking
// rule of backends/backend.h (kvq_attention_seq). Metadata: word 0, 1, 2 = word offsets (from meta)
// of page_slots, page_index, page_alive; then one record of KVQ_SEQ_WORDS words per sequence.
// pc.first is the sequence a dispatch works on.

#define KVQ_SEQ_WORDS 12u
#define SEQ_PAGE_FIRST 0u
#define SEQ_QUANTIZED 1u
#define SEQ_WINDOW 2u
#define SEQ_WINDOW_FIRST 3u
#define SEQ_RING_CAPACITY 4u
#define SEQ_RING_ELEMENT 5u
#define SEQ_QUERY_FIRST 6u
#define SEQ_QUERY_COUNT 7u
#define SEQ_QUERY_POSITION 8u
#define SEQ_MASK 9u
#define SEQ_SCORE_OFFSET 10u
#define SEQ_ACCUMULATE_OFFSET 11u

uint kvq_seq(uint field) { return meta[pc.meta + 3u + pc.first * KVQ_SEQ_WORDS + field]; }
uint kvq_seq_tokens() { return kvq_seq(SEQ_QUANTIZED) + kvq_seq(SEQ_WINDOW); }

// Whether query row r may attend to slot t: a kept token, not in its future (mask 0 = causal).
bool kvq_visible(uint r, uint t) {
  uint quantized = kvq_seq(SEQ_QUANTIZED), P = pc.page_size;
  uint position;
  if (t >= quantized) {
    position = kvq_seq(SEQ_WINDOW_FIRST) + (t - quantized);
  } else {
    uint page = kvq_seq(SEQ_PAGE_FIRST) + t / P, i = t % P;
    if (((meta[pc.meta + meta[pc.meta + 2u] + page * pc.alive_words + i / 32u] >> (i % 32u)) & 1u) == 0u) return false;
    position = meta[pc.meta + meta[pc.meta + 1u] + page] * P + i;
  }
  return kvq_seq(SEQ_MASK) != 0u || position <= kvq_seq(SEQ_QUERY_POSITION) + r;
}

// Byte offset in the page pool of kv head h's block of the page holding quantized slot t.
uint kvq_slot_block(uint t, uint h) {
  uint slot = meta[pc.meta + meta[pc.meta] + kvq_seq(SEQ_PAGE_FIRST) + t / pc.page_size];
  return (slot * pc.kv_heads + h) * pc.head_words * 4u;
}

// Channel c of kv head h of window slot t (t >= quantized), from the ring in the window dtype.
float kvq_window_value(uint t, uint h, uint c) {
  uint w = kvq_seq(SEQ_WINDOW_FIRST) + (t - kvq_seq(SEQ_QUANTIZED));
  uint slot = w % kvq_seq(SEQ_RING_CAPACITY);
  uint index = kvq_seq(SEQ_RING_ELEMENT) + (slot * pc.kv_heads + h) * pc.head_dim + c;
  return KVQ_READ_ELEMENT(ring, pc.window_dtype, index);
}
