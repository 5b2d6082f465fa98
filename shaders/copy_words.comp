#version 450
#extension GL_GOOGLE_include_directive : require
// COPY_WORDS: a CONVERT that is a plain copy of packed 32-bit words (backends/vulkan/vk_tensor.c):
// pc.count words from word pc.src_word of src to word pc.dst_word of dst, with KVQ_PUSH_IF_CLEAR
// only while the check word results[pc.check_word] is zero (kvq_check_refused): the window writes
// and page clearing of an append of device tokens, recorded after the checks that may refuse it, in
// place of transfers (vkCmdCopyBuffer, vkCmdFillBuffer) that no flag word can stop. Invocation: one
// word.
#include "shaders/common.glsl"

void main() {
  uint i = kvq_invocation();
  if (i >= pc.count || kvq_check_refused()) return;
  dst[pc.dst_word + i] = src[pc.src_word + i];
}
