/* Tests of the human log (core/log.c) and the events' echo on stderr
 * (core/event.c): logfmt lines with an RFC 3339 UTC ms timestamp, the level
 * filter, one line per call whatever the message holds, per-push events at
 * debug, and the --events file's format unchanged. */
#include "core/event.h"
#include "core/log.h"

#include "tests/check.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/test_log.XXXXXX";
static char errpath[300];

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return strdup("");
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return strdup(buf);
}

/* stderr from here on goes to a fresh file; returns what the last round wrote */
static char *round_trip(void)
{
    fflush(stderr);
    char *text = slurp(errpath);
    if (!freopen(errpath, "w", stderr)) abort();
    return text;
}

static int nlines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static int matches(const char *re, const char *s)
{
    regex_t r;
    if (regcomp(&r, re, REG_EXTENDED | REG_NEWLINE)) return 0;
    int ok = regexec(&r, s, 0, NULL, 0) == 0;
    regfree(&r);
    return ok;
}

int main(void)
{
    REQUIRE(mkdtemp(dir), "mkdtemp");
    snprintf(errpath, sizeof errpath, "%s/stderr", dir);
    free(round_trip());
    dl_log_set_name("sync");
    dl_log_set_level(DL_LOG_INFO);

    DL_INFO("store %s opened", "runs/a b");
    DL_DEBUG("not shown at info");
    DL_WARN("quote \" backslash \\ newline\nFAKE level=error tab\t end");
    char *t = round_trip();
    CHECK(nlines(t) == 2, "two lines (debug filtered, the newline escaped):\n%s", t);
    const char *ts = "ts=[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z";
    char re[400];
    snprintf(re, sizeof re, "^%s level=info proc=sync msg=\"store runs/a b opened\"$", ts);
    CHECK(matches(re, t), "info line:\n%s", t);
    snprintf(re, sizeof re, "^%s level=warn proc=sync msg=\"quote \\\\\" backslash \\\\\\\\ newline\\\\nFAKE "
                            "level=error tab\\\\t end\"$", ts);
    CHECK(matches(re, t), "escaped warn line:\n%s", t);
    CHECK(!matches("^FAKE", t), "no forged line");
    free(t);

    /* events: echoed at info (per-push ones at debug), file format as before */
    char evpath[300];
    snprintf(evpath, sizeof evpath, "%s/events.log", dir);
    REQUIRE(dl_event_open(evpath, "sync") == 0, "open events");
    dl_event("merge", "frag=%d version=%d", 2, 7);
    dl_event("push", "id=%s frag=%d", "l0", 1);
    dl_event("merge_contrib", "frag=%d", 2);
    dl_event("sync_start", "%s", "");
    t = round_trip();
    snprintf(re, sizeof re, "^%s level=info proc=sync event=merge frag=2 version=7$", ts);
    CHECK(matches(re, t), "merge echoed at info:\n%s", t);
    snprintf(re, sizeof re, "^%s level=info proc=sync event=sync_start$", ts);
    CHECK(matches(re, t), "an event without fields:\n%s", t);
    CHECK(!strstr(t, "event=push") && !strstr(t, "event=merge_contrib"), "per-push events hidden at info:\n%s", t);
    free(t);
    dl_log_set_level(DL_LOG_DEBUG);
    dl_event("push", "id=%s frag=%d", "l0", 1);
    t = round_trip();
    snprintf(re, sizeof re, "^%s level=debug proc=sync event=push id=l0 frag=1$", ts);
    CHECK(matches(re, t), "push echoed at debug:\n%s", t);
    free(t);
    /* the echo does not need a file */
    dl_event_close();
    dl_log_set_level(DL_LOG_INFO);
    dl_event("reload", "refused=0 changes=%d", 1);
    t = round_trip();
    CHECK(strstr(t, " event=reload refused=0 changes=1\n") != NULL, "echo without --events:\n%s", t);
    free(t);
    dl_log_set_level(DL_LOG_WARN);
    dl_event("reload", "refused=0 changes=%d", 2);
    t = round_trip();
    CHECK(t[0] == 0, "events filtered at warn: '%s'", t);
    free(t);
    char *ev = slurp(evpath);
    CHECK(nlines(ev) == 5, "five events in the file:\n%s", ev);
    CHECK(matches("^ts=[0-9]+ proc=sync pid=[0-9]+ event=merge frag=2 version=7$", ev), "file format kept:\n%s", ev);
    CHECK(matches("^ts=[0-9]+ proc=sync pid=[0-9]+ event=push id=l0 frag=1$", ev), "debug events still in the file");
    free(ev);

    char out[40];
    dl_log_rfc3339(1796141048206673734LL, out, sizeof out);
    CHECK(!strcmp(out, "2026-12-01T16:04:08.206Z"), "rfc3339: %s", out);
    dl_log_rfc3339(0, out, sizeof out);
    CHECK(!strcmp(out, "1970-01-01T00:00:00.000Z"), "rfc3339 of 0: %s", out);

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) printf("note: could not remove %s\n", dir);
    printf("test_log: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
