// SPDX-License-Identifier: MIT
/*
 * The hybrid engine's statistics (struct hyb_hybrid_stats, the balancer's
 * lambdas) for its context, and in box mode for `hybctl stalls` through
 * this app's statistics file (hyb/app_stats.h).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ffn_hybrid_internal.h"
#include "hyb/app_stats.h"

void hyb_ffn_hybrid_stats(const struct hyb_ffn_hybrid *h, struct hyb_hybrid_stats *out)
{
	*out = h->st;
}

void hyb_ffn_hybrid_stats_reset(struct hyb_ffn_hybrid *h)
{
	memset(&h->st, 0, sizeof(h->st));
}

void hyb_ffn_hybrid_stats_add(struct hyb_ffn_hybrid *h, double attn_s, double head_s)
{
	h->st.attn_s += attn_s;
	h->st.head_s += head_s;
}

double hyb_ffn_hybrid_lambda(const struct hyb_ffn_hybrid *h, uint32_t l)
{
	const enum hyb_policy p = hyb_balancer_policy(h->bal);

	if (l >= h->L || (p != HYB_POLICY_TAM && p != HYB_POLICY_TAM_ADAPTIVE))
		return NAN;
	return hyb_balancer_lambda(h->bal, l);
}

static double clock_s(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * Box mode: this app's statistics for `hybctl stalls`, at most twice a
 * second. A write that fails (a full state dir) is skipped: decoding goes
 * on, and the file keeps its last whole version.
 */
static void publish_stats(struct hyb_ffn_hybrid *h)
{
	const uint32_t pick[HYB_APP_STATS_LAMBDAS] = { 0, h->L / 4, h->L / 2, 3 * h->L / 4,
						      h->L - 1 };
	const double t = clock_s(CLOCK_MONOTONIC);
	struct hyb_app_stats a = { .pid = (int32_t)getpid(), .n_layer = h->L };

	/* the first once a decode step is whole (this call opens the next one) */
	if (!h->stats_path[0] || h->st.tokens < 2 || (h->stats_written && t - h->stats_t < 0.5))
		return;
	a.time = clock_s(CLOCK_REALTIME);
	a.st = h->st;
	snprintf(a.policy, sizeof(a.policy), "%s", hyb_policy_name(hyb_balancer_policy(h->bal)));
	for (int i = 0; i < HYB_APP_STATS_LAMBDAS; i++) {
		const double lam = hyb_ffn_hybrid_lambda(h, pick[i]);

		if (isnan(lam) || (a.n_lambda && a.lambda_layer[a.n_lambda - 1] == pick[i]))
			continue;
		a.lambda_layer[a.n_lambda] = pick[i];
		a.lambda[a.n_lambda++] = lam;
	}
	if (!hyb_app_stats_write(h->stats_path, &a))
		h->stats_written = true;
	h->stats_t = t;
}

void hyb_ffn_hybrid_begin_token(struct hyb_ffn_hybrid *h)
{
	h->st.tokens++;
	if (h->hc)
		publish_stats(h);
}
