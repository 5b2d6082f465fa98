// The method a shader variant is built for (KVQ_METHOD, a KVQ_LAYOUT_* value, set by
// shaders/meson.build). Each methods/*.glsl provides:
//   uint  kvq_encode_units(uint n)                      work units to encode n tokens of a head block
//   void  kvq_encode_unit(uint block, uint unit, uint n, uint x)
//                                                       encode one unit into the zeroed head block at
//                                                       byte `block` of `pages`; token t, channel c
//                                                       of the input is element x + t*kv_heads*d + c of src
//   float kvq_decode(uint block, uint t, uint c)        channel c of token t as DEQUANTIZE returns it
#if KVQ_METHOD == 0
#include "methods/exact.glsl"
#elif KVQ_METHOD == 2
#include "methods/uniform.glsl"
#elif KVQ_METHOD == 3
#include "methods/kivi.glsl"
#elif KVQ_METHOD == 5
#include "methods/cq.glsl"
#else
#error "shaders/method.glsl: no shader code for this method yet"
#endif
