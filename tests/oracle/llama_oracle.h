/* SPDX-License-Identifier: MIT */
/* What llama_ref.c and llama_speed.c share: quiet loading and the greedy pick. */
#ifndef HYB_LLAMA_ORACLE_H
#define HYB_LLAMA_ORACLE_H

#include <stdbool.h>
#include <stdio.h>

#include "llama.h"

static bool no_progress(float progress, void *arg)
{
	(void)progress;
	(void)arg;
	return true; /* no dots on stderr */
}

static void quiet(enum ggml_log_level level, const char *text, void *arg)
{
	(void)arg;
	if (level >= GGML_LOG_LEVEL_ERROR)
		fputs(text, stderr);
}

/* the greedy token: the first maximum */
static int argmax(const float *l, int n)
{
	int best = 0;

	for (int i = 1; i < n; i++)
		if (l[i] > l[best])
			best = i;
	return best;
}

#endif
