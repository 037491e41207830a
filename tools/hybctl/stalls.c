// SPDX-License-Identifier: MIT
/*
 * hybctl stalls: the reload queues and how long apps wait for them (the
 * backend's per-queue statistics), then hybd's reload service per class
 * (critical / reload / prefetch) from the statistics file hybd keeps
 * (hyb/stalls.h), then the box-mode hybrid apps decoding on hybd's
 * cache (stalls_apps.c). With -w it refreshes every second and shows rates
 * since the last screen; with --json -w it prints one JSON object per
 * refresh (JSON Lines). Exit 1 only when neither part has anything to show
 * (no backend and no hybd).
 */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hyb/stalls.h"
#include "hybctl.h"

static const char usage[] =
	"usage: hybctl stalls [-w] [--count N] [--json] [--backend kmod|local]\n"
	"                     [--name NAME] [--stats FILE]\n"
	"  per reload queue: daemon, clients, requests submitted / completed / failed /\n"
	"  in flight, app stalls, and p50/p99 of queue wait, service and stall time;\n"
	"  then hybd's reload service per class (critical, reload, prefetch): requests,\n"
	"  errors, bytes, p50/p99 of queue wait and service, pre-emptions; then the\n"
	"  hybrid apps on hybd's cache: per token, GPU share of active neurons, group\n"
	"  loads, MB over the link, CPU / device FFN time, stalls, late neurons, lambda.\n"
	"  -w          refresh every second (Ctrl-C ends); --count N stops after N screens\n"
	"  --json      one JSON object (with -w: one per line per refresh)\n"
	"  --name      hybd instance (default hyb): its file is STATE_DIR/NAME.stats\n"
	"  --stats     hybd's statistics file, instead of the one --name gives\n";

static void json_hist(const char *name, const struct hyb_lat_stat *h)
{
	printf("\"%s\": {\"count\": %llu, \"sum_ns\": %llu, \"min_ns\": %llu, \"p50_ns\": %llu, "
	       "\"p90_ns\": %llu, \"p99_ns\": %llu, \"p999_ns\": %llu, \"max_ns\": %llu}", name,
	       (unsigned long long)h->count, (unsigned long long)h->sum_ns,
	       (unsigned long long)h->min_ns, (unsigned long long)h->p50_ns,
	       (unsigned long long)h->p90_ns, (unsigned long long)h->p99_ns,
	       (unsigned long long)h->p999_ns, (unsigned long long)h->max_ns);
}

/* kind < 0: no backend (queues: []) */
static void print_json(int kind, const struct hyb_rq_stats *st, const struct hyb_stalls_hybd *h,
		       const struct ctl_apps *apps, double t)
{
	if (kind < 0)
		printf("{\"backend\": null, \"time\": %.3f, \"queues\": [", t);
	else
		printf("{\"backend\": \"%s\", \"time\": %.3f, \"queues\": [",
		       hyb_backend_name((enum hyb_backend_kind)kind), t);
	for (int q = 0; kind >= 0 && q < HYB_RQ_MAX_QUEUES; q++) {
		const struct hyb_rq_stats *s = &st[q];

		printf("%s{\"queue\": %u, \"live\": %s, \"daemon_pid\": %d, \"clients\": %u, "
		       "\"submitted\": %llu, \"completed\": %llu, \"failed\": %llu, \"queued\": %llu, "
		       "\"in_service\": %llu, \"in_flight\": %llu, \"stalls\": %llu, ", q ? ", " : "",
		       s->queue_id, s->live ? "true" : "false", s->daemon_pid, s->clients,
		       (unsigned long long)s->submitted, (unsigned long long)s->completed,
		       (unsigned long long)s->failed, (unsigned long long)s->queued,
		       (unsigned long long)s->in_service, (unsigned long long)s->in_flight,
		       (unsigned long long)s->stalls);
		json_hist("queue_wait", &s->queue_wait);
		printf(", ");
		json_hist("service", &s->service);
		printf(", ");
		json_hist("stall", &s->stall);
		printf("}");
	}
	printf("], \"hybd\": ");
	hyb_stalls_print_json(stdout, h);
	printf(", \"apps\": ");
	ctl_apps_print_json(apps);
	printf("}\n");
}

static void pair(char *buf, size_t len, const struct hyb_lat_stat *h)
{
	char a[24], b[24];

	if (!h->count) {
		snprintf(buf, len, "-");
		return;
	}
	ctl_ns(a, sizeof(a), h->p50_ns);
	ctl_ns(b, sizeof(b), h->p99_ns);
	snprintf(buf, len, "%s / %s", a, b);
}

static void print_text(enum hyb_backend_kind kind, const struct hyb_rq_stats *st,
		       const struct hyb_rq_stats *prev, double dt)
{
	char w[64], sv[64], sl[64];
	int live = 0;

	for (int q = 0; q < HYB_RQ_MAX_QUEUES; q++)
		live += st[q].live;
	printf("backend %s: %d queue%s with a daemon\n", hyb_backend_name(kind), live,
	       live == 1 ? "" : "s");
	if (!live) {
		printf("no reload queue has a daemon%s\n", kind == HYB_BACKEND_LOCAL ?
		       " (local queues live inside the process that made them)" : "");
		return;
	}
	printf("%2s %7s %3s %10s %10s %8s %8s %8s %9s  %-21s %-21s %-21s\n", "Q", "DAEMON", "CL",
	       "SUBMITTED", "COMPLETED", "FAILED", "INFLIGHT", "STALLS", prev ? "REQ/S" : "",
	       "WAIT p50 / p99", "SERVICE p50 / p99", "STALL p50 / p99");
	for (int q = 0; q < HYB_RQ_MAX_QUEUES; q++) {
		const struct hyb_rq_stats *s = &st[q];
		char rate[16] = "";

		if (!s->live)
			continue;
		if (prev && prev[q].live && dt > 0 && s->submitted >= prev[q].submitted)
			snprintf(rate, sizeof(rate), "%.0f",
				 (s->submitted - prev[q].submitted) / dt);
		pair(w, sizeof(w), &s->queue_wait);
		pair(sv, sizeof(sv), &s->service);
		pair(sl, sizeof(sl), &s->stall);
		printf("%2u %7d %3u %10llu %10llu %8llu %8llu %8llu %9s  %-21s %-21s %-21s\n",
		       s->queue_id, s->daemon_pid, s->clients, (unsigned long long)s->submitted,
		       (unsigned long long)s->completed, (unsigned long long)s->failed,
		       (unsigned long long)s->in_flight, (unsigned long long)s->stalls, rate, w, sv,
		       sl);
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct stalls_args {
	enum hyb_backend_kind kind;
	int json, watch;
	long count;
	const char *name;
	char stats_path[PATH_MAX];
};

/* -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct stalls_args *a)
{
	static const struct option opts[] = {
		{ "json", 0, 0, 'j' }, { "backend", 1, 0, 'b' }, { "watch", 0, 0, 'w' },
		{ "count", 1, 0, 'n' }, { "name", 1, 0, 'N' }, { "stats", 1, 0, 's' },
		{ "help", 0, 0, 'h' }, { 0, 0, 0, 0 },
	};
	const char *stats_file = NULL;
	char *end;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "jwn:h", opts, NULL)) != -1) {
		switch (c) {
		case 'j': a->json = 1; break;
		case 'w': a->watch = 1; break;
		case 'n':
			a->count = strtol(optarg, &end, 10);
			if (*end || a->count < 1) {
				fprintf(stderr, "hybctl stalls: --count '%s' is not a positive "
					"number\n", optarg);
				return 2;
			}
			break;
		case 'b':
			if (ctl_parse_backend("stalls", optarg, &a->kind))
				return 2;
			break;
		case 'N':
			if (!*optarg || strchr(optarg, '/') || strlen(optarg) > 64) {
				fprintf(stderr, "hybctl stalls: --name '%s' is not an instance "
					"name\n", optarg);
				return 2;
			}
			a->name = optarg;
			break;
		case 's':
			if (!*optarg || strlen(optarg) >= sizeof(a->stats_path)) {
				fprintf(stderr, "hybctl stalls: --stats: empty or too long a "
					"path\n");
				return 2;
			}
			stats_file = optarg;
			break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "hybctl stalls: unexpected argument '%s'\n%s", argv[optind], usage);
		return 2;
	}
	if (stats_file)
		snprintf(a->stats_path, sizeof(a->stats_path), "%s", stats_file);
	else
		hyb_stalls_path(a->stats_path, sizeof(a->stats_path), NULL, a->name);
	return -1;
}

/* What one screen shows: the queues (with a backend), hybd's classes, the apps. */
struct screen {
	double t;
	struct hyb_rq_stats st[HYB_RQ_MAX_QUEUES];
	struct hyb_stalls_hybd hs;
	struct ctl_apps apps;
};

static void print_screen(const struct stalls_args *a, struct hyb_backend *b,
			 const struct screen *s, const struct screen *prev)
{
	if (a->json) {
		print_json(b ? (int)hyb_backend_kind(b) : -1, s->st, &s->hs, &s->apps, s->t);
		return;
	}
	if (a->watch && isatty(STDOUT_FILENO))
		printf("\033[H\033[2J");
	if (a->watch) {
		time_t tt = (time_t)s->t;
		char ts[32];

		strftime(ts, sizeof(ts), "%H:%M:%S", localtime(&tt));
		printf("%s  (every 1 s, Ctrl-C to stop)\n", ts);
	}
	if (b) {
		print_text(hyb_backend_kind(b), s->st, prev ? prev->st : NULL,
			   prev ? s->t - prev->t : s->t);
		printf("\n");
	}
	hyb_stalls_print_text(stdout, &s->hs, prev ? &prev->hs : NULL,
			      prev ? s->t - prev->t : s->t);
	ctl_apps_print_text(a->name, &s->apps, prev ? &prev->apps : NULL);
}

int cmd_stalls(int argc, char **argv)
{
	static struct stalls_args a = { .kind = HYB_BACKEND_AUTO, .name = "hyb" };
	static struct screen cur, prev;
	int have_prev = 0, ret = 0;
	struct hyb_backend *b;
	long shown = 0;

	if ((ret = parse_args(argc, argv, &a)) >= 0)
		return ret;
	ret = 0;
	/* no backend (no module): hybd's part may still have something to show */
	b = ctl_backend("stalls", a.kind, false);
	hyb_stalls_read(a.stats_path, &cur.hs);
	if (!b && cur.hs.state != HYB_STALLS_RUNNING) {
		fprintf(stderr, "hybctl stalls: %s\n", cur.hs.why);
		return 1;
	}
	for (;;) {
		cur.t = now_s();
		for (unsigned int q = 0; b && q < HYB_RQ_MAX_QUEUES; q++) {
			if (hyb_rq_stats(b, q, &cur.st[q])) {
				fprintf(stderr, "hybctl stalls: %s\n", hyb_last_error());
				ret = 1;
				goto out;
			}
		}
		if (shown)
			hyb_stalls_read(a.stats_path, &cur.hs);
		ctl_apps_read(a.name, &cur.apps);
		print_screen(&a, b, &cur, have_prev ? &prev : NULL);
		fflush(stdout);
		shown++;
		if (!a.watch || (a.count && shown >= a.count))
			break;
		prev = cur;
		have_prev = 1;
		sleep(1);
	}
out:
	if (b)
		hyb_backend_close(b);
	return ret;
}
