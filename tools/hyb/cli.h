/* SPDX-License-Identifier: MIT */
/* Shared pieces of the `hyb` command's subcommands. */
#ifndef HYB_CLI_H
#define HYB_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/hybrid.h"
#include "hyb/model.h"
#include "hyb/sampler.h"

struct cli_opts {
	const char *model;
	const char *manifest; /* run --manifest: a box-mode model hybd serves */
	const char *baseline; /* bench --baseline: the dense model a plan was made from */
	const char *prompt;
	const char *tokens;   /* comma-separated ids */
	const char *out;
	int n_predict;
	int n_threads;
	uint32_t n_ctx;
	bool decode;          /* logits: one token at a time */
	bool print_ids;       /* run: also print the generated token ids */
	bool stream_load;     /* run: compute the prompt while the weights stream in */
	int n_prompt_bench;   /* bench: prompt tokens */
	int n_gen_bench;      /* bench: generated tokens */
	int reps;
	enum hyb_ffn_mode ffn; /* --dense / --sparse (plan models) */
	/* hybrid decoding: --gpu-budget BYTES|N% [--policy P] [--device cpu|cuda] */
	const char *gpu_budget;
	const char *policies;  /* bench --policies a,b,... | all */
	const char *routing;   /* --routing P: a MoE routing profile (hybctl profile -o) */
	uint32_t drift;        /* bench --drift N: a forced topic change every N tokens */
	uint32_t parallel;     /* bench --parallel N: N sequences in one hybrid context */
	struct hyb_hybrid_params hy;
	struct hyb_sampler_params sp;
	/* chat: run --chat, and hyb chat */
	bool chat;
	const char *chat_template; /* --chat-template NAME: instead of the model's */
	const char *system;        /* --system TEXT: a system message first */
	/* CATS (hyb/sparsity.h): --cats PROFILE [--sparsity S]; sparsity < 0: not given */
	const char *cats;
	double sparsity;
	const char *teal;          /* TEAL: --teal PROFILE [--sparsity S] */
	const char *text_file;     /* perplexity -f FILE */
	int n_chunks;              /* perplexity --chunks N */
	uint32_t moe_defer;        /* --defer N: expert deferral (hyb_ctx_params.moe_defer) */
	bool numa_no_pin;          /* --no-numa-pin (hyb_ctx_params.numa_no_pin) */
};

/* The median of v[n] (sorted in place: benchmarks take medians of noisy rounds). */
double cli_median(double *v, int n);
/* Index of the largest of v[n], the first on ties: the greedy token. */
int32_t cli_argmax(const float *v, uint32_t n);
/* Parse argv after the subcommand; exits with a message on a bad option. */
void cli_parse(int argc, char **argv, struct cli_opts *o, const char *usage);
/* A number in [lo, hi] or exit naming the option. */
double cli_num(const char *opt, const char *s, double lo, double hi);
_Noreturn void cli_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Load model and context or exit with one clear line. */
struct hyb_model *cli_load_model(const struct cli_opts *o);
/* cli_manifest.c: a model from hybd's manifest (box mode), or exit with one line. */
struct hyb_model *cli_load_manifest(const char *src);
struct hyb_ctx *cli_new_ctx(const struct hyb_model *m, const struct cli_opts *o);
/* --teal / --sparsity onto a new context (hyb/sparsity.h); exits on failure. */
void cli_apply_teal(struct hyb_ctx *c, const struct hyb_model *m, const struct cli_opts *o);
/* One stderr line on sparse decoding (nothing for a dense context). */
void cli_print_sparse(const struct hyb_ctx *c, double t_decode);
/* TEAL's decode steps: the share of inputs skipped, per input kind, and of bytes. */
void cli_print_teal(const struct hyb_ctx *c, const struct hyb_model *m);
/* cli_hybrid.c: --gpu-budget resolved against the model (bytes); stats lines. */
uint64_t cli_gpu_budget(const char *s, const struct hyb_model *m);
/* --prompt-batch N that the context could not give (no room, a MoE model): exits saying why */
void cli_check_prompt_batch(const struct hyb_ctx *c, const struct hyb_hybrid_params *hy);
/* --thresholds off|expected|paper (hyb/hybrid.h enum hyb_thresholds); dies on another word. */
enum hyb_thresholds cli_thresholds(const char *s);
void cli_print_hybrid(struct hyb_ctx *c, double t_decode);
/* A routing profile's expert frequencies for the expert cache ([n_layer][n_expert]); dies with the reason. */
const float *const *cli_routing_freq(const struct hyb_model *m, const char *path);
int cmd_bench_hybrid(struct cli_opts *o);
/* bench_seqs.c: hyb bench --gpu-budget --parallel N (docs/HYBRID.md "Several sequences") */
int cmd_bench_seqs(struct cli_opts *o);
/* A context of n_seq sequences (no device), with --cats / --teal applied. */
struct hyb_ctx *cli_new_ctx_seqs(const struct hyb_model *m, const struct cli_opts *o,
				 uint32_t n_seq, bool batch_variant);
/* Tokenize the prompt (with BOS as the model wants); exits on failure. *n set. */
int32_t *cli_tokenize(const struct hyb_model *m, const char *text, int *n);

/* cli_chat.c: the chat template for the model (--chat-template or its own); exits on failure. */
struct hyb_chat_msg;
int cli_chat_template(const struct hyb_model *m, const char *name);
/* The conversation in template tmpl, allocated; NULL with hyb_last_error() (invalid UTF-8...). */
char *cli_chat_format(int tmpl, const struct hyb_chat_msg *msgs, size_t n, bool add_assistant);
/* Tokens of a chat prompt (special tokens parsed; bos: BOS as the model wants); exits on failure. */
int32_t *cli_tokenize_chat(const struct hyb_model *m, const char *text, bool bos, int *n);

/* cli_utf8.c: trailing bytes of s[0..n) that start a UTF-8 sequence not yet complete (0..3). */
size_t cli_utf8_tail(const char *s, size_t n);
/*
 * s[0..n) with every byte that is not valid UTF-8 as U+FFFD; malloc'd (NUL
 * after *len bytes; the text may hold NULs of its own), NULL when out of memory.
 */
char *cli_utf8_clean(const char *s, size_t n, size_t *len);

int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);

#endif
