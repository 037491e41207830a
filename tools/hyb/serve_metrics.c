// SPDX-License-Identifier: MIT
/*
 * hyb serve's counters and GET /metrics in the Prometheus text format
 * (version 0.0.4): requests by route and status, tokens in and out, decode
 * speed, queue depth, requests in flight, rejections, cancellations, and a
 * histogram of the time to first token.
 */
#include <string.h>

#include "serve.h"

/* time to first token bucket bounds, seconds (the last bucket is +Inf) */
static const double ttft_le[SERVE_TTFT_BUCKETS] = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
						    1,    2.5,   5,    10,  30 };

void serve_metrics_init(struct serve_metrics *mt)
{
	memset(mt, 0, sizeof(*mt));
	pthread_mutex_init(&mt->lock, NULL);
}

void serve_metrics_request(struct serve_metrics *mt, const char *route, int status)
{
	int i;

	pthread_mutex_lock(&mt->lock);
	for (i = 0; i < mt->n_requests; i++)
		if (mt->requests[i].status == status && !strcmp(mt->requests[i].route, route))
			break;
	if (i == mt->n_requests && i < (int)(sizeof(mt->requests) / sizeof(mt->requests[0]))) {
		mt->requests[i].route = route;
		mt->requests[i].status = status;
		mt->n_requests++;
	}
	if (i < mt->n_requests)
		mt->requests[i].n++;
	pthread_mutex_unlock(&mt->lock);
}

void serve_metrics_ttft(struct serve_metrics *mt, double s)
{
	int b = 0;

	while (b < SERVE_TTFT_BUCKETS && s > ttft_le[b])
		b++;
	pthread_mutex_lock(&mt->lock);
	mt->ttft[b]++;
	mt->ttft_sum += s;
	mt->ttft_n++;
	pthread_mutex_unlock(&mt->lock);
}

static void counter(struct sbuf *b, const char *name, const char *help, const char *type)
{
	sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/*
 * Hybrid decoding's device (--gpu-budget): where the active neurons (a
 * plan's) or routed experts (a mixture's) ran - the neuron cache's hit
 * rate - its slots, loads and the host's stalls on it, and where the
 * attention rows of batched passes ran (docs/HYBRID.md).
 */
static void render_hybrid(struct sbuf *b, const struct hyb_hybrid_stats *hy, uint64_t resident,
			  uint64_t slots)
{
	const uint64_t dev = hy->active_dev + hy->seq_neurons_dev;
	const uint64_t cpu = hy->active - hy->active_dev + hy->seq_neurons_cpu;

	counter(b, "hyb_gpu_neurons_total",
		"Active neurons (or routed experts) computed, by where they ran.", "counter");
	sb_printf(b, "hyb_gpu_neurons_total{where=\"device\"} %llu\n", (unsigned long long)dev);
	sb_printf(b, "hyb_gpu_neurons_total{where=\"cpu\"} %llu\n", (unsigned long long)cpu);
	counter(b, "hyb_gpu_cache_hit_ratio",
		"Share of the active neurons (or experts) found in the device's cache.", "gauge");
	sb_printf(b, "hyb_gpu_cache_hit_ratio %.6f\n", dev + cpu ? (double)dev / (dev + cpu) : 0.0);
	counter(b, "hyb_gpu_cache_slots", "Slots of the device's cache.", "gauge");
	sb_printf(b, "hyb_gpu_cache_slots %llu\n", (unsigned long long)slots);
	counter(b, "hyb_gpu_cache_resident", "Slots holding a group (or expert).", "gauge");
	sb_printf(b, "hyb_gpu_cache_resident %llu\n", (unsigned long long)resident);
	counter(b, "hyb_gpu_cache_loads_total", "Groups (or experts) loaded into the cache.",
		"counter");
	sb_printf(b, "hyb_gpu_cache_loads_total %llu\n", (unsigned long long)hy->loads);
	counter(b, "hyb_gpu_cache_load_bytes_total", "Bytes those loads moved.", "counter");
	sb_printf(b, "hyb_gpu_cache_load_bytes_total %llu\n", (unsigned long long)hy->load_bytes);
	counter(b, "hyb_gpu_stall_seconds_total", "Host seconds waiting for the device at merges.",
		"counter");
	sb_printf(b, "hyb_gpu_stall_seconds_total %.6f\n", hy->stall_s);
	counter(b, "hyb_attention_rows_total",
		"Rows of batched passes attended in placed layers, by where (APEX).", "counter");
	sb_printf(b, "hyb_attention_rows_total{where=\"device\"} %llu\n",
		  (unsigned long long)hy->attn_rows_dev);
	sb_printf(b, "hyb_attention_rows_total{where=\"cpu\"} %llu\n",
		  (unsigned long long)hy->attn_rows_cpu);
}

void serve_metrics_render(struct serve_metrics *mt, struct serve_queue *q, struct sbuf *b)
{
	static const char *const why[] = { "none", "disconnect", "timeout", "shutdown" };
	struct serve_metrics s;
	int depth, running, batch = 0;
	uint64_t cum = 0, steps = 0;
	struct hyb_kv_stats kv = { 0 };
	struct hyb_hybrid_stats hy = { 0 };
	uint64_t resident = 0, slots = 0;
	bool hybrid = false;

	pthread_mutex_lock(&q->lock);
	depth = q->depth;
	running = q->running;
	for (int i = 0; i < q->n_slots; i++) {
		const struct serve_slot *sl = &q->slots[i];

		batch += sl->last_batch;
		steps += sl->steps;
		kv.blocks += sl->kv.blocks;
		kv.used += sl->kv.used;
		kv.kept += sl->kv.kept;
		kv.reserved += sl->kv.reserved;
		kv.block_pos = sl->kv.block_pos;
		if (sl->hybrid) {
			hybrid = true;
			hy.active += sl->hy.active;
			hy.active_dev += sl->hy.active_dev;
			hy.seq_neurons_dev += sl->hy.seq_neurons_dev;
			hy.seq_neurons_cpu += sl->hy.seq_neurons_cpu;
			hy.loads += sl->hy.loads;
			hy.load_bytes += sl->hy.load_bytes;
			hy.stall_s += sl->hy.stall_s;
			hy.attn_rows_dev += sl->hy.attn_rows_dev;
			hy.attn_rows_cpu += sl->hy.attn_rows_cpu;
			resident += sl->hy_resident;
			slots += sl->hy_slots;
		}
	}
	pthread_mutex_unlock(&q->lock);
	pthread_mutex_lock(&mt->lock);
	s = *mt;
	pthread_mutex_unlock(&mt->lock);

	counter(b, "hyb_requests_total", "HTTP requests answered, by route and status.", "counter");
	for (int i = 0; i < s.n_requests; i++)
		sb_printf(b, "hyb_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
			  s.requests[i].route, s.requests[i].status,
			  (unsigned long long)s.requests[i].n);
	counter(b, "hyb_prompt_tokens_total", "Prompt tokens of finished requests.", "counter");
	sb_printf(b, "hyb_prompt_tokens_total %llu\n", (unsigned long long)s.prompt_tokens);
	counter(b, "hyb_prompt_tokens_cached_total",
		"Of those, tokens the prefix cache gave without evaluating them.", "counter");
	sb_printf(b, "hyb_prompt_tokens_cached_total %llu\n", (unsigned long long)s.cached_tokens);
	counter(b, "hyb_completion_tokens_total", "Tokens generated.", "counter");
	sb_printf(b, "hyb_completion_tokens_total %llu\n", (unsigned long long)s.completion_tokens);
	counter(b, "hyb_prompt_seconds_total", "Seconds spent evaluating prompts.", "counter");
	sb_printf(b, "hyb_prompt_seconds_total %.6f\n", s.prompt_s);
	counter(b, "hyb_decode_seconds_total", "Seconds spent generating tokens.", "counter");
	sb_printf(b, "hyb_decode_seconds_total %.6f\n", s.decode_s);
	counter(b, "hyb_decode_tokens_per_second",
		"Generated tokens per second over all finished requests.", "gauge");
	sb_printf(b, "hyb_decode_tokens_per_second %.3f\n",
		  s.decode_s > 0 ? s.completion_tokens / s.decode_s : 0.0);
	counter(b, "hyb_last_decode_tokens_per_second",
		"Decode speed of the last finished request.", "gauge");
	sb_printf(b, "hyb_last_decode_tokens_per_second %.3f\n", s.last_tps);
	counter(b, "hyb_queue_depth", "Requests waiting for a decoding slot.", "gauge");
	sb_printf(b, "hyb_queue_depth %d\n", depth);
	counter(b, "hyb_requests_in_flight", "Requests being decoded now.", "gauge");
	sb_printf(b, "hyb_requests_in_flight %d\n", running);
	counter(b, "hyb_batch_size",
		"Requests in the last step's pass (all engines; 0 when idle).", "gauge");
	sb_printf(b, "hyb_batch_size %d\n", batch);
	counter(b, "hyb_steps_total", "Batched passes run.", "counter");
	sb_printf(b, "hyb_steps_total %llu\n", (unsigned long long)steps);
	counter(b, "hyb_slots", "Requests that may be decoded at once (--parallel).", "gauge");
	sb_printf(b, "hyb_slots %d\n", q->capacity);
	counter(b, "hyb_kv_blocks", "Blocks of the paged KV cache.", "gauge");
	sb_printf(b, "hyb_kv_blocks %u\n", kv.blocks);
	counter(b, "hyb_kv_block_positions", "Positions per KV block.", "gauge");
	sb_printf(b, "hyb_kv_block_positions %u\n", kv.block_pos);
	counter(b, "hyb_kv_blocks_used", "KV blocks holding positions of running requests.",
		"gauge");
	sb_printf(b, "hyb_kv_blocks_used %u\n", kv.used);
	counter(b, "hyb_kv_blocks_kept",
		"KV blocks only the prefix cache holds (taken back when needed).", "gauge");
	sb_printf(b, "hyb_kv_blocks_kept %u\n", kv.kept);
	counter(b, "hyb_kv_blocks_reserved",
		"KV blocks promised to running requests (prompt plus max_tokens).", "gauge");
	sb_printf(b, "hyb_kv_blocks_reserved %u\n", kv.reserved);
	if (hybrid)
		render_hybrid(b, &hy, resident, slots);
	counter(b, "hyb_requests_rejected_total", "Requests refused with 503: the queue was full.",
		"counter");
	sb_printf(b, "hyb_requests_rejected_total %llu\n", (unsigned long long)s.rejected);
	counter(b, "hyb_requests_cancelled_total", "Requests stopped before they finished.",
		"counter");
	for (int i = CANCEL_DISCONNECT; i <= CANCEL_SHUTDOWN; i++)
		sb_printf(b, "hyb_requests_cancelled_total{reason=\"%s\"} %llu\n", why[i],
			  (unsigned long long)s.cancelled[i]);
	counter(b, "hyb_time_to_first_token_seconds",
		"From a request's arrival to its first generated token.", "histogram");
	for (int i = 0; i <= SERVE_TTFT_BUCKETS; i++) {
		cum += s.ttft[i];
		if (i < SERVE_TTFT_BUCKETS)
			sb_printf(b, "hyb_time_to_first_token_seconds_bucket{le=\"%g\"} %llu\n",
				  ttft_le[i], (unsigned long long)cum);
		else
			sb_printf(b, "hyb_time_to_first_token_seconds_bucket{le=\"+Inf\"} %llu\n",
				  (unsigned long long)cum);
	}
	sb_printf(b, "hyb_time_to_first_token_seconds_sum %.6f\n", s.ttft_sum);
	sb_printf(b, "hyb_time_to_first_token_seconds_count %llu\n", (unsigned long long)s.ttft_n);
}
