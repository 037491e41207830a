/* SPDX-License-Identifier: MIT */
/*
 * Text as an HTTP client of hyb serve sees it, for comparing it with what
 * `hyb run` prints: bytes that are not UTF-8 (a synthetic vocabulary's byte
 * tokens, which hyb run prints raw and the server sends as U+FFFD) and
 * U+FFFD itself become one '?' per run. Shared by tests/unit/test_serve.c
 * and the VM bench's tests/vm/hybbox.c. out: room for n + 1 bytes.
 */
#ifndef HYB_TEST_AS_SEEN_H
#define HYB_TEST_AS_SEEN_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

static inline void hyb_as_seen(const char *s, size_t n, char *out)
{
	size_t o = 0;
	bool bad_run = false;

	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)s[i];
		size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 :
			     (c & 0xf8) == 0xf0 ? 4 : 0;
		bool ok = len && i + len <= n;

		for (size_t k = 1; ok && k < len; k++)
			ok = ((unsigned char)s[i + k] & 0xc0) == 0x80;
		if (ok && !(len == 3 && !memcmp(s + i, "\xef\xbf\xbd", 3))) {
			memcpy(out + o, s + i, len);
			o += len;
			i += len;
			bad_run = false;
			continue;
		}
		if (!bad_run)
			out[o++] = '?';
		bad_run = true;
		i += ok ? len : 1;
	}
	out[o] = 0;
}

#endif
