// SPDX-License-Identifier: MIT
/*
 * `hyb run --manifest SRC`: box mode. The model comes from
 * the pools hybd loaded, found through its manifest (a manifest file, a
 * manifest pool "NAME.manifest" or an instance name), instead of the GGUF
 * file; generation is the same code on the same bytes, so the tokens are
 * those of `hyb run -m FILE`.
 *
 * If hybd goes away mid-run, the weights this process mapped stay readable
 * (the kernel keeps destroyed pools while they are mapped), but nothing can
 * be loaded, reloaded or uploaded any more and the box is in an unknown
 * state: a watcher thread checks the daemon every 20 ms and ends the run with
 * one clear line and exit status 3 (-EPIPE: hybd died; -ESHUTDOWN: it shut
 * down), never a hang and never silent output from a box that is gone.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "hyb/model.h"

struct hyb_model *cli_load_manifest(const char *src);

#define CLI_BOX_EXIT 3

static void *watch_daemon(void *arg)
{
	const struct hyb_model *m = arg;
	const struct timespec tick = { .tv_sec = 0, .tv_nsec = 20 * 1000 * 1000 };

	for (;;) {
		int ret = hyb_model_box_check(m);

		if (ret == -EINVAL)
			return NULL;	/* the model was freed: the run is over */
		if (ret) {
			fflush(stdout);
			fprintf(stderr, "\nhyb: %s\n", hyb_last_error());
			_exit(CLI_BOX_EXIT);
		}
		nanosleep(&tick, NULL);
	}
}

struct hyb_model *cli_load_manifest(const char *src)
{
	struct hyb_model *m = hyb_model_load_manifest(src);
	pthread_t t;

	if (!m)
		cli_die("%s", hyb_last_error());
	if (pthread_create(&t, NULL, watch_daemon, m))
		cli_die("cannot start the hybd watcher thread");
	pthread_detach(t);
	return m;
}
