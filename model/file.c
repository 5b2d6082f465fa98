/* Reading whole files, and the message helper, for the loader. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void use_message(char *message, size_t size, const char *format, ...) {
  if (!message || !size) return;
  va_list args;
  va_start(args, format);
  vsnprintf(message, size, format, args);
  va_end(args);
}

kvq_status use_read_file(const char *path, char **data, size_t *size, char *message, size_t message_size) {
  *data = NULL;
  *size = 0;
  FILE *f = fopen(path, "rb");
  if (!f) {
    use_message(message, message_size, "%s: %s (scripts/fetch-model.sh fetches the model)", path, strerror(errno));
    return KVQ_ERROR_IO;
  }
  kvq_status status = KVQ_OK;
  long length = -1;
  if (fseek(f, 0, SEEK_END) == 0) length = ftell(f);
  if (length < 0 || fseek(f, 0, SEEK_SET) != 0) {
    use_message(message, message_size, "%s: cannot find its size", path);
    fclose(f);
    return KVQ_ERROR_IO;
  }
  /* one more byte: text files get a terminating NUL */
  char *buffer = malloc((size_t)length + 1);
  if (!buffer) {
    use_message(message, message_size, "%s: out of memory for %ld bytes", path, length);
    status = KVQ_ERROR_OUT_OF_MEMORY;
  } else if (fread(buffer, 1, (size_t)length, f) != (size_t)length) {
    use_message(message, message_size, "%s: read failed", path);
    status = KVQ_ERROR_IO;
  }
  fclose(f);
  if (status != KVQ_OK) {
    free(buffer);
    return status;
  }
  buffer[length] = 0;
  *data = buffer;
  *size = (size_t)length;
  return KVQ_OK;
}
