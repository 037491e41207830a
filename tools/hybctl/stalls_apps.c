// SPDX-License-Identifier: MIT
/*
 * hybctl stalls, third part: the box-mode hybrid apps of a hybd instance,
 * from the files they publish (hyb/app_stats.h): per token, the device's
 * share of active neurons, group loads, bytes over the link, CPU FFN and
 * device FFN time, stalls, late neurons, and lambda of sampled layers
 *. Per token since the last screen under -w, else over
 * the app's run. Files of processes that are gone are skipped.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/manifest.h"
#include "hybctl.h"

void ctl_apps_read(const char *name, struct ctl_apps *out)
{
	char dir[4096], prefix[96], path[4400];
	struct dirent *e;
	DIR *d;

	out->n = 0;
	hyb_state_dir(dir, sizeof(dir));
	snprintf(prefix, sizeof(prefix), "%s.app.", name);
	d = opendir(dir);
	while (d && (e = readdir(d)) && out->n < CTL_MAX_APPS) {
		struct hyb_app_stats *a = &out->a[out->n];

		if (strncmp(e->d_name, prefix, strlen(prefix)) || strstr(e->d_name, ".tmp"))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (hyb_app_stats_read(path, a))
			continue;
		if (kill(a->pid, 0) && errno == ESRCH)
			continue;	/* the app died without removing its file */
		out->n++;
	}
	if (d)
		closedir(d);
}

/* cur minus the same app's previous screen, when there is one and no reset came between */
static struct hyb_hybrid_stats delta(const struct hyb_app_stats *cur,
				     const struct ctl_apps *prev)
{
	struct hyb_hybrid_stats s = cur->st;

	for (int i = 0; prev && i < prev->n; i++) {
		const struct hyb_hybrid_stats *p = &prev->a[i].st;

		if (prev->a[i].pid != cur->pid || p->tokens > s.tokens || p->loads > s.loads)
			continue;
		s.tokens -= p->tokens;
		s.active -= p->active;
		s.active_dev -= p->active_dev;
		s.late -= p->late;
		s.loads -= p->loads;
		s.load_bytes -= p->load_bytes;
		s.critical_bytes -= p->critical_bytes;
		s.cpu_ffn_s -= p->cpu_ffn_s;
		s.dev_kernel_s -= p->dev_kernel_s;
		s.stall_s -= p->stall_s;
		break;
	}
	return s;
}

void ctl_apps_print_text(const char *name, const struct ctl_apps *cur,
			 const struct ctl_apps *prev)
{
	if (!cur->n) {
		printf("\nno box-mode hybrid app decodes on %s's cache\n", name);
		return;
	}
	printf("\nhybrid apps on %s's cache (per token, %s):\n", name,
	       prev ? "since the last screen" : "over each run");
	printf("%7s %-13s %8s %6s %9s %8s %10s %10s %9s %6s  %s\n", "PID", "POLICY", "TOKENS",
	       "GPU%", "LOADS/TOK", "MB/TOK", "CPU FFN ms", "DEV FFN ms", "STALL ms", "LATE%",
	       "LAMBDA (layer=value)");
	for (int i = 0; i < cur->n; i++) {
		const struct hyb_app_stats *a = &cur->a[i];
		const struct hyb_hybrid_stats s = delta(a, prev);
		const double n = s.tokens ? (double)s.tokens : 1;
		char lam[128] = "-";
		size_t off = 0;

		for (uint32_t k = 0; k < a->n_lambda && off < sizeof(lam); k++)
			off += (size_t)snprintf(lam + off, sizeof(lam) - off, "%s%u=%.2f",
						k ? " " : "", a->lambda_layer[k], a->lambda[k]);
		printf("%7d %-13s %8llu %6.1f %9.2f %8.3f %10.3f %10.3f %9.3f %6.1f  %s\n", a->pid,
		       a->policy, (unsigned long long)a->st.tokens,
		       s.active ? 100.0 * s.active_dev / s.active : 0.0, s.loads / n,
		       (s.load_bytes + s.critical_bytes) / n / 1e6, s.cpu_ffn_s / n * 1e3,
		       s.dev_kernel_s / n * 1e3, s.stall_s / n * 1e3,
		       s.active ? 100.0 * s.late / s.active : 0.0, lam);
	}
}

void ctl_apps_print_json(const struct ctl_apps *cur)
{
	printf("[");
	for (int i = 0; i < cur->n; i++) {
		const struct hyb_app_stats *a = &cur->a[i];
		const struct hyb_hybrid_stats *s = &a->st;

		printf("%s{\"pid\": %d, \"policy\": \"%s\", \"time\": %.3f, \"tokens\": %llu, "
		       "\"active\": %llu, \"active_dev\": %llu, \"late\": %llu, \"loads\": %llu, "
		       "\"load_bytes\": %llu, \"critical_bytes\": %llu, \"cpu_ffn_s\": %.6f, "
		       "\"dev_kernel_s\": %.6f, \"stall_s\": %.6f, \"lambda\": [", i ? ", " : "",
		       a->pid, a->policy, a->time, (unsigned long long)s->tokens,
		       (unsigned long long)s->active, (unsigned long long)s->active_dev,
		       (unsigned long long)s->late, (unsigned long long)s->loads,
		       (unsigned long long)s->load_bytes, (unsigned long long)s->critical_bytes,
		       s->cpu_ffn_s, s->dev_kernel_s, s->stall_s);
		for (uint32_t k = 0; k < a->n_lambda; k++)
			printf("%s{\"layer\": %u, \"value\": %.6f}", k ? ", " : "",
			       a->lambda_layer[k], a->lambda[k]);
		printf("]}");
	}
	printf("]");
}
