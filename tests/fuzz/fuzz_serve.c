// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for hyb serve's request parser (tools/hyb/serve_json.c):
 * any bytes as a completions body and as a chat body. An accepted request
 * must hold what the engine relies on (a chat's messages, counts and
 * ranges as documented in docs/SERVE.md), and every string it hands out is
 * touched end to end, so that AddressSanitizer sees any pointer past its
 * object; a refused one must say why. Either way the request is freed
 * (LeakSanitizer: nothing kept).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/chat.h"
#include "serve.h"

static volatile size_t sink;

static void touch(const char *s)
{
	if (s)
		sink += strlen(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	for (int chat = 0; chat < 2; chat++) {
		struct serve_request r;
		struct serve_err e;

		memset(&e, 0, sizeof(e));
		if (serve_json_parse((const char *)data, size, chat, "model", &r, &e)) {
			if (e.status < 400 || e.status > 599 || !e.message[0])
				abort();
			serve_request_free(&r);
			continue;
		}
		if (chat && !r.msgs)
			abort();
		for (size_t i = 0; i < r.n_msgs; i++) {
			touch(r.msgs[i].role);
			touch(r.msgs[i].content);
		}
		touch(r.prompt);
		for (uint32_t i = 0; i < r.n_prompt_ids; i++)
			sink += (size_t)r.prompt_ids[i];
		for (size_t i = 0; i < r.n_stop; i++)
			touch(r.stop[i]);
		if (r.n_stop > 4 || r.logprobs < -1 || r.logprobs > SERVE_MAX_TOP || (r.echo && chat))
			abort();
		serve_request_free(&r);
	}
	return 0;
}
