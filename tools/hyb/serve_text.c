// SPDX-License-Identifier: MIT
/*
 * hyb serve's text: a growable buffer, the UTF-8 boundaries streamed text is
 * cut at (tokens may end inside a character), and stop strings (a streamed
 * reply must not show the start of a stop string before it is known not to
 * be one).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

void sb_add(struct sbuf *b, const void *p, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *s;

		while (cap < b->len + n + 1)
			cap *= 2;
		s = realloc(b->s, cap);
		if (!s) {
			b->oom = true;
			return;
		}
		b->s = s;
		b->cap = cap;
	}
	memcpy(b->s + b->len, p, n);
	b->len += n;
	b->s[b->len] = 0;
}

void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	char small[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n < sizeof(small)) {
		sb_add(b, small, (size_t)n);
		return;
	}
	char *big = malloc((size_t)n + 1);

	if (!big) {
		b->oom = true;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	sb_add(b, big, (size_t)n);
	free(big);
}

void sb_free(struct sbuf *b)
{
	free(b->s);
	memset(b, 0, sizeof(*b));
}

/* Length of the UTF-8 sequence a lead byte starts (0: not a lead byte). */
static size_t seq_len(unsigned char c)
{
	return c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
	       : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
}

size_t serve_utf8_tail(const char *s, size_t n)
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

char *serve_utf8_clean(const char *s, size_t n, size_t *len)
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

size_t serve_stop_find(const char *text, size_t n, size_t from, char *const *stop,
		       size_t n_stop, size_t *hold)
{
	size_t best = n;

	*hold = 0;
	for (size_t i = 0; i < n_stop; i++) {
		size_t sl = strlen(stop[i]);
		/* a match ending at or after from starts at or after from - sl + 1 */
		size_t start = from >= sl ? from - sl + 1 : 0;
		const char *p;

		if (!sl)
			continue;
		if (start < n && (p = memmem(text + start, n - start, stop[i], sl)) &&
		    (size_t)(p - text) < best)
			best = (size_t)(p - text);
		/* the longest proper prefix of stop[i] that text ends with */
		for (size_t k = sl - 1 < n ? sl - 1 : n; k > *hold; k--)
			if (!memcmp(text + n - k, stop[i], k)) {
				*hold = k;
				break;
			}
	}
	return best;
}
