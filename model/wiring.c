/* The graph's wiring at the nodes where this forward pass could plausibly be wrong: the loader
 * refuses a model.json whose nodes are connected otherwise, instead of computing something else.
 * docs/MODEL.md explains each line. */
#include <string.h>

#include "internal.h"

typedef struct use_wire {
  const char *node, *op;
  const char *inputs[3]; /* in order; NULL ends the list */
} use_wire;

#define L0 USE_STACK "Layer_0/"
#define L1 USE_STACK "Layer_1/"
#define TL "TransformerLayer/"
#define MHA "TransformerLayer/MultiheadAttention/"

static const use_wire wires[] = {
  /* the input embedding counts twice: once through the timing signal's add, once directly */
  {L0 "add", "Add", {USE_ENCODE "Scatter/ScatterNd", L0 "AddTimingSignal/Scatter/ScatterNd"}},
  {L0 "AddTimingSignal/add", "Add", {L0 "AddTimingSignal/Gather/GatherNd", L0 "AddTimingSignal/TimingSignal/concat"}},
  {L0 "AddTimingSignal/Gather/GatherNd", "GatherNd", {USE_ENCODE "Scatter/ScatterNd", L1 TL "FFN/StoreMask/ToInt32"}},
  {USE_ENCODE "Scatter/ScatterNd", "ScatterNd",
   {L1 TL "FFN/StoreMask/ToInt32", USE_ENCODE "embedding_lookup", USE_ENCODE "Scatter/concat"}},
  /* positions: sin then cos of position times the stored timescales */
  {L0 "AddTimingSignal/TimingSignal/concat", "ConcatV2",
   {L0 "AddTimingSignal/TimingSignal/Sin", L0 "AddTimingSignal/TimingSignal/Cos",
    L1 MHA "DotProductAttention/attention_bias_ignore_padding/ExpandDims/dim"}},
  /* pre-LayerNorm: the first layer norm reads the layer's input */
  {L0 TL "layer_prepostprocess/layer_norm/Mean", "Mean",
   {L0 "add", L1 TL "FFN/layer_prepostprocess/layer_norm/Mean/reduction_indices"}},
  /* layer 0's residual goes through a dense projection, 256 to 512 */
  {L0 TL "layer_postprocess/add", "Add", {L0 MHA "Squeeze_1", L0 TL "AdjustResidualInput/Scatter/ScatterNd"}},
  {L0 TL "AdjustResidualInput/Gather/GatherNd", "GatherNd", {L0 "add", L1 TL "FFN/StoreMask/ToInt32"}},
  {L0 TL "FFN/layer_postprocess/add", "Add", {L0 TL "FFN/Scatter/ScatterNd", L0 TL "layer_postprocess/add"}},
  {L1 TL "layer_prepostprocess/layer_norm/Mean", "Mean",
   {L0 TL "FFN/layer_postprocess/add", L1 TL "FFN/layer_prepostprocess/layer_norm/Mean/reduction_indices"}},
  {L1 TL "layer_postprocess/add", "Add", {L1 MHA "Squeeze_1", L0 TL "FFN/layer_postprocess/add"}},
  {L1 TL "FFN/layer_postprocess/add", "Add", {L1 TL "FFN/Scatter/ScatterNd", L1 TL "layer_postprocess/add"}},
  /* the queries carry the scale mul/y; q is split:0, k split:1, v split:2 */
  {L0 MHA "mul", "Mul", {L0 MHA "split_heads/transpose", L0 MHA "mul/y"}},
  {L1 MHA "mul", "Mul", {L1 MHA "split_heads/transpose", L1 MHA "mul/y"}},
  {L0 MHA "split_heads/split_last_dimension/Reshape", "Reshape",
   {L0 MHA "split", L0 MHA "split_heads/split_last_dimension/Reshape/shape"}},
  {L0 MHA "split_heads_1/split_last_dimension/Reshape", "Reshape",
   {L0 MHA "split:1", L0 MHA "split_heads_1/split_last_dimension/Reshape/shape"}},
  {L0 MHA "split_heads_2/split_last_dimension/Reshape", "Reshape",
   {L0 MHA "split:2", L0 MHA "split_heads_2/split_last_dimension/Reshape/shape"}},
  {L1 MHA "split_heads_1/split_last_dimension/Reshape", "Reshape",
   {L1 MHA "split:1", L1 MHA "split_heads_1/split_last_dimension/Reshape/shape"}},
  {L1 MHA "split_heads_2/split_last_dimension/Reshape", "Reshape",
   {L1 MHA "split:2", L1 MHA "split_heads_2/split_last_dimension/Reshape/shape"}},
  /* no final layer norm: the mean over tokens reads the last residual sum, then tanh, then L2 */
  {USE_KONA "mul", "Mul", {L1 TL "FFN/layer_postprocess/add", USE_KONA "ExpandDims"}},
  {"module_apply_default/Encoder_en/hidden_layers/tanh_layer_0/MatMul", "MatMul",
   {USE_KONA "div", "module/Encoder_en/hidden_layers/tanh_layer_0/weights"}},
  {"module_apply_default/Encoder_en/hidden_layers/l2_normalize", "Mul",
   {"module_apply_default/Encoder_en/hidden_layers/tanh_layer_0/Tanh",
    "module_apply_default/Encoder_en/hidden_layers/l2_normalize/Rsqrt"}},
};

static const cJSON *find_node(const cJSON *nodes, const char *name) {
  const cJSON *node;
  cJSON_ArrayForEach(node, nodes) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(node, "name");
    if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return node;
  }
  return NULL;
}

kvq_status use_wiring_check(const cJSON *manifest, char *message, size_t size) {
  const cJSON *topology = cJSON_GetObjectItemCaseSensitive(manifest, "modelTopology");
  const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(topology, "node");
  if (!cJSON_IsArray(nodes)) {
    use_message(message, size, "model.json: no modelTopology.node array");
    return KVQ_ERROR_BAD_FORMAT;
  }
  for (size_t i = 0; i < sizeof wires / sizeof wires[0]; i++) {
    const use_wire *w = &wires[i];
    const cJSON *node = find_node(nodes, w->node);
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(node, "op");
    const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(node, "input");
    if (!node || !cJSON_IsString(op) || strcmp(op->valuestring, w->op)) {
      use_message(message, size, "model.json: node %s is missing or not a %s: not the graph this code implements",
                  w->node, w->op);
      return KVQ_ERROR_BAD_FORMAT;
    }
    int n = 0;
    while (n < 3 && w->inputs[n]) n++;
    int ok = cJSON_IsArray(inputs) && cJSON_GetArraySize(inputs) == n;
    for (int j = 0; ok && j < n; j++) {
      const cJSON *in = cJSON_GetArrayItem(inputs, j);
      ok = cJSON_IsString(in) && !strcmp(in->valuestring, w->inputs[j]);
    }
    if (!ok) {
      use_message(message, size, "model.json: node %s has other inputs than this code implements", w->node);
      return KVQ_ERROR_BAD_FORMAT;
    }
  }
  return KVQ_OK;
}
