// SPDX-License-Identifier: MIT
/*
 * UTF-8 at the tool's edges: text a model produced may stop inside a
 * character or hold stray byte tokens; chat templates, JSON and the
 * terminal want valid UTF-8 (cli.h).
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Length of the UTF-8 sequence a lead byte starts (0: not a lead byte). */
static size_t seq_len(unsigned char c)
{
	return c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
	       : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
}

size_t cli_utf8_tail(const char *s, size_t n)
{
	/* the last lead byte within 3 bytes of the end, and whether its sequence is cut */
	for (size_t k = 1; k <= 3 && k <= n; k++) {
		unsigned char c = (unsigned char)s[n - k];

		if ((c & 0xc0) == 0x80)
			continue;
		return seq_len(c) > k ? k : 0;
	}
	return 0;
}

char *cli_utf8_clean(const char *s, size_t n, size_t *len)
{
	char *out = malloc(3 * n + 1);
	size_t o = 0;

	if (!out)
		return NULL;
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)s[i];
		size_t len = seq_len(c);
		int ok = len && i + len <= n;
		uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;

		for (size_t k = 1; ok && k < len; k++) {
			ok = ((unsigned char)s[i + k] & 0xc0) == 0x80;
			cp = cp << 6 | ((unsigned char)s[i + k] & 0x3f);
		}
		/* overlong forms, surrogates and code points past U+10FFFF are invalid too */
		if (ok && len > 1)
			ok = cp >= (len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u) &&
			     cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
		if (ok) {
			memcpy(out + o, s + i, len);
			o += len;
			i += len;
		} else {
			memcpy(out + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	out[o] = 0;
	*len = o;
	return out;
}
