// SPDX-License-Identifier: MIT
/* The statistics file of a box-mode hybrid app (hyb/app_stats.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/app_stats.h"
#include "hyb/manifest.h"
#include "util/error.h"
#include "util/file.h"

#define MAGIC "hyb-app-stats 1"

void hyb_app_stats_path(const char *name, int pid, char *buf, size_t len)
{
	char dir[4096];

	hyb_state_dir(dir, sizeof(dir));
	snprintf(buf, len, "%s/%s.app.%d", dir, name, pid);
}

/* The counters, by name: one table serves the writer and the reader. */
#define U64_FIELDS(X) X(tokens) X(layer_steps) X(active) X(active_dev) X(late) X(bound_io) \
	X(bound_cpu) X(loads) X(evicts) X(load_bytes) X(critical_bytes)
#define F64_FIELDS(X) X(predictor_s) X(balancer_s) X(cpu_ffn_s) X(dev_ffn_s) X(dev_kernel_s) \
	X(stall_s) X(ffn_s) X(attn_s) X(head_s)

int hyb_app_stats_write(const char *path, const struct hyb_app_stats *s)
{
	char tmp[4200];
	FILE *f;
	int e = 0;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f) {
		e = errno;
		return hyb_error_set(-e, "%s: %s", tmp, strerror(e));
	}
	fprintf(f, MAGIC "\npid %d\nn_layer %u\npolicy %s\ntime %.6f\n", s->pid, s->n_layer,
		s->policy[0] ? s->policy : "-", s->time);
#define W_U64(n) fprintf(f, #n " %llu\n", (unsigned long long)s->st.n);
#define W_F64(n) fprintf(f, #n " %.9g\n", s->st.n);
	U64_FIELDS(W_U64)
	F64_FIELDS(W_F64)
	for (uint32_t i = 0; i < s->n_lambda && i < HYB_APP_STATS_LAMBDAS; i++)
		fprintf(f, "lambda %u %.6f\n", s->lambda_layer[i], s->lambda[i]);
	if (ferror(f))
		e = EIO;
	if (fclose(f) && !e)
		e = errno;
	return hyb_file_commit(tmp, path, e);
}

int hyb_app_stats_read(const char *path, struct hyb_app_stats *s)
{
	char line[256], key[64];
	FILE *f = fopen(path, "r");
	unsigned long long u;
	unsigned int l;
	double d;
	int e;

	memset(s, 0, sizeof(*s));
	if (!f) {
		e = errno;
		return hyb_error_set(-e, "%s: %s", path, strerror(e));
	}
	if (!fgets(line, sizeof(line), f) || strcmp(line, MAGIC "\n")) {
		fclose(f);
		return hyb_error_set(-EINVAL, "%s: not an app statistics file", path);
	}
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "lambda %u %lf", &l, &d) == 2) {
			if (s->n_lambda < HYB_APP_STATS_LAMBDAS) {
				s->lambda_layer[s->n_lambda] = l;
				s->lambda[s->n_lambda++] = d;
			}
			continue;
		}
		if (sscanf(line, "policy %23s", s->policy) == 1)
			continue;
		if (sscanf(line, "%63s", key) != 1)
			continue;
		if (!strcmp(key, "pid") && sscanf(line, "%*s %llu", &u) == 1)
			s->pid = (int32_t)u;
		else if (!strcmp(key, "n_layer") && sscanf(line, "%*s %llu", &u) == 1)
			s->n_layer = (uint32_t)u;
		else if (!strcmp(key, "time") && sscanf(line, "%*s %lf", &d) == 1)
			s->time = d;
#define R_U64(n) else if (!strcmp(key, #n) && sscanf(line, "%*s %llu", &u) == 1) s->st.n = u;
#define R_F64(n) else if (!strcmp(key, #n) && sscanf(line, "%*s %lf", &d) == 1) s->st.n = d;
		U64_FIELDS(R_U64)
		F64_FIELDS(R_F64)
	}
	fclose(f);
	if (s->pid <= 0)
		return hyb_error_set(-EINVAL, "%s: no pid", path);
	return 0;
}
