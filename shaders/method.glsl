// The method a shader variant is built for (KVQ_METHOD, a KVQ_LAYOUT_* value, set by
// shaders/meson.build). Each methods/*.glsl provides:
//   uint  kvq_encode_units(uint n)                      work units to encode n tokens of a head block
//   void  kvq_encode_unit(uint block, uint unit, uint n, uint x)
//                                                       encode one unit into the zeroed head block at
//                                                       byte `block` of `pages`; token t, channel c
//                                                       of the input is element x + t*kv_heads*d + c of src
//   float kvq_decode(uint block, uint t, uint c)        channel c of token t as DEQUANTIZE returns it
// and, where a method scores page tokens from their codes rather than by decoding (QJL), defines
// KVQ_METHOD_DOT and provides
//   float kvq_method_dot(uint block, uint t, uint q, uint row)
//                                                       the unscaled logit of token t for the query at
//                                                       element q of src, whose prepared floats
//                                                       (PREPARE_QUERY) are row `row` of aux
#if KVQ_METHOD == 0
#include "methods/exact.glsl"
#elif KVQ_METHOD == 1
#include "methods/qjl.glsl"
#elif KVQ_METHOD == 2
#include "methods/uniform.glsl"
#elif KVQ_METHOD == 3
#include "methods/kivi.glsl"
#else
#error "shaders/method.glsl: no shader code for this method yet"
#endif
