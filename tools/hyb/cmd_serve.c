// SPDX-License-Identifier: MIT
/*
 * hyb serve: the model behind an OpenAI-compatible HTTP API until SIGTERM or
 * SIGINT, which stop new work, let running requests finish for --grace
 * seconds, cancel what is left and exit 0. docs/SERVE.md.
 *
 * Box mode (--manifest): the weights are hybd's pools. When hybd shuts down
 * or dies, the server stops the same way (the mapped weights stay readable,
 * so running requests can finish) and exits 3, for a supervisor to start it
 * again against the next hybd.
 */
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "hyb/chat.h"
#include "hyb/clock.h"
#include "hyb/model.h"
#include "hyb/roofline.h"
#include "hyb/sparsity.h"
#include "serve.h"

static const char usage[] =
	"usage: hyb serve -m MODEL|--manifest NAME [--host ADDR] [--port PORT] [-c CTX]\n"
	"                 [--parallel N]\n"
	"                 [-t THREADS] [--api-key-file FILE] [--queue N] [--timeout S]\n"
	"                 [--idle-timeout S] [--max-body BYTES] [--grace S] [--max-conns N]\n"
	"                 [--max-conns-per-ip N] [--alias NAME] [--chat-template NAME]\n"
	"                 [--kv-size N] [--batch N] [--batch-variant] [--no-batch] [--no-numa-pin]\n"
	"                 [--no-prefix-cache]\n"
	"                 [--teal PROFILE [--sparsity S]]\n"
	"                 [--gpu-budget BYTES|N% [--policy P] [--device cpu|cuda] [--routing P]\n"
	"                  [--no-prefetch] [--dense-cpu]\n"
	"                  [--thresholds off|expected|paper] [--prompt-batch N] [--kv-seqs N]]\n"
	"  An OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions\n"
	"  (stream: true for Server-Sent Events), GET /v1/models, /health, /metrics.\n"
	"  --manifest NAME: box mode, hybd's copy of the model (docs/BOX.md); when hybd\n"
	"    goes, running requests finish (--grace) and the server exits 3\n"
	"  --host (127.0.0.1) --port (8080; 0: any free port, printed at start)\n"
	"  -c: positions of each request, prompt and reply (default min(training\n"
	"    context, 4096))\n"
	"  --parallel N: requests decoded at once, batched in one pass per step (1)\n"
	"  -t: threads (default: the CPUs)\n"
	"  --kv-size N: positions of the paged KV cache the requests share (default\n"
	"    parallel x ctx); a request waits until its prompt and max_tokens fit\n"
	"  --batch N: prompt tokens a step takes (512; a hybrid batch's 64): a long\n"
	"    prompt goes in pieces of N beside the running requests' tokens, which\n"
	"    then wait one piece a step, not the whole prompt (chunked prefill)\n"
	"  --batch-variant: let a request's sums depend on its batch (faster for F16\n"
	"    and K-quant weights, and with --teal; default: the same tokens alone or\n"
	"    batched)\n"
	"  --no-batch: --parallel engines of one request each instead of one batch\n"
	"  --no-prefix-cache: evaluate every prompt whole (default: a prompt that starts\n"
	"    with --batch pieces of a finished one's reuses their KV cache, bit for bit)\n"
	"  --no-numa-pin: experts split across nodes by hybd: threads unpinned\n"
	"    (docs/NUMA.md)\n"
	"  --teal PROFILE [--sparsity S]: TEAL input sparsity (docs/SPARSITY.md); batched\n"
	"    decode steps keep TEAL's sums unless --batch-variant (docs/SERVE.md); with\n"
	"    --gpu-budget (a plain model) on the CPU's share\n"
	"  --gpu-budget: hybrid decoding as hyb run's (a plan's neuron cache, a mixture\n"
	"    of experts' expert cache: docs/MOE.md); --parallel N batches the requests\n"
	"    through it (docs/HYBRID.md, docs/MOE.md)\n"
	"  --kv-seqs N: of the --parallel requests, N attend on the device with their KV\n"
	"    cache there, the others on the CPU over DRAM (APEX; default: all)\n"
	"  --api-key-file FILE: requests need 'Authorization: Bearer KEY' (KEY: the\n"
	"    file's first line); GET /health does not\n"
	"  --queue N: requests that may wait for a busy slot (32; 0: none wait); more get\n"
	"    503 with Retry-After\n"
	"  --timeout S: a request's time from arrival to its last token (600)\n"
	"  --idle-timeout S: a connection silent this long, or a body slower than this,\n"
	"    is closed (30)\n"
	"  --max-body BYTES: largest request body (4194304); --max-conns N (256)\n"
	"  --max-conns-per-ip N: connections one client address may hold (0: no limit)\n"
	"  --grace S: on SIGTERM running requests may finish for S seconds (30); a\n"
	"    second SIGTERM or SIGINT cancels them at once\n"
	"  --alias NAME: the model's name in the API (default: the file name)\n"
	"  --chat-template NAME: instead of the model's tokenizer.chat_template\n";

enum { O_HOST = 256, O_PORT, O_PARALLEL, O_KEYFILE, O_QUEUE, O_TIMEOUT, O_IDLE, O_MAXBODY,
       O_GRACE, O_MAXCONNS, O_PERIP, O_ALIAS, O_TEMPLATE, O_KVSIZE, O_VARIANT, O_NOBATCH, O_NOPREFIX,
       O_MANIFEST, O_TEAL, O_SPARSITY, O_BUDGET, O_POLICY, O_DEVICE, O_ROUTING,
       O_NO_PREFETCH, O_DENSE_CPU, O_THRESHOLDS, O_PROMPT_BATCH, O_KV_SEQS, O_BATCH, O_NO_NUMA_PIN };

static const struct option longopts[] = {
	{ "model", required_argument, 0, 'm' },
	{ "threads", required_argument, 0, 't' },
	{ "ctx-size", required_argument, 0, 'c' },
	{ "host", required_argument, 0, O_HOST },
	{ "port", required_argument, 0, O_PORT },
	{ "parallel", required_argument, 0, O_PARALLEL },
	{ "api-key-file", required_argument, 0, O_KEYFILE },
	{ "queue", required_argument, 0, O_QUEUE },
	{ "timeout", required_argument, 0, O_TIMEOUT },
	{ "idle-timeout", required_argument, 0, O_IDLE },
	{ "max-body", required_argument, 0, O_MAXBODY },
	{ "grace", required_argument, 0, O_GRACE },
	{ "max-conns", required_argument, 0, O_MAXCONNS },
	{ "max-conns-per-ip", required_argument, 0, O_PERIP },
	{ "alias", required_argument, 0, O_ALIAS },
	{ "chat-template", required_argument, 0, O_TEMPLATE },
	{ "kv-size", required_argument, 0, O_KVSIZE },
	{ "batch", required_argument, 0, O_BATCH },
	{ "batch-variant", no_argument, 0, O_VARIANT },
	{ "no-numa-pin", no_argument, 0, O_NO_NUMA_PIN },
	{ "no-batch", no_argument, 0, O_NOBATCH },
	{ "no-prefix-cache", no_argument, 0, O_NOPREFIX },
	{ "manifest", required_argument, 0, O_MANIFEST },
	{ "teal", required_argument, 0, O_TEAL },
	{ "gpu-budget", required_argument, 0, O_BUDGET },
	{ "policy", required_argument, 0, O_POLICY },
	{ "device", required_argument, 0, O_DEVICE },
	{ "routing", required_argument, 0, O_ROUTING },
	{ "no-prefetch", no_argument, 0, O_NO_PREFETCH },
	{ "dense-cpu", no_argument, 0, O_DENSE_CPU },
	{ "thresholds", required_argument, 0, O_THRESHOLDS },
	{ "prompt-batch", required_argument, 0, O_PROMPT_BATCH },
	{ "kv-seqs", required_argument, 0, O_KV_SEQS },
	{ "sparsity", required_argument, 0, O_SPARSITY },
	{ "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 },
};

static void parse(int argc, char **argv, struct serve_opts *o)
{
	int c;

	*o = (struct serve_opts){ .host = "127.0.0.1", .port = 8080, .parallel = 1, .queue = 32,
				  .timeout_s = 600, .idle_timeout_s = 30, .max_body = 4 << 20,
				  .grace_s = 30, .max_conns = 256, .sparsity = -1 };
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:t:c:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 't': o->n_threads = (int)cli_num("-t", optarg, 1, 1024); break;
		case 'c': o->n_ctx = (uint32_t)cli_num("-c", optarg, 1, 1 << 24); break;
		case O_HOST: o->host = optarg; break;
		case O_PORT: o->port = (int)cli_num("--port", optarg, 0, 65535); break;
		case O_PARALLEL: o->parallel = (int)cli_num("--parallel", optarg, 1, 256); break;
		case O_KEYFILE: o->api_key_file = optarg; break;
		case O_QUEUE: o->queue = (int)cli_num("--queue", optarg, 0, 1 << 20); break;
		case O_TIMEOUT: o->timeout_s = cli_num("--timeout", optarg, 0.001, 1e7); break;
		case O_IDLE: o->idle_timeout_s = (int)cli_num("--idle-timeout", optarg, 1, 86400); break;
		case O_MAXBODY: o->max_body = (size_t)cli_num("--max-body", optarg, 1, 1 << 30); break;
		case O_GRACE: o->grace_s = cli_num("--grace", optarg, 0, 86400); break;
		case O_MAXCONNS: o->max_conns = (int)cli_num("--max-conns", optarg, 1, 65536); break;
		case O_PERIP:
			o->max_conns_per_ip = (int)cli_num("--max-conns-per-ip", optarg, 0, 65536);
			break;
		case O_ALIAS: o->alias = optarg; break;
		case O_TEMPLATE: o->chat_template = optarg; break;
		case O_KVSIZE: o->kv_size = (uint32_t)cli_num("--kv-size", optarg, 1, 1 << 26); break;
		case O_BATCH: o->n_batch = (uint32_t)cli_num("--batch", optarg, 1, 65536); break;
		case O_VARIANT: o->batch_variant = true; break;
		case O_NO_NUMA_PIN: o->numa_no_pin = true; break;
		case O_NOBATCH: o->no_batch = true; break;
		case O_NOPREFIX: o->no_prefix_cache = true; break;
		case O_MANIFEST: o->manifest = optarg; break;
		case O_TEAL: o->teal = optarg; break;
		case O_SPARSITY:
			o->sparsity = cli_num("--sparsity", optarg, 0, 1);
			if (o->sparsity >= 1)
				cli_die("--sparsity %s: the fraction of inputs to skip, below 1",
					optarg);
			break;
		case O_BUDGET: o->gpu_budget = optarg; break;
		case O_POLICY:
			if (hyb_policy_parse(optarg, &o->hy.policy))
				cli_die("%s", hyb_last_error());
			break;
		case O_DEVICE:
			if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
				cli_die("unknown device '%s' (cpu, cuda)", optarg);
			o->hy.device = optarg;
			break;
		case O_ROUTING: o->routing = optarg; break;
		case O_NO_PREFETCH: o->hy.no_prefetch = true; break;
		case O_DENSE_CPU: o->hy.dense_on_cpu = true; break;
		case O_THRESHOLDS: o->hy.thresholds = cli_thresholds(optarg); break;
		case O_KV_SEQS: o->hy.kv_seqs = (uint32_t)cli_num("--kv-seqs", optarg, 1, 256); break;
		case O_PROMPT_BATCH:
			o->hy.prompt_batch = (uint32_t)cli_num("--prompt-batch", optarg, 1, 1 << 16);
			break;
		case 'h': fputs(usage, stdout); exit(0);
		default: fputs(usage, stderr); exit(2);
		}
	}
	if (optind < argc)
		cli_die("unexpected argument '%s'", argv[optind]);
	if (o->sparsity >= 0 && !o->teal)
		cli_die("--sparsity needs --teal PROFILE");
	if (o->model && o->manifest)
		cli_die("-m %s and --manifest %s: one model", o->model, o->manifest);
	if (o->gpu_budget && o->parallel > 1 && o->no_batch)
		cli_die("--gpu-budget --parallel %d: hybrid decoding batches on one engine on the "
			"device (no --no-batch)", o->parallel);
	if (!o->gpu_budget && (o->routing || o->hy.no_prefetch || o->hy.dense_on_cpu ||
			       o->hy.thresholds || o->hy.prompt_batch || o->hy.kv_seqs))
		cli_die("--routing, --no-prefetch, --dense-cpu, --thresholds, --prompt-batch and "
			"--kv-seqs go with --gpu-budget");
	if (o->hy.kv_seqs > (uint32_t)o->parallel)
		cli_die("--kv-seqs %u: more than the %d requests at once (--parallel)",
			o->hy.kv_seqs, o->parallel);
	if (!o->model && !o->manifest)
		cli_die("no model given (-m MODEL or --manifest NAME)");
}

/* The key: the file's first line without its end; exits when there is none. */
static char *read_key(const char *path)
{
	char line[4096];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		cli_die("--api-key-file %s: %s", path, strerror(errno));
	if (!fgets(line, sizeof(line), f))
		line[0] = 0;
	fclose(f);
	n = strcspn(line, "\r\n");
	while (n && (line[n - 1] == ' ' || line[n - 1] == '\t'))
		n--;
	line[n] = 0;
	if (!n)
		cli_die("--api-key-file %s: the first line (the key) is empty", path);
	return strdup(line);
}

/* The model's name in the API: --alias, else the file (or manifest) name without .gguf (.manifest). */
static char *model_id(const struct serve_opts *o)
{
	const char *src = o->manifest ? o->manifest : o->model;
	const char *b = o->alias ? o->alias : strrchr(src, '/') ? strrchr(src, '/') + 1 : src;
	const char *ext = o->manifest ? ".manifest" : ".gguf";
	char *id = strdup(b);
	size_t n = strlen(id), e = strlen(ext);

	if (!o->alias && n > e && !strcmp(id + n - e, ext))
		id[n - e] = 0;
	return id;
}

/*
 * SIGTERM and SIGINT reach the main thread through a pipe: it is the one
 * thread that leaves them unblocked, and should a library's thread take one
 * all the same, the handler there only writes the pipe too.
 */
static int sig_pipe[2];

static void on_signal(int sig)
{
	char c = (char)sig;
	ssize_t rc = write(sig_pipe[1], &c, 1);

	(void)rc;
}

/* Box mode: hybd's state, polled; its going is told to the main thread as SIG_HYBD. */
#define SIG_HYBD 0
static char hybd_gone[512];

static void *watch_hybd(void *arg)
{
	const struct hyb_model *m = arg;
	const struct timespec tick = { .tv_sec = 0, .tv_nsec = 100 * 1000 * 1000 };
	char c = SIG_HYBD;

	while (!hyb_model_box_check(m))
		nanosleep(&tick, NULL);
	snprintf(hybd_gone, sizeof(hybd_gone), "%s", hyb_last_error());
	if (write(sig_pipe[1], &c, 1) != 1)
		return NULL;
	return NULL;
}

static const char *why(int sig)
{
	return sig == SIG_HYBD ? hybd_gone : strsignal(sig);
}

static int wait_signal(void)
{
	char c;

	while (read(sig_pipe[0], &c, 1) != 1)
		if (errno != EINTR)
			return SIGTERM;
	return c;
}

int cmd_serve(int argc, char **argv)
{
	static struct serve sv;
	struct sigaction sa;
	sigset_t sigs;
	int port, sig;
	double t0 = hyb_now();
	char *id;

	parse(argc, argv, &sv.o);
	if (sv.o.api_key_file)
		sv.api_key = read_key(sv.o.api_key_file);
	/* every thread started from here blocks the signals; the main thread takes them */
	if (pipe2(sig_pipe, O_CLOEXEC))
		cli_die("pipe: %s", strerror(errno));
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	sv.m = sv.o.manifest ? hyb_model_load_manifest(sv.o.manifest) : hyb_model_load(sv.o.model);
	if (!sv.m)
		cli_die("%s", hyb_last_error());
	if (!sv.m->tok)
		cli_die("%s: the model has no usable tokenizer (tokenizer.ggml.* metadata)",
			sv.o.manifest ? sv.o.manifest : sv.o.model);
	sv.tmpl = cli_chat_template(sv.m, sv.o.chat_template);
	id = model_id(&sv.o);
	sv.model_id = id;
	sv.created = (long long)time(NULL);
	serve_json_init();
	serve_metrics_init(&sv.mt);
	if (sv.o.hy.kv_seqs && sv.m->hp.n_expert)
		cli_die("--kv-seqs: a mixture's batches attend on the CPU, the budget is its "
			"experts' (docs/MOE.md)");
	if (sv.o.gpu_budget) {
		sv.o.hy.gpu_budget = cli_gpu_budget(sv.o.gpu_budget, sv.m);
		if (sv.o.routing)
			sv.o.hy.bal.freq = cli_routing_freq(sv.m, sv.o.routing);
	}
	if (sv.o.teal) {
		sv.teal_thr = malloc(sizeof(float) * sv.m->hp.n_layer * HYB_TEAL_INPUTS);
		if (!sv.teal_thr)
			cli_die("out of memory");
		if (hyb_sparsity_teal_thresholds(sv.o.teal, sv.o.sparsity > 0 ? sv.o.sparsity : 0,
						 sv.teal_thr, sv.m->hp.n_layer))
			cli_die("--teal %s: %s", sv.o.teal, hyb_last_error());
	}
	{
		const struct serve_engine_opts eo = {
			.parallel = sv.o.parallel, .max_depth = sv.o.queue, .n_ctx = sv.o.n_ctx,
			.n_threads = sv.o.n_threads, .kv_size = sv.o.kv_size,
			.batch_variant = sv.o.batch_variant, .no_batch = sv.o.no_batch,
			.no_prefix_cache = sv.o.no_prefix_cache,
			.n_batch = sv.o.n_batch, .numa_no_pin = sv.o.numa_no_pin,
			.teal_thr = sv.teal_thr, .hybrid = sv.o.gpu_budget ? &sv.o.hy : NULL,
		};

		if (serve_queue_start(&sv.q, sv.m, &sv.mt, &eo))
			cli_die("cannot start %d decoding engine%s", sv.o.parallel,
				sv.o.parallel > 1 ? "s" : "");
		if (eo.hybrid) {
			struct hyb_hybrid_offload pl;

			cli_check_prompt_batch(sv.q.slots[0].ctx, &sv.o.hy);
			hyb_ctx_hybrid_offload(sv.q.slots[0].ctx, &pl);
			fprintf(stderr, "hyb serve: hybrid decoding on the %s device: %s\n",
				sv.o.hy.device ? sv.o.hy.device : "cpu", pl.cache_note);
			if (pl.prompt_batch)
				fprintf(stderr, "hyb serve: prompts of 32 tokens and more in batches of "
					"up to %u on the device\n", pl.prompt_batch);
			if (sv.q.batched && pl.experts)
				fprintf(stderr, "hyb serve: %d requests batched through the expert "
					"cache, attention on the CPU\n", sv.o.parallel);
			else if (sv.q.batched)
				fprintf(stderr, "hyb serve: %u of %d requests attend on the device "
					"(%u of %u attention blocks there), the others on the CPU\n",
					pl.kv_seqs, sv.o.parallel, pl.attn_layers, sv.m->hp.n_layer);
		}
	}
	port = serve_http_start(&sv);
	if (port < 0)
		exit(1);
	{
		struct hyb_kv_stats kv;

		hyb_ctx_kv_stats(sv.q.slots[0].ctx, &kv);
		fprintf(stderr, "hyb serve: %s (%s, %u layers, %s kernels) as '%s': %d request%s "
			"at once (%s), %u positions each, %d thread%s%s, queue %d%s; loaded in "
			"%.2f s\n", sv.o.manifest ? sv.o.manifest : sv.o.model, sv.m->hp.arch,
			sv.m->hp.n_layer, hyb_roofline_isa(),
			id, sv.o.parallel, sv.o.parallel > 1 ? "s" : "",
			sv.q.batched ? "batched" : sv.o.parallel > 1 ? "one engine each" : "one engine",
			serve_queue_n_ctx(&sv.q), hyb_ctx_n_threads(sv.q.slots[0].ctx),
			hyb_ctx_n_threads(sv.q.slots[0].ctx) > 1 ? "s" : "",
			sv.q.batched ? "" : " each", sv.o.queue,
			sv.api_key ? "; API key required" : "", hyb_now() - t0);
		if (sv.q.batched)
			fprintf(stderr, "hyb serve: paged KV cache of %u blocks of %u positions "
				"(%s)\n", kv.blocks, kv.block_pos,
				sv.o.batch_variant ? "batch-variant sums" : "batch invariant");
	}
	fprintf(stderr, "hyb serve: listening on http://%s%s%s:%d\n",
		strchr(sv.o.host, ':') ? "[" : "", sv.o.host, strchr(sv.o.host, ':') ? "]" : "",
		port);

	if (sv.o.manifest) {
		pthread_t t;

		if (pthread_create(&t, NULL, watch_hybd, (void *)sv.m))
			cli_die("cannot start the hybd watcher thread");
		pthread_detach(t);
	}
	pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
	sig = wait_signal();
	fprintf(stderr, "hyb serve: %s: no new requests; %d running, %d queued (grace %g s)\n",
		why(sig), serve_queue_running(&sv.q), sv.q.depth, sv.o.grace_s);
	atomic_store(&sv.stopping, true);
	serve_http_quiesce(&sv);
	serve_queue_drain(&sv.q);
	/* running requests may finish within the grace period; a second signal cuts it short */
	for (double t = hyb_now(); serve_queue_running(&sv.q) && hyb_now() - t < sv.o.grace_s;) {
		struct pollfd pfd = { .fd = sig_pipe[0], .events = POLLIN };

		if (poll(&pfd, 1, 100) == 1) {
			const int again = wait_signal();

			if (again == SIG_HYBD) { /* the weights stay mapped: finishing goes on */
				fprintf(stderr, "hyb serve: %s\n", why(again));
				continue;
			}
			fprintf(stderr, "hyb serve: %s again: cancelling what runs\n", why(again));
			break;
		}
	}
	serve_queue_stop(&sv.q);
	/* the answers of finished and cancelled requests still go out */
	for (int i = 0; i < 50 && atomic_load(&sv.active) > 0; i++)
		usleep(100 * 1000);
	serve_http_stop(&sv);
	fprintf(stderr, "hyb serve: stopped (%llu prompt and %llu generated tokens served)\n",
		(unsigned long long)sv.mt.prompt_tokens, (unsigned long long)sv.mt.completion_tokens);
	/* the watcher may still poll the model: a box model is left to the exit */
	if (!sv.o.manifest)
		hyb_model_free((struct hyb_model *)sv.m);
	free(id);
	free(sv.api_key);
	free(sv.teal_thr);
	return sig == SIG_HYBD ? 3 : 0;
}
