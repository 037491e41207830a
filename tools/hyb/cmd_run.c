// SPDX-License-Identifier: MIT
/* hyb run: stream generated text, then the prompt and decode speeds. */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "hyb/chat.h"
#include "hyb/generate.h"
#include "hyb/roofline.h"
#include "hyb/tokenizer.h"
#include "hyb/stream.h"

static const char usage[] =
	"usage: hyb run -m MODEL -p PROMPT [-n N] [-t THREADS] [-c CTX] [--temp T] [--top-k K]\n"
	"               [--top-p P] [--min-p P] [--repeat-penalty R] [--repeat-last-n N] [--seed S]\n"
	"               [--print-ids] [--dense | --sparse] [--load-first]\n"
	"               [--chat [--chat-template NAME] [--system TEXT]]\n"
	"       hyb run --manifest NAME|PATH -p PROMPT ...   (box mode: the model hybd serves)\n"
	"               [--gpu-budget BYTES|N%] [--policy P] [--device cpu|cuda] [--pcie-gbps G]\n"
	"               [--virtual-clock]\n"
	"               [--dense-cpu] [--prefill-cpu | --prompt-batch N] [--cache auto|own|hybd]\n"
	"               [--routing P]\n"
	"               [--no-prefetch] [--graph] [--thresholds off|expected|paper]\n"
	"  --chat: PROMPT is one user message in the model's chat template (its\n"
	"    tokenizer.chat_template); only the reply is printed, up to the end of its turn.\n"
	"    --chat-template NAME instead of the model's (chatml, llama3, gemma, ...: a\n"
	"    wrong name lists them); --system TEXT: a system message first. hyb chat: a\n"
	"    conversation.\n"
	"  --dense/--sparse: how a plan model (hybctl plan) decodes its FFNs (default sparse)\n"
	"  --load-first: read every weight before the prompt starts; by default the prompt\n"
	"    computes each layer as soon as its weights are in (a plain model)\n"
	"  --gpu-budget: decode a plan hybrid, its hot neuron groups in a device cache of this\n"
	"    size (K/M/G suffixes, or N% of the model) moved by policy P: static, layer, lru,\n"
	"    topk, dynamic, tam, tam-adaptive (default). --device cpu (default) is the\n"
	"    CPU-executed device with a modelled PCIe link; times are then modelled.\n"
	"    --virtual-clock: the host's time modelled too (from the rows its share reads),\n"
	"    not read off the wall: the time-driven policies decide the same on every run.\n"
	"    The budget holds the attention blocks (with their KV cache) and the head\n"
	"    first, then neuron groups; --dense-cpu keeps attention and head on the CPU.\n"
	"    --thresholds: load-aware thresholds (DynamicInfer; docs/BALANCER.md): cached\n"
	"    neurons scored just under the predictor's threshold run on the device, the\n"
	"    CPU's lowest-scored ones are skipped, within the one threshold's expected\n"
	"    error (expected, on by default for the dynamic policy) or its paper's (paper).\n"
	"    Prompts of 32 tokens and more run on the device in batches (attention, and\n"
	"    the FFN dense: cached groups in place, the others streamed through), as many\n"
	"    tokens a batch as fit in the neuron cache (borrowed for the prompt, its\n"
	"    groups reloaded after; at most 512), or --prompt-batch N; shorter prompts\n"
	"    token after token;\n"
	"    --prefill-cpu: prompts on the CPU alone.\n"
	"    A mixture-of-experts model keeps its hot routed experts in the budget\n"
	"    (docs/MOE.md, the expert cache); --routing P: the expert frequencies of a\n"
	"    routing profile (hybctl profile -o P) for the policy's placement. A moving\n"
	"    policy loads each layer's experts as the layer before predicts them (its\n"
	"    input through this layer's router); --no-prefetch: after the layer ran.\n"
	"    --graph: each decode step one device graph, the CPU's experts in its host\n"
	"    functions (every attention block, router and the head on the device).\n"
	"  --cache (box mode): hybd's: compute on the GPU cache hybd publishes and load\n"
	"    groups through its reload queue (hybctl stalls shows them); own: a cache of\n"
	"    this process; auto (default): hybd's when this app can use it, else own.\n"
	"    On hybd's cache --gpu-budget is this app's device memory (attention, head,\n"
	"    buffers) and the neuron groups get all of hybd's cache (its gpu_cache).\n";

struct stream {
	const struct hyb_tokenizer *tok;
	int32_t *ids; /* generated ids, for --print-ids */
	uint32_t n;
	double t_first; /* hyb_now() when the first generated token was printed */
	struct hyb_ctx *c;
};

static int print_token(void *arg, int32_t token)
{
	struct stream *s = arg;
	char piece[256];
	int n = hyb_token_to_piece(s->tok, token, piece, sizeof(piece));

	if (s->ids)
		s->ids[s->n++] = token;
	if (n > 0)
		fwrite(piece, 1, n < (int)sizeof(piece) ? n : (int)sizeof(piece), stdout);
	fflush(stdout);
	if (!s->t_first) {
		s->t_first = hyb_now();
		/* a PowerInfer file's prompt ran sparse too: count decode steps alone */
		hyb_ctx_sparse_stats_reset(s->c);
	}
	return 0;
}

int cmd_run(int argc, char **argv)
{
	struct cli_opts o = { .n_predict = 64, .stream_load = true };
	struct hyb_gen_stats st;
	struct hyb_model *m;
	struct hyb_ctx *c;
	struct hyb_sampler *s;
	struct stream out;
	int32_t *ids;
	int n_ids;

	cli_parse(argc, argv, &o, usage);
	if (!o.prompt)
		cli_die("no prompt given (-p PROMPT)");
	if (!o.chat && (o.chat_template || o.system))
		cli_die("--chat-template and --system are for --chat (or hyb chat)");
	double t_start = hyb_now(), t_load, t_setup;

	m = cli_load_model(&o);
	t_load = hyb_now() - t_start;
	if (o.chat) {
		struct hyb_chat_msg msgs[2] = { { "system", o.system }, { "user", o.prompt } };
		int tmpl = cli_chat_template(m, o.chat_template);
		char *text = cli_chat_format(tmpl, o.system ? msgs : msgs + 1, o.system ? 2 : 1,
					     true);

		if (!text)
			cli_die("%s", hyb_last_error());
		ids = cli_tokenize_chat(m, text, true, &n_ids);
		free(text);
	} else {
		ids = cli_tokenize(m, o.prompt, &n_ids);
	}
	if (!o.n_ctx)
		o.n_ctx = (uint32_t)(n_ids + o.n_predict) < m->hp.n_ctx_train ?
				  (uint32_t)(n_ids + o.n_predict) : m->hp.n_ctx_train;
	if ((uint32_t)(n_ids + o.n_predict) > o.n_ctx)
		cli_die("prompt (%d tokens) + %d to generate exceed the context of %u tokens",
			n_ids, o.n_predict, o.n_ctx);
	c = cli_new_ctx(m, &o);
	s = hyb_sampler_new(&o.sp, (int32_t)m->hp.n_vocab);
	if (!s)
		cli_die("%s", hyb_last_error());
	t_setup = hyb_now() - t_start - t_load;

	fprintf(stderr, "hyb: %s: %s, %u layers, embd %u, vocab %u; %s kernels; %s in %.2f s\n",
		o.model, m->hp.arch, m->hp.n_layer, m->hp.n_embd, m->hp.n_vocab,
		hyb_roofline_isa(), hyb_model_loading(m) ? "streaming, started" : "loaded",
		t_load);
	out.tok = m->tok;
	out.c = c;
	out.n = 0;
	out.t_first = 0;
	out.ids = o.print_ids ? malloc(sizeof(int32_t) * (o.n_predict + 1)) : NULL;
	/* a chat prints the reply alone; a plain prompt is continued, so it shows */
	if (!o.chat) {
		fputs(o.prompt, stdout);
		fflush(stdout);
	}
	if (hyb_generate(c, m, s, ids, (uint32_t)n_ids, (uint32_t)o.n_predict, print_token, &out,
			 &st))
		cli_die("%s", hyb_last_error());
	printf("\n");
	if (out.ids) {
		fprintf(stderr, "ids:");
		for (uint32_t i = 0; i < out.n; i++)
			fprintf(stderr, " %d", out.ids[i]);
		fprintf(stderr, "\n");
		free(out.ids);
	}
	fprintf(stderr, "\nprompt: %u tokens in %.3f s (%.2f tokens/s)\n", st.n_prompt,
		st.t_prompt, st.n_prompt / st.t_prompt);
	fprintf(stderr, "decode: %u tokens in %.3f s (%.2f tokens/s)\n", st.n_decode, st.t_gen,
		st.n_decode ? st.n_decode / st.t_gen : 0.0);
	/* Time to first token: from the start of `hyb run`'s work to the
	 * first generated token on stdout; "setup" is tokenizing and the context. */
	if (out.t_first)
		fprintf(stderr, "first token: %.3f s (load %.3f s, setup %.3f s, prompt %.3f s)\n",
			out.t_first - t_start, t_load, t_setup, st.t_prompt);
	if (m->stream) {
		/* the load returned with the header; the weights streamed behind the prompt */
		struct hyb_stream_stats ls;

		if (hyb_model_wait(m))
			cli_die("%s", hyb_last_error());
		hyb_model_load_stats(m, &ls);
		fprintf(stderr, "weights: %.0f MiB streamed in %.3f s (%.2f GB/s%s) behind the "
			"prompt\n", ls.bytes / 1048576.0, ls.ns / 1e9,
			ls.ns ? ls.bytes / (double)ls.ns : 0.0, ls.direct ? ", O_DIRECT" : ", cached");
	}
	cli_print_sparse(c, st.t_gen);
	cli_print_teal(c, m);
	cli_print_hybrid(c, st.t_gen);
	hyb_sampler_free(s);
	hyb_ctx_free(c);
	hyb_model_free(m);
	free(ids);
	return 0;
}
