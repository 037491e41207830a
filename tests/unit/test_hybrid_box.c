// SPDX-License-Identifier: MIT
/*
 * Hybrid decoding in box mode: the model is hybd's (served
 * from its pools, found through the manifest), the neuron cache is hybd's
 * (its CPU device's slots, a shared pool) and every group load is an UPLOAD
 * request on hybd's reload queue, carried out by hybd's copy engine. hybd
 * runs in this process on the local backend, exactly as in test_box.c.
 *   - Oracle mode: the output is bit-identical to CPU-only sparse decoding
 *     of the file, for the dynamic policies; every load the engine counts
 *     went through the queue, and each slot holds the bundle its table
 *     entry names, byte for byte.
 *   - One app per cache: a second context is refused (HYBD) or keeps its
 *     own cache (AUTO), and gets hybd's once the first is gone.
 *   - Refusals and failures are one clear line: not a box model, slots too
 *     small for a group, hybd gone mid-run.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/server.h"
#include "hyb/app_stats.h"
#include "hyb/gpucache.h"
#include "hyb/manifest.h"
#include "hyb/hybrid.h"
#include "hyb/model.h"
#include "hyb/testing.h"
#include "hyb/pool.h"
#include "hybrid/dense.h"
#include "test.h"

#define N_PROMPT 8
#define N_GEN 24
#define N_CTX 64

static void start_hybd(const char *name, const char *slot_bytes, const char *slots,
		       struct hybd **d)
{
	struct hybd_config c;
	char err[512];

	setenv("HYB_BACKEND", "local", 1);
	setenv("HYB_STATE_DIR", hyb_test_tmpdir(), 1);
	hybd_config_defaults(&c);
	CHECK(!hybd_config_set(&c, "model", hyb_test_plan(), err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "backend", "local", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "name", name, err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "state_dir", hyb_test_tmpdir(), err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "progress", "quiet", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "stats_interval", "0", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "device", "cpu", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "gpu_slots", slots, err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "slot_bytes", slot_bytes, err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "log_level", "error", err, sizeof(err)));
	CHECK_MSG(!hybd_start(&c, NULL, NULL, d, err, sizeof(err)), "hybd: %s", err);
}

static uint64_t group_bytes(const struct hyb_model *m)
{
	return 3ull * m->group_size * m->layers[0].plan.bundles.row_bytes;
}

/*
 * hybd's cache for a third of the plan's groups (as a gpu_slots value): in
 * box mode the groups get every slot of it, so a smaller cache than the
 * model keeps the policies loading.
 */
static const char *third_of_groups(void)
{
	static char v[16];
	struct hyb_model *m = hyb_model_load(hyb_test_plan());

	CHECK_MSG(m, "%s", hyb_last_error());
	snprintf(v, sizeof(v), "%u", m->hp.n_layer * m->n_groups / 3);
	hyb_model_free(m);
	return v;
}

/* Room for the dense parts and about a third of the model's groups. */
static struct hyb_hybrid_params params(const struct hyb_model *m, enum hyb_policy p,
				       enum hyb_cache_src cache)
{
	uint64_t dense = hyb_hdense_head_bytes(m) + hyb_hdense_buffer_bytes(m, true, true, true);

	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		dense += hyb_hdense_layer_bytes(m, l, N_CTX) + hyb_hdense_pred_bytes(m, l);
	return (struct hyb_hybrid_params){
		.device = "cpu", .policy = p, .cache = cache,
		.gpu_budget = dense + (group_bytes(m) + 256) * m->n_groups * m->hp.n_layer / 3 +
			      (1u << 20),
	};
}

static struct hyb_ctx *ctx_try(const struct hyb_model *m, const struct hyb_hybrid_params *hy,
			       bool oracle)
{
	struct hyb_ctx_params p = {
		.n_ctx = N_CTX, .n_threads = 2, .ffn = HYB_FFN_SPARSE, .hybrid = hy,
		.testing = oracle ? HYB_TESTING_FFN_ORACLE : 0,
	};

	return hyb_ctx_new(m, &p);
}

static struct hyb_ctx *ctx_new(const struct hyb_model *m, const struct hyb_hybrid_params *hy,
			       bool oracle)
{
	struct hyb_ctx *c = ctx_try(m, hy, oracle);

	CHECK_MSG(c, "%s", hyb_last_error());
	return c;
}

/* A prompt, then greedy with a forced token every 5 steps (drift); the logits of each step. */
static int run(struct hyb_ctx *c, const struct hyb_model *m, float *logits)
{
	const uint32_t V = m->hp.n_vocab;
	float *lg = malloc(sizeof(float) * V);
	int32_t prompt[N_PROMPT];
	int rc;

	CHECK(lg);
	for (int i = 0; i < N_PROMPT; i++)
		prompt[i] = (int32_t)(3 + (uint32_t)(i * 2654435761u) % (V - 3));
	rc = hyb_ctx_eval(c, prompt, N_PROMPT, lg, false);
	for (int i = 0; i < N_GEN && !rc; i++) {
		int32_t t = i % 5 == 4 ? (int32_t)(3 + (uint32_t)(i * 40503u + 7) % (V - 3)) :
					 hyb_test_argmax(lg, V);

		if (logits)
			memcpy(logits + (size_t)i * V, lg, sizeof(float) * V);
		rc = hyb_ctx_eval(c, &t, 1, lg, false);
	}
	free(lg);
	return rc;
}

static uint64_t queue_submitted(struct hyb_backend *b)
{
	struct hyb_rq_stats qs;

	CHECK(!hyb_rq_stats(b, 0, &qs));
	CHECK_MSG(qs.failed == 0 && qs.in_flight == 0, "%llu failed, %llu in flight",
		  (unsigned long long)qs.failed, (unsigned long long)qs.in_flight);
	return qs.submitted;
}

TEST(hybrid_box_oracle_bit_identical_through_hybd)
{
	struct hyb_model *mf, *mb;
	struct hybd *d;
	struct hyb_gpucache_desc desc;
	char path[600];
	uint32_t V;
	float *lref, *lbox;

	start_hybd("hbx", "auto", third_of_groups(), &d);
	snprintf(path, sizeof(path), "%s/hbx.gpucache", hyb_test_tmpdir());
	CHECK_MSG(!hyb_gpucache_desc_read(path, &desc), "%s", hyb_last_error());
	mf = hyb_model_load(hyb_test_plan());
	CHECK_MSG(mf, "%s", hyb_last_error());
	/* slot_bytes = auto: one group per slot, rounded up to 256 bytes */
	CHECK_MSG(desc.kind == HYB_GPUCACHE_HOST &&
		  desc.slot_bytes == (group_bytes(mf) + 255) / 256 * 256,
		  "kind %u, %llu-byte slots for %llu-byte groups", desc.kind,
		  (unsigned long long)desc.slot_bytes, (unsigned long long)group_bytes(mf));
	mb = hyb_model_load_manifest("hbx");
	CHECK_MSG(mb, "%s", hyb_last_error());
	V = mf->hp.n_vocab;
	lref = malloc(sizeof(float) * V * N_GEN);
	lbox = malloc(sizeof(float) * V * N_GEN);
	CHECK(lref && lbox);
	{
		struct hyb_ctx *ref = ctx_new(mf, NULL, true);

		CHECK_MSG(!run(ref, mf, lref), "%s", hyb_last_error());
		hyb_ctx_free(ref);
	}
	const enum hyb_policy pol[] = { HYB_POLICY_LRU, HYB_POLICY_TAM_ADAPTIVE };

	for (unsigned int k = 0; k < sizeof(pol) / sizeof(pol[0]); k++) {
		struct hyb_hybrid_params hy = params(mb, pol[k], HYB_CACHE_AUTO);
		const uint64_t q0 = queue_submitted(mb->image_backend);
		struct hyb_hybrid_offload pl;
		struct hyb_hybrid_stats st;
		struct hyb_ctx *c = ctx_new(mb, &hy, true);
		uint64_t resident, slots;

		hyb_ctx_hybrid_offload(c, &pl);
		CHECK_MSG(pl.cache_hybd && strstr(pl.cache_note, "hybd's (pid") &&
			  strstr(pl.cache_note, "host memory"), "%s", pl.cache_note);
		CHECK_MSG(!run(c, mb, lbox), "%s", hyb_last_error());
		hyb_ctx_hybrid_stats(c, &st);
		hyb_ctx_hybrid_cache(c, &resident, &slots);
		CHECK_MSG(st.active_dev > 0 && st.loads > 0, "%s: %llu on the device, %llu loads",
			  hyb_policy_name(pol[k]), (unsigned long long)st.active_dev,
			  (unsigned long long)st.loads);
		CHECK(resident <= slots && slots <= desc.n_slots);
		for (int i = 0; i < N_GEN; i++)
			CHECK_MSG(!memcmp(lref + (size_t)i * V, lbox + (size_t)i * V,
					  sizeof(float) * V),
				  "%s: logits of step %d differ from CPU-only sparse decoding of "
				  "the file", hyb_policy_name(pol[k]), i);
		hyb_ctx_free(c);
		/* every load the engine made was a request hybd served (the warm start's too) */
		CHECK_MSG(queue_submitted(mb->image_backend) - q0 >= st.loads && st.loads > 0,
			  "%s: %llu requests for %llu loads", hyb_policy_name(pol[k]),
			  (unsigned long long)(queue_submitted(mb->image_backend) - q0),
			  (unsigned long long)st.loads);
	}
	free(lref);
	free(lbox);
	hyb_model_free(mb);
	hyb_model_free(mf);
	hybd_stop(d, "test");
}

/* What hybd's copies put in the slots is what the engine's table says is there. */
TEST(hybrid_box_slots_hold_the_bundles_the_table_names)
{
	struct hyb_model *mb;
	struct hybd *d;
	struct hyb_gpucache_desc desc;
	struct hyb_mempool *pool;
	char path[600];
	const uint8_t *base;
	void *addr;
	size_t len;

	start_hybd("hbs", "auto", third_of_groups(), &d);
	snprintf(path, sizeof(path), "%s/hbs.gpucache", hyb_test_tmpdir());
	CHECK_MSG(!hyb_gpucache_desc_read(path, &desc), "%s", hyb_last_error());
	mb = hyb_model_load_manifest("hbs");
	CHECK_MSG(mb, "%s", hyb_last_error());
	CHECK(!hyb_mempool_open(mb->image_backend, desc.pool, &pool));
	CHECK(!hyb_mempool_map(pool, &addr, &len));
	CHECK(!hyb_mempool_writable(pool));
	base = addr;
	{
		struct hyb_hybrid_params hy = params(mb, HYB_POLICY_TAM_ADAPTIVE, HYB_CACHE_HYBD);
		struct hyb_ctx *c = ctx_new(mb, &hy, false);
		const struct hyb_manifest *mf = hyb_model_manifest(mb);
		int32_t *table;
		uint32_t n = 0;

		CHECK_MSG(!run(c, mb, NULL), "%s", hyb_last_error());
		table = malloc(sizeof(int32_t) * mb->hp.n_layer * mb->n_groups);
		CHECK(table);
		CHECK(!hyb_ctx_hybrid_table(c, table));
		/*
		 * The last layer's decision (layer 0 of the next token) may still be
		 * loading: freeing the context waits for every load it sent.
		 */
		hyb_ctx_free(c);
		for (uint32_t l = 0; l < mb->hp.n_layer; l++) {
			for (uint32_t g = 0; g < mb->n_groups; g++) {
				const int32_t s = table[l * mb->n_groups + g];
				const struct hyb_mf_bundle *b = hyb_manifest_bundle(mf, l, g);

				if (s < 0)
					continue;
				CHECK((uint32_t)s < desc.n_slots);
				CHECK_MSG(!memcmp(base + (uint64_t)s * desc.slot_bytes,
						  hyb_model_box_addr(mb, b->pool, b->pool_off, b->bytes),
						  b->bytes),
					  "slot %d does not hold group %u of layer %u", s, g, l);
				n++;
			}
		}
		CHECK(n > 0);
		free(table);
	}
	hyb_mempool_close(pool);
	hyb_model_free(mb);
	hybd_stop(d, "test");
}

TEST(hybrid_box_one_app_per_cache)
{
	struct hyb_model *mb;
	struct hybd *d;

	start_hybd("hb1", "auto", third_of_groups(), &d);
	mb = hyb_model_load_manifest("hb1");
	CHECK_MSG(mb, "%s", hyb_last_error());
	{
		struct hyb_hybrid_params hyb = params(mb, HYB_POLICY_LRU, HYB_CACHE_HYBD);
		struct hyb_hybrid_params aut = params(mb, HYB_POLICY_LRU, HYB_CACHE_AUTO);
		struct hyb_hybrid_params own = params(mb, HYB_POLICY_LRU, HYB_CACHE_OWN);
		struct hyb_ctx *a = ctx_new(mb, &hyb, false), *b;
		struct hyb_hybrid_offload pl;

		b = ctx_try(mb, &hyb, false);
		CHECK_MSG(!b && strstr(hyb_last_error(), "in use by another app"), "%s",
			  hyb_last_error());
		b = ctx_new(mb, &aut, false);
		hyb_ctx_hybrid_offload(b, &pl);
		CHECK_MSG(!pl.cache_hybd && strstr(pl.cache_note, "own (not hybd's") &&
			  strstr(pl.cache_note, "in use"), "%s", pl.cache_note);
		CHECK_MSG(!run(b, mb, NULL), "%s", hyb_last_error());
		hyb_ctx_free(b);
		b = ctx_new(mb, &own, false);
		hyb_ctx_hybrid_offload(b, &pl);
		CHECK_MSG(!pl.cache_hybd && !strcmp(pl.cache_note, "own"), "%s", pl.cache_note);
		hyb_ctx_free(b);
		hyb_ctx_free(a);
		/* the first one gone, the cache is free again */
		b = ctx_new(mb, &hyb, false);
		hyb_ctx_hybrid_offload(b, &pl);
		CHECK(pl.cache_hybd);
		hyb_ctx_free(b);
		/* the layer policy (-ngl) on hybd's cache: whole layers as far as its slots go */
		{
			struct hyb_hybrid_params lay = params(mb, HYB_POLICY_LAYER, HYB_CACHE_HYBD);
			const uint32_t full = (uint32_t)atoi(third_of_groups()) / mb->n_groups;
			uint64_t resident, slots;

			b = ctx_new(mb, &lay, false);
			hyb_ctx_hybrid_offload(b, &pl);
			hyb_ctx_hybrid_cache(b, &resident, &slots);
			CHECK_MSG(pl.cache_hybd && slots == (uint64_t)full * mb->n_groups &&
				  pl.dense_layers_cpu == mb->hp.n_layer - full && full >= 1,
				  "%llu slots, %u layers dense on the CPU, %u whole layers",
				  (unsigned long long)slots, pl.dense_layers_cpu, full);
			CHECK_MSG(!run(b, mb, NULL), "%s", hyb_last_error());
			hyb_ctx_free(b);
		}
	}
	hyb_model_free(mb);
	hybd_stop(d, "test");
}

TEST(hybrid_box_refusals_and_hybd_gone)
{
	struct hyb_model *mf, *mb;
	struct hybd *d;

	/* a model from a file has no hybd cache */
	mf = hyb_model_load(hyb_test_plan());
	CHECK_MSG(mf, "%s", hyb_last_error());
	{
		struct hyb_hybrid_params hy = params(mf, HYB_POLICY_LRU, HYB_CACHE_HYBD);
		struct hyb_ctx *c = ctx_try(mf, &hy, false);

		CHECK_MSG(!c && strstr(hyb_last_error(), "not served by hybd"), "%s",
			  hyb_last_error());
	}
	/* slots too small for a group */
	start_hybd("hbt", "4096", "64", &d);
	mb = hyb_model_load_manifest("hbt");
	CHECK_MSG(mb, "%s", hyb_last_error());
	if (group_bytes(mb) > 4096) {
		struct hyb_hybrid_params hy = params(mb, HYB_POLICY_LRU, HYB_CACHE_HYBD);
		struct hyb_ctx *c = ctx_try(mb, &hy, false);

		CHECK_MSG(!c && strstr(hyb_last_error(), "4096-byte slots cannot hold a group") &&
			  strstr(hyb_last_error(), "slot_bytes = auto"), "%s", hyb_last_error());
	}
	hyb_model_free(mb);
	hybd_stop(d, "test");

	/* box mode: the groups get hybd's slots whatever the budget (here: 6 for a larger budget) */
	start_hybd("hbc", "auto", "6", &d);
	mb = hyb_model_load_manifest("hbc");
	CHECK_MSG(mb, "%s", hyb_last_error());
	{
		struct hyb_hybrid_params hy = params(mb, HYB_POLICY_LRU, HYB_CACHE_HYBD);
		struct hyb_ctx *c = ctx_new(mb, &hy, false);
		struct hyb_hybrid_offload pl;
		uint64_t resident, slots;

		hyb_ctx_hybrid_offload(c, &pl);
		hyb_ctx_hybrid_cache(c, &resident, &slots);
		CHECK_MSG(pl.cache_hybd && slots == 6 && strstr(pl.cache_note, "6 slots of"),
			  "%llu slots: %s", (unsigned long long)slots, pl.cache_note);
		CHECK_MSG(!run(c, mb, NULL), "%s", hyb_last_error());
		hyb_ctx_free(c);
	}
	hyb_model_free(mb);
	hybd_stop(d, "test");

	/* hybd goes away mid-run: the next load fails with one line, nothing crashes */
	start_hybd("hbg", "auto", "512", &d);
	mb = hyb_model_load_manifest("hbg");
	CHECK_MSG(mb, "%s", hyb_last_error());
	{
		struct hyb_hybrid_params hy = params(mb, HYB_POLICY_TAM_ADAPTIVE, HYB_CACHE_HYBD);
		struct hyb_ctx *c = ctx_new(mb, &hy, false);
		int rc;

		hybd_stop(d, "test");
		/* the first step's poll of the queue finds hybd gone */
		rc = run(c, mb, NULL);
		CHECK_MSG(rc < 0 && rc != -1 &&
			  strstr(hyb_last_error(), "reload queue 0: hybd went away"), "rc %d: %s",
			  rc, hyb_last_error());
		hyb_ctx_free(c);
	}
	hyb_model_free(mb);
	hyb_model_free(mf);
}

/* `hybctl stalls` output for instance name (text or --json), into buf. */
static void stalls_output(const char *name, bool json, char *buf, size_t len)
{
	char cmd[1200];
	size_t n;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "HYB_BACKEND=local HYB_STATE_DIR=%s %s stalls --name %s%s 2>&1",
		 hyb_test_tmpdir(), hyb_test_hybctl(), name, json ? " --json" : "");
	p = popen(cmd, "r");
	CHECK(p);
	n = fread(buf, 1, len - 1, p);
	buf[n] = 0;
	pclose(p);
}

/* What the app publishes for hybctl stalls, and hybctl showing it. */
TEST(hybrid_box_app_stats_for_hybctl_stalls)
{
	struct hyb_model *mb;
	struct hybd *d;
	struct hyb_app_stats a;
	char path[600], out[8192], want[96];

	start_hybd("hbp", "auto", third_of_groups(), &d);
	mb = hyb_model_load_manifest("hbp");
	CHECK_MSG(mb, "%s", hyb_last_error());
	snprintf(path, sizeof(path), "%s/hbp.app.%d", hyb_test_tmpdir(), (int)getpid());
	{
		struct hyb_hybrid_params hy = params(mb, HYB_POLICY_TAM_ADAPTIVE, HYB_CACHE_HYBD);
		struct hyb_ctx *c = ctx_new(mb, &hy, false);
		struct hyb_hybrid_stats st;

		CHECK(access(path, F_OK));	/* nothing before the first token */
		CHECK_MSG(!run(c, mb, NULL), "%s", hyb_last_error());
		hyb_ctx_hybrid_stats(c, &st);
		CHECK_MSG(!hyb_app_stats_read(path, &a), "%s", hyb_last_error());
		CHECK(a.pid == getpid() && a.n_layer == mb->hp.n_layer &&
		      !strcmp(a.policy, "tam-adaptive"));
		/* a whole decode step at least */
		CHECK_MSG(a.st.tokens >= 2 && a.st.tokens <= st.tokens && a.st.active > 0 &&
			  a.st.loads <= st.loads,
			  "file: %llu tokens, engine %llu", (unsigned long long)a.st.tokens,
			  (unsigned long long)st.tokens);
		/* layers 0, L/4, L/2, 3L/4, L-1 without repeats: 0, 1, 2 of 3 */
		CHECK_EQ_INT(a.n_lambda, 3);
		CHECK(a.lambda_layer[0] == 0 && a.lambda_layer[2] == 2 && a.lambda[0] > 0 &&
		      a.lambda[0] <= 1);
		stalls_output("hbp", false, out, sizeof(out));
		snprintf(want, sizeof(want), "%7d tam-adaptive", (int)getpid());
		CHECK_MSG(strstr(out, "hybrid apps on hbp's cache") && strstr(out, want) &&
			  strstr(out, "0=") && strstr(out, "LOADS/TOK"), "%s", out);
		stalls_output("hbp", true, out, sizeof(out));
		snprintf(want, sizeof(want), "\"apps\": [{\"pid\": %d, \"policy\": \"tam-adaptive\"",
			 (int)getpid());
		CHECK_MSG(strstr(out, want), "%s", out);
		hyb_ctx_free(c);
	}
	/* the app let go: its file is gone, and hybctl says there is none */
	CHECK(access(path, F_OK));
	stalls_output("hbp", false, out, sizeof(out));
	CHECK_MSG(strstr(out, "no box-mode hybrid app decodes on hbp's cache"), "%s", out);
	hyb_model_free(mb);
	hybd_stop(d, "test");
}

/* The app statistics reader on damaged files: a result or an error, never a crash. */
TEST(hybrid_box_app_stats_reader_takes_damage)
{
	struct hyb_app_stats a = { .pid = 77, .n_layer = 3, .time = 1.5 }, b;
	char path[600], *good = NULL;
	size_t len = 0;
	uint32_t rng = 12345;
	FILE *f;

	snprintf(a.policy, sizeof(a.policy), "lru");
	a.st.tokens = 9;
	a.st.cpu_ffn_s = 0.25;
	a.n_lambda = 2;
	a.lambda_layer[1] = 2;
	a.lambda[0] = 0.5;
	a.lambda[1] = 0.75;
	snprintf(path, sizeof(path), "%s/x.app.77", hyb_test_tmpdir());
	CHECK_MSG(!hyb_app_stats_write(path, &a), "%s", hyb_last_error());
	CHECK_MSG(!hyb_app_stats_read(path, &b), "%s", hyb_last_error());
	CHECK(b.pid == 77 && b.n_layer == 3 && !strcmp(b.policy, "lru") && b.st.tokens == 9 &&
	      b.st.cpu_ffn_s == 0.25 && b.n_lambda == 2 && b.lambda_layer[1] == 2 &&
	      b.lambda[1] == 0.75 && b.time == 1.5);
	f = fopen(path, "r");
	CHECK(f);
	good = malloc(4096);
	CHECK(good);
	len = fread(good, 1, 4096, f);
	fclose(f);
	CHECK_EQ_INT(hyb_app_stats_read("/nonexistent/x", &b), -ENOENT);
	for (int it = 0; it < 2000; it++) {
		char buf[4200];
		size_t n = len;
		int rc;

		memcpy(buf, good, len);
		for (int k = 0; k < 1 + it % 8; k++) {
			rng = rng * 1103515245u + 12345u;
			const size_t at = (rng >> 8) % (n ? n : 1);

			rng = rng * 1103515245u + 12345u;
			switch (rng % 4) {
			case 0: buf[at] = (char)(rng >> 16); break;      /* a byte changed */
			case 1: n = at; break;                           /* cut short */
			case 2: buf[at] = '\n'; break;                   /* a line split */
			default: memset(buf + at, 'x', n - at < 300 ? n - at : 300); /* a long token */
			}
		}
		f = fopen(path, "w");
		CHECK(f);
		fwrite(buf, 1, n, f);
		fclose(f);
		rc = hyb_app_stats_read(path, &b);
		CHECK(rc == 0 || rc == -EINVAL);
		CHECK(b.n_lambda <= HYB_APP_STATS_LAMBDAS && memchr(b.policy, 0, sizeof(b.policy)));
		CHECK(rc || b.pid > 0);
	}
	free(good);
}
