/* The model's insides, shared by model/'s files only (use.h is the interface). */
#ifndef KVQ_MODEL_INTERNAL_H
#define KVQ_MODEL_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "use.h"

/* The graph's name prefixes (docs/MODEL.md quotes every full name). */
#define USE_STACK "module_apply_default/Encoder_en/KonaTransformer/Encode/TransformerStack/"
#define USE_ENCODE "module_apply_default/Encoder_en/KonaTransformer/Encode/"
#define USE_KONA "module_apply_default/Encoder_en/KonaTransformer/"
#define USE_VARS "module/Encoder_en/KonaTransformer/Encode/"

/* The architecture this code implements; the loader checks the weights' shapes against it. */
enum {
  USE_VOCAB_ROWS = 8002, /* rows of the embedding table (the vocabulary has 8000 pieces) */
  USE_INPUT_DIM = 256,   /* embedding width, layer 0's input */
  USE_HIDDEN = 512,      /* every layer's output */
  USE_FFN = 1536,
  USE_TIMESCALES = 128   /* sin and cos halves of the 256-wide position signal */
};

/* One tensor of the manifest: where it lies in the concatenated shards. */
typedef struct use_tensor {
  char *name;
  uint32_t rank;
  int64_t shape[4];
  int is_int;            /* int32, else float32 */
  size_t offset, count;  /* in elements of 4 bytes */
} use_tensor;

typedef struct use_weights {
  use_tensor *tensors;
  size_t count;
  uint32_t *data;        /* every shard's bytes, concatenated: 4-byte words (fp32 or int32) */
  size_t words;
} use_weights;

typedef struct use_layer {
  uint32_t in, heads, head_dim;
  float q_ratio;         /* the graph's query scale times sqrt(head_dim): 1 when it is 1/sqrt(head_dim) */
  const float *ln1_scale, *ln1_bias, *qkv_w, *qkv_b, *out_w, *out_b;
  const float *res_w, *res_b; /* the residual's projection (in != USE_HIDDEN), else NULL */
  const float *ln2_scale, *ln2_bias, *ffn1_w, *ffn1_b, *ffn2_w, *ffn2_b;
} use_layer;

typedef struct use_piece_slot {
  uint32_t hash;
  int32_t id;            /* -1: empty */
} use_piece_slot;

typedef struct use_vocab {
  char **pieces;         /* UTF-8, U+2581 marking a word's start */
  float *scores;
  size_t count;
  size_t max_bytes;      /* the longest piece */
  use_piece_slot *slots; /* open addressing over the matchable pieces */
  size_t slot_count;     /* a power of two */
  float unknown_score;   /* an unknown character's score: the lowest score minus 10 (SentencePiece's) */
} use_vocab;

struct kvq_use_model {
  use_weights weights;
  use_vocab vocab;
  use_layer layers[KVQ_USE_LAYERS];
  const float *embeddings;     /* [USE_VOCAB_ROWS][USE_INPUT_DIM] */
  const float *timescales;     /* [USE_TIMESCALES] */
  float ln_epsilon, l2_epsilon;
  uint32_t max_tokens;
  const float *tanh_w, *tanh_b;
};

/* printf into a caller's message buffer (NULL or size 0: nothing). */
void use_message(char *message, size_t size, const char *format, ...);

/* weights.c. use_weights_layout reads the manifest's weightsManifest: every tensor's name, shape,
 * type and place, each group's shard count and names checked; w->data stays NULL (w is zeroed on
 * failure). use_weights_load then reads the shards of dir into w->data; on failure it frees w. */
kvq_status use_weights_layout(const cJSON *manifest, use_weights *w, char *message, size_t size);
kvq_status use_weights_load(const char *dir, const cJSON *manifest, use_weights *w, char *message, size_t size);
void use_weights_free(use_weights *w);
/* The data of a tensor of exactly this shape and type, or NULL with the message saying why. */
const void *use_weights_get(const use_weights *w, const char *name, int is_int, uint32_t rank, const int64_t *shape,
                            char *message, size_t size);

/* wiring.c: checks the graph's nodes the forward pass depends on (KVQ_ERROR_BAD_FORMAT). */
kvq_status use_wiring_check(const cJSON *manifest, char *message, size_t size);

/* load.c: model.json's text (`bytes` long, no NUL needed) parsed, its wiring checked
 * (use_wiring_check) and its weights laid out (use_weights_layout). On KVQ_OK the caller owns
 * *manifest (cJSON_Delete) and w (use_weights_free); on failure *manifest is NULL, w zeroed, and
 * the message says why. The loader's first step, and the manifest fuzz target's entry point
 * (tests/fuzz/fuzz_model_manifest.c): bytes in, no file read. */
kvq_status use_manifest_read(const char *text, size_t bytes, cJSON **manifest, use_weights *w, char *message,
                             size_t size);

/* vocab.c / tokenizer.c. use_vocab_parse reads vocab.json's text (`bytes` long; `path` prefixes
 * its messages); vocab is zeroed on failure, else the caller frees it (use_vocab_free).
 * use_vocab_read reads the file, then parses it. */
kvq_status use_vocab_parse(const char *text, size_t bytes, const char *path, use_vocab *vocab, char *message,
                           size_t size);
kvq_status use_vocab_read(const char *path, use_vocab *vocab, char *message, size_t size);
void use_vocab_free(use_vocab *vocab);
int32_t use_vocab_find(const use_vocab *vocab, const char *bytes, size_t len);

/* file.c: a whole file into memory (KVQ_ERROR_IO with the message when it cannot). */
kvq_status use_read_file(const char *path, char **data, size_t *size, char *message, size_t message_size);

#endif
