/*
 * What `kvq dump` and `kvq demo` both need before they run the model (model/use.h): the model, loaded
 * from where scripts/fetch-model.sh leaves it, with a message that says how to fetch it when it is
 * not there; and the sentences, the first N of the King James Bible (corpus.h) or the lines of a
 * text file.
 */
#ifndef KVQ_TOOLS_MODEL_INPUT_H
#define KVQ_TOOLS_MODEL_INPUT_H

#include <stddef.h>
#include <stdint.h>

#include "corpus.h"
#include "use.h"

/* Loads the model from kvq_use_default_dir(). Returns 0, or -1 with a message in `error` (the folder,
 * kvq_use_load's reason, which names scripts/fetch-model.sh); *out is NULL then. */
int model_input_load(kvq_use_model **out, char *error, size_t error_size);

/*
 * Up to `count` sentences: from `text_file` (one sentence a line; empty lines skipped; lines longer
 * than 64 KiB are refused) when it is not NULL, else the Bible's first `count` (corpus_bible). Returns
 * 0 (out->count may be below count when the source has fewer), or -1 with a message and *out empty.
 */
int model_input_sentences(const char *text_file, uint32_t count, corpus *out, char *error, size_t error_size);

#endif
