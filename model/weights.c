/* The weights manifest and its shards: every tensor's place in the concatenated shards, sizes
 * checked against shapes, so that a missing, short or long shard is an error and never a read
 * past the end. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"

static const cJSON *get_array(const cJSON *object, const char *key) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  return cJSON_IsArray(item) ? item : NULL;
}

/* Reads one tensor's entry; 0, or -1 with the message. */
static int read_entry(const cJSON *entry, use_tensor *t, char *message, size_t size) {
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(entry, "name");
  const cJSON *shape = get_array(entry, "shape");
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
  if (!cJSON_IsString(name) || !shape || !cJSON_IsString(dtype)) {
    use_message(message, size, "model.json: a weight entry lacks its name, shape or dtype");
    return -1;
  }
  if (!strcmp(dtype->valuestring, "float32")) t->is_int = 0;
  else if (!strcmp(dtype->valuestring, "int32")) t->is_int = 1;
  else {
    use_message(message, size, "model.json: weight %s has dtype %s (only float32 and int32 are read)",
                name->valuestring, dtype->valuestring);
    return -1;
  }
  int rank = cJSON_GetArraySize(shape);
  if (rank > 4) {
    use_message(message, size, "model.json: weight %s has rank %d (at most 4)", name->valuestring, rank);
    return -1;
  }
  t->rank = (uint32_t)rank;
  size_t count = 1;
  for (int i = 0; i < rank; i++) {
    const cJSON *dim = cJSON_GetArrayItem(shape, i);
    /* a dimension above 2^28 cannot be this model's and keeps count's product far from overflow */
    if (!cJSON_IsNumber(dim) || dim->valuedouble < 0 || dim->valuedouble > (double)(1u << 28) ||
        dim->valuedouble != (double)(int64_t)dim->valuedouble) {
      use_message(message, size, "model.json: weight %s has a bad dimension", name->valuestring);
      return -1;
    }
    t->shape[i] = (int64_t)dim->valuedouble;
    count *= (size_t)t->shape[i];
    if (count > ((size_t)1 << 30)) {
      use_message(message, size, "model.json: weight %s is too large", name->valuestring);
      return -1;
    }
  }
  t->count = count;
  t->name = strdup(name->valuestring);
  if (!t->name) {
    use_message(message, size, "out of memory");
    return -1;
  }
  return 0;
}

/* A shard's path in dir; KVQ_ERROR_IO when it does not fit. */
static kvq_status shard_path(const char *dir, const char *file, char *path, size_t path_size, char *message,
                             size_t size) {
  if ((size_t)snprintf(path, path_size, "%s/%s", dir, file) >= path_size) {
    use_message(message, size, "%s/%s: path too long", dir, file);
    return KVQ_ERROR_IO;
  }
  return KVQ_OK;
}

/* A shard of `got` bytes where the manifest says `bytes`: KVQ_OK when equal, else why not. */
static kvq_status shard_length(const char *path, size_t got, size_t bytes, char *message, size_t size) {
  if (got < bytes) {
    use_message(message, size, "%s: %zu bytes, the manifest says %zu (truncated)", path, got, bytes);
    return KVQ_ERROR_TRUNCATED;
  }
  if (got > bytes) {
    use_message(message, size, "%s: longer than the %zu bytes the manifest says", path, bytes);
    return KVQ_ERROR_BAD_FORMAT;
  }
  return KVQ_OK;
}

static kvq_status shard_missing(const char *path, char *message, size_t size) {
  use_message(message, size, "%s: %s (scripts/fetch-model.sh fetches the model)", path, strerror(errno));
  return KVQ_ERROR_IO;
}

/* Reads a shard of exactly `bytes` bytes into dest. */
static kvq_status read_shard(const char *dir, const char *file, void *dest, size_t bytes, char *message, size_t size) {
  char path[4096];
  kvq_status status = shard_path(dir, file, path, sizeof path, message, size);
  if (status != KVQ_OK) return status;
  FILE *f = fopen(path, "rb");
  if (!f) return shard_missing(path, message, size);
  size_t got = fread(dest, 1, bytes, f);
  int extra = got == bytes ? fgetc(f) : EOF;
  fclose(f);
  return shard_length(path, extra != EOF ? bytes + 1 : got, bytes, message, size);
}

/* Checks that a shard exists with exactly `bytes` bytes, before any buffer is allocated for it: a
 * small manifest listing shards that are not there cannot make the loader reserve their bytes. */
static kvq_status stat_shard(const char *dir, const char *file, size_t bytes, char *message, size_t size) {
  char path[4096];
  kvq_status status = shard_path(dir, file, path, sizeof path, message, size);
  if (status != KVQ_OK) return status;
  struct stat st;
  if (stat(path, &st) != 0) return shard_missing(path, message, size);
  return shard_length(path, st.st_size < 0 ? 0 : (size_t)st.st_size, bytes, message, size);
}

/* Shards split a group's bytes at 4 MiB boundaries (tfjs's weight groups): every shard but the
 * last is full, so each shard's size follows from the group's total. */
#define USE_SHARD_BYTES ((size_t)4 << 20)

/* The bytes of each group, from its tensors' counts (the layout's tensors in manifest order). */
static size_t group_bytes_at(const cJSON *group, const use_weights *w, size_t *tensor) {
  size_t bytes = 0;
  for (int i = 0; i < cJSON_GetArraySize(get_array(group, "weights")); i++) bytes += w->tensors[(*tensor)++].count * 4;
  return bytes;
}

kvq_status use_weights_layout(const cJSON *manifest, use_weights *w, char *message, size_t size) {
  memset(w, 0, sizeof *w);
  const cJSON *groups = get_array(manifest, "weightsManifest");
  if (!groups) {
    use_message(message, size, "model.json: no weightsManifest array");
    return KVQ_ERROR_BAD_FORMAT;
  }
  size_t total = 0;
  const cJSON *group;
  cJSON_ArrayForEach(group, groups) total += (size_t)cJSON_GetArraySize(get_array(group, "weights"));
  w->tensors = calloc(total ? total : 1, sizeof *w->tensors);
  if (!w->tensors) {
    use_message(message, size, "out of memory");
    return KVQ_ERROR_OUT_OF_MEMORY;
  }
  kvq_status status = KVQ_OK;
  size_t words = 0;
  cJSON_ArrayForEach(group, groups) {
    const cJSON *entries = get_array(group, "weights");
    const cJSON *paths = get_array(group, "paths");
    if (!entries || !paths) {
      use_message(message, size, "model.json: a weight group lacks its paths or weights");
      status = KVQ_ERROR_BAD_FORMAT;
      goto fail;
    }
    const cJSON *entry;
    cJSON_ArrayForEach(entry, entries) {
      use_tensor *t = &w->tensors[w->count];
      if (read_entry(entry, t, message, size) != 0) {
        status = KVQ_ERROR_BAD_FORMAT;
        goto fail;
      }
      w->count++;
      t->offset = words;
      words += t->count;
    }
  }
  w->words = words;
  /* every group lists as many shards as its bytes fill, each a plain file name */
  size_t tensor = 0;
  cJSON_ArrayForEach(group, groups) {
    size_t group_bytes = group_bytes_at(group, w, &tensor);
    const cJSON *paths = get_array(group, "paths");
    size_t shards = (size_t)cJSON_GetArraySize(paths);
    size_t needed = (group_bytes + USE_SHARD_BYTES - 1) / USE_SHARD_BYTES;
    if (shards != needed && !(shards == 1 && group_bytes == 0)) {
      use_message(message, size, "model.json: a group of %zu bytes lists %zu shards (%zu expected)", group_bytes, shards,
                  needed);
      status = KVQ_ERROR_BAD_FORMAT;
      goto fail;
    }
    const cJSON *path;
    cJSON_ArrayForEach(path, paths) {
      if (!cJSON_IsString(path) || strchr(path->valuestring, '/')) {
        use_message(message, size, "model.json: a shard path is not a plain file name");
        status = KVQ_ERROR_BAD_FORMAT;
        goto fail;
      }
    }
  }
  return KVQ_OK;
fail:
  use_weights_free(w);
  return status;
}

kvq_status use_weights_load(const char *dir, const cJSON *manifest, use_weights *w, char *message, size_t size) {
  const cJSON *groups = get_array(manifest, "weightsManifest");
  kvq_status status = KVQ_OK;
  /* every shard's size first (the layout says how many bytes each must hold), then the buffer */
  size_t tensor = 0;
  const cJSON *group;
  cJSON_ArrayForEach(group, groups) {
    size_t group_bytes = group_bytes_at(group, w, &tensor), done = 0;
    const cJSON *path;
    cJSON_ArrayForEach(path, get_array(group, "paths")) {
      size_t bytes = group_bytes - done < USE_SHARD_BYTES ? group_bytes - done : USE_SHARD_BYTES;
      status = stat_shard(dir, path->valuestring, bytes, message, size);
      if (status != KVQ_OK) goto fail;
      done += bytes;
    }
  }
  w->data = malloc(w->words ? w->words * 4 : 1);
  if (!w->data) {
    use_message(message, size, "out of memory for %zu weight bytes", w->words * 4);
    status = KVQ_ERROR_OUT_OF_MEMORY;
    goto fail;
  }
  /* the groups' bytes follow each other in the manifest's order */
  size_t group_start = 0;
  tensor = 0;
  cJSON_ArrayForEach(group, groups) {
    size_t group_bytes = group_bytes_at(group, w, &tensor);
    size_t done = 0;
    const cJSON *path;
    cJSON_ArrayForEach(path, get_array(group, "paths")) {
      size_t bytes = group_bytes - done < USE_SHARD_BYTES ? group_bytes - done : USE_SHARD_BYTES;
      status = read_shard(dir, path->valuestring, (unsigned char *)w->data + group_start + done, bytes, message, size);
      if (status != KVQ_OK) goto fail;
      done += bytes;
    }
    group_start += group_bytes;
  }
  return KVQ_OK;
fail:
  use_weights_free(w);
  return status;
}

void use_weights_free(use_weights *w) {
  for (size_t i = 0; i < w->count; i++) free(w->tensors[i].name);
  free(w->tensors);
  free(w->data);
  memset(w, 0, sizeof *w);
}

const void *use_weights_get(const use_weights *w, const char *name, int is_int, uint32_t rank, const int64_t *shape,
                            char *message, size_t size) {
  for (size_t i = 0; i < w->count; i++) {
    const use_tensor *t = &w->tensors[i];
    if (strcmp(t->name, name)) continue;
    int same = t->is_int == is_int && t->rank == rank;
    for (uint32_t d = 0; same && d < rank; d++) same = t->shape[d] == shape[d];
    if (!same) {
      char want[64] = "", got[64] = "";
      for (uint32_t d = 0; d < rank; d++) snprintf(want + strlen(want), sizeof want - strlen(want), " %lld", (long long)shape[d]);
      for (uint32_t d = 0; d < t->rank; d++) snprintf(got + strlen(got), sizeof got - strlen(got), " %lld", (long long)t->shape[d]);
      use_message(message, size, "model.json: weight %s has shape [%s ] %s, expected [%s ] %s", name, got,
                  t->is_int ? "int32" : "float32", want, is_int ? "int32" : "float32");
      return NULL;
    }
    const uint32_t *data = w->data + t->offset;
    if (!is_int) {
      /* a corrupt shard shows as NaN or infinity far more often than not */
      const float *f = (const float *)data;
      for (size_t j = 0; j < t->count; j++) {
        if (!isfinite(f[j])) {
          use_message(message, size, "weight %s holds a non-finite number at element %zu (corrupt shard?)", name, j);
          return NULL;
        }
      }
    }
    return data;
  }
  use_message(message, size, "model.json: no weight named %s", name);
  return NULL;
}
