// SPDX-License-Identifier: MIT
/*
 * hyb serve's streamed-text rules (tools/hyb/serve_text.c): where a stop
 * string cuts the text, how much of a tail must wait because it may be the
 * start of one, UTF-8 sequences cut by a token boundary, and invalid bytes.
 */
#include <string.h>

#include "test.h"
#include "tools/hyb/serve.h"

TEST(serve_text_stop_strings)
{
	char *stop[] = { "abc", "\n\n" };
	size_t hold;

	/* no match: the tail that may start a stop string waits */
	CHECK_EQ_INT(serve_stop_find("xxab", 4, 0, stop, 2, &hold), 4);
	CHECK_EQ_INT(hold, 2);
	CHECK_EQ_INT(serve_stop_find("xxa", 3, 0, stop, 2, &hold), 3);
	CHECK_EQ_INT(hold, 1);
	CHECK_EQ_INT(serve_stop_find("xx\n", 3, 0, stop, 2, &hold), 3);
	CHECK_EQ_INT(hold, 1);
	CHECK_EQ_INT(serve_stop_find("xxy", 3, 0, stop, 2, &hold), 3);
	CHECK_EQ_INT(hold, 0);
	/* a match that the last token completed, looked for from where the text was */
	CHECK_EQ_INT(serve_stop_find("xxabc", 5, 4, stop, 2, &hold), 2);
	CHECK_EQ_INT(serve_stop_find("q\n\nabc", 6, 2, stop, 2, &hold), 1);
	/* the earliest of two */
	CHECK_EQ_INT(serve_stop_find("abc\n\n", 5, 0, stop, 2, &hold), 0);
	/* a match that ended before `from` was seen before: not looked for again */
	CHECK_EQ_INT(serve_stop_find("abcxx", 5, 4, stop, 2, &hold), 5);
	/* no stop strings: nothing held */
	CHECK_EQ_INT(serve_stop_find("xxab", 4, 0, stop, 0, &hold), 4);
	CHECK_EQ_INT(hold, 0);
}

TEST(serve_text_utf8)
{
	size_t len;
	char *s;

	/* "é" is C3 A9, "€" E2 82 AC, U+1F600 F0 9F 98 80 */
	CHECK_EQ_INT(cli_utf8_tail("ab", 2), 0);
	CHECK_EQ_INT(cli_utf8_tail("a\xc3", 2), 1);
	CHECK_EQ_INT(cli_utf8_tail("a\xc3\xa9", 3), 0);
	CHECK_EQ_INT(cli_utf8_tail("\xe2\x82", 2), 2);
	CHECK_EQ_INT(cli_utf8_tail("\xe2\x82\xac", 3), 0);
	CHECK_EQ_INT(cli_utf8_tail("x\xf0\x9f\x98", 4), 3);
	CHECK_EQ_INT(cli_utf8_tail("\xf0\x9f\x98\x80", 4), 0);
	/* a stray continuation byte is not a sequence to wait for */
	CHECK_EQ_INT(cli_utf8_tail("a\xa9", 2), 0);

	s = cli_utf8_clean("a\xc3\xa9\xe2\x82\xac", 6, &len);
	CHECK(s && len == 6 && !memcmp(s, "a\xc3\xa9\xe2\x82\xac", 6));
	free(s);
	/* invalid bytes, overlong forms and surrogates: one U+FFFD each; NULs kept */
	s = cli_utf8_clean("a\xff" "b\xc0\xaf" "c\xed\xa0\x80" "\0d", 11, &len);
	CHECK(s);
	CHECK_EQ_INT(len, 1 + 3 + 1 + 6 + 1 + 9 + 2);
	CHECK(!memcmp(s, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd" "c\xef\xbf\xbd\xef\xbf\xbd"
		      "\xef\xbf\xbd" "\0d", len));
	free(s);
	/* a sequence cut at the end */
	s = cli_utf8_clean("x\xe2\x82", 3, &len);
	CHECK(s && len == 7 && !memcmp(s, "x\xef\xbf\xbd\xef\xbf\xbd", 7));
	free(s);
}
