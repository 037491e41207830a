/* SPDX-License-Identifier: MIT */
/* A model's weights streaming in behind its first prompt (model_stream.c). */
#ifndef HYB_MODEL_STREAM_H
#define HYB_MODEL_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct hyb_model;
struct hyb_stream_stats;

/*
 * Start reading the file's [0, size) into image on a thread, quietly;
 * m->stream is set. These return 0 or a negative errno with the reason in err.
 */
int hyb_model_stream_start(struct hyb_model *m, const char *path, void *image, uint64_t size,
			   char *err, size_t errlen);
/* After binding: where the embeddings, each layer and the head end in the file. */
int hyb_model_stream_index(struct hyb_model *m, char *err, size_t errlen);
/* HYB_LOAD=pread: the weights are read by pread threads, not io_uring (model_load.c). */
bool hyb_model_load_pread(void);
/* Cancel a load still running, join its thread, free; m->stream is NULL after. */
void hyb_model_stream_stop(struct hyb_model *m);

/* 0 once file bytes [0, end) are in memory; the failed load's errno and message. */
int hyb_model_wait_bytes(const struct hyb_model *m, uint64_t end, char *err, size_t errlen);
/* The same for the bytes of the token embeddings, layer l, the head (norm and output). */
int hyb_model_wait_embd(const struct hyb_model *m, char *err, size_t errlen);
int hyb_model_wait_layer(const struct hyb_model *m, uint32_t l, char *err, size_t errlen);
int hyb_model_wait_head(const struct hyb_model *m, char *err, size_t errlen);

#endif
