/* SPDX-License-Identifier: MIT */
/* hybctl: the operator's tool. One file per subcommand. */
#ifndef HYBCTL_H
#define HYBCTL_H

#include <stdint.h>

struct gguf_writer;

int cmd_synth(int argc, char **argv);

/*
 * Write a SentencePiece-style vocabulary of n_vocab tokens into w
 * (tokenizer.ggml.*): <unk> <s> </s>, the 256 byte tokens, then word
 * pieces with their prefixes so greedy bigram merging can build them.
 * Returns -1 when n_vocab is too small to hold the fixed tokens.
 */
int synth_vocab(struct gguf_writer *w, uint32_t n_vocab);
/* Copy every tokenizer.ggml.* key of another GGUF file into w; -1 with a message. */
int synth_vocab_from(struct gguf_writer *w, const char *path, uint32_t *n_vocab);

#endif
