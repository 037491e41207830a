/* SPDX-License-Identifier: MIT */
/* hybctl: the operator's tool. One file per subcommand. */
#ifndef HYBCTL_H
#define HYBCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "hyb/app_stats.h"
#include "hyb/pool.h"

struct hyb_gguf_writer;
struct hyb_ctx;
struct hyb_model;

int cmd_synth(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_manifest(int argc, char **argv);
int cmd_pools(int argc, char **argv);
int cmd_stalls(int argc, char **argv);
int cmd_numa(int argc, char **argv);

/*
 * Write a SentencePiece-style vocabulary of n_vocab tokens into w
 * (tokenizer.ggml.*): <unk> <s> </s>, the 256 byte tokens, then word
 * pieces with their prefixes so greedy bigram merging can build them.
 * Returns -1 when n_vocab is too small to hold the fixed tokens.
 */
int synth_vocab(struct hyb_gguf_writer *w, uint32_t n_vocab);
/* Copy every tokenizer.ggml.* key of another GGUF file into w; -1 with a message. */
int synth_vocab_from(struct hyb_gguf_writer *w, const char *path, uint32_t *n_vocab);

/*
 * profile_teal_stats.c: the profile's statistics (hyb/profile.h) of each
 * projection group's inputs above thr, the n_seq sequences run through c
 * with the thresholds in force; printed. 0, or -1 with a message.
 */
int profile_teal_stats(struct hyb_ctx *c, const struct hyb_model *m, const float *thr,
		       int32_t *const *seqs, const uint32_t *lens, uint32_t n_seq,
		       uint32_t samples);

/* args.c: a decimal option value in [lo, hi], or exit 2 naming cmd and opt. */
uint32_t ctl_u32(const char *cmd, const char *opt, const char *s, uint32_t lo, uint32_t hi);

/* poolctl.c: shared by pools, stalls and numa. */
int ctl_parse_backend(const char *cmd, const char *s, enum hyb_backend_kind *kind);
/* AUTO means the module; NULL after printing one line (unless quiet). */
struct hyb_backend *ctl_backend(const char *cmd, enum hyb_backend_kind kind, bool quiet);
void ctl_json_str(FILE *f, const char *s);
void ctl_json_flags(FILE *f, uint32_t flags);
void ctl_bytes(char *buf, size_t len, uint64_t b);
void ctl_ns(char *buf, size_t len, uint64_t ns);

/* hybctl stalls: the box-mode hybrid apps of an instance (stalls_apps.c) */
#define CTL_MAX_APPS 16
struct ctl_apps {
	int n;
	struct hyb_app_stats a[CTL_MAX_APPS];
};
void ctl_apps_read(const char *name, struct ctl_apps *out);
void ctl_apps_print_text(const char *name, const struct ctl_apps *cur,
			 const struct ctl_apps *prev);
void ctl_apps_print_json(const struct ctl_apps *cur);
void ctl_pool_flags(char *buf, size_t len, uint32_t flags);

#endif
