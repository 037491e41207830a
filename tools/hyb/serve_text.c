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
