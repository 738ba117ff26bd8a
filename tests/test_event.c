/* Tests of the event log (core/event.c): value quoting, lines that survive a
 * SIGKILL, two processes appending to one file, cutting of long lines, off. */
#include "core/event.h"

#include "core/err.h"
#include "tests/check.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256];

/* ---- a small logfmt reader, independent of event.c's writer */

#define MAXF 64
typedef struct {
    int n;
    char key[MAXF][64];
    char val[MAXF][4200]; /* unescaped */
} fields;

/* Parse one line (no newline) into key=value pairs; -1 when it is not
 * well-formed logfmt (a bare value with odd characters, an open quote,
 * a field without '=', a doubled space). */
static int parse(const char *line, fields *f)
{
    f->n = 0;
    const char *p = line;
    while (*p) {
        if (f->n == MAXF) return -1;
        const char *eq = strchr(p, '=');
        if (!eq || eq == p || eq - p >= 64) return -1;
        for (const char *q = p; q < eq; q++)
            if (*q == ' ' || *q == '"') return -1;
        memcpy(f->key[f->n], p, (size_t)(eq - p));
        f->key[f->n][eq - p] = 0;
        p = eq + 1;
        char *v = f->val[f->n];
        size_t n = 0;
        if (*p == '"') {
            p++;
            while (*p && *p != '"') {
                if (n + 1 >= sizeof f->val[0]) return -1;
                if (*p == '\\') {
                    p++;
                    if (*p == 'n') v[n++] = '\n';
                    else if (*p == 't') v[n++] = '\t';
                    else if (*p == 'r') v[n++] = '\r';
                    else if (*p == 'x' && p[1] && p[2]) {
                        char hex[3] = {p[1], p[2], 0};
                        v[n++] = (char)strtol(hex, NULL, 16);
                        p += 2;
                    } else if (*p == '"' || *p == '\\') v[n++] = *p;
                    else return -1;
                    p++;
                } else v[n++] = *p++;
            }
            if (*p != '"') return -1;
            p++;
        } else {
            while (*p && *p != ' ') {
                if (n + 1 >= sizeof f->val[0] || *p == '"' || *p == '=' || *p == '\\') return -1;
                v[n++] = *p++;
            }
            if (n == 0) return -1;
        }
        v[n] = 0;
        f->n++;
        if (*p == ' ') {
            p++;
            if (!*p || *p == ' ') return -1;
        } else if (*p) return -1;
    }
    return 0;
}

static const char *get(const fields *f, const char *key)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->key[i], key)) return f->val[i];
    return NULL;
}

/* The whole file; *n its length. */
static char *slurp(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        *n = 0;
        return NULL;
    }
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *b = dl_xmalloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, fp);
    b[*n] = 0;
    fclose(fp);
    return b;
}

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

/* ---- dl_event_str: bare when safe, quoted and escaped otherwise */

static void test_quoting(void)
{
    char b[128];
    CHECK_STR(dl_event_str("learner-3", b, sizeof b), "learner-3");
    CHECK_STR(dl_event_str("tcp://127.0.0.1:5555", b, sizeof b), "tcp://127.0.0.1:5555");
    CHECK_STR(dl_event_str("a.b_c+d/e:f-9", b, sizeof b), "a.b_c+d/e:f-9");
    CHECK_STR(dl_event_str("", b, sizeof b), "\"\"");
    CHECK_STR(dl_event_str(NULL, b, sizeof b), "\"\"");
    CHECK_STR(dl_event_str("two words", b, sizeof b), "\"two words\"");
    CHECK_STR(dl_event_str("k=v", b, sizeof b), "\"k=v\"");
    CHECK_STR(dl_event_str("say \"hi\"\\", b, sizeof b), "\"say \\\"hi\\\"\\\\\"");
    CHECK_STR(dl_event_str("line1\nline2\ttab\r", b, sizeof b), "\"line1\\nline2\\ttab\\r\"");
    CHECK_STR(dl_event_str("bell\a", b, sizeof b), "\"bell\\x07\"");
    CHECK_STR(dl_event_str("caf\xc3\xa9", b, sizeof b), "\"caf\xc3\xa9\"");
    /* too long for the buffer: cut, never inside an escape, quote closed */
    char small[8];
    CHECK_STR(dl_event_str("abcdefghij", small, sizeof small), "\"abcde\"");
    CHECK_STR(dl_event_str("ab\"cdef", small, 7), "\"ab\\\"\"");
    CHECK_STR(dl_event_str("abc\"def", small, 7), "\"abc\"");

    /* Every odd string round-trips through a written line and the reader. */
    char p[300];
    path_of(p, sizeof p, "quote.log");
    REQUIRE(dl_event_open(p, "test proc") == 0, "open %s: %s", p, dl_errmsg());
    CHECK(dl_event_enabled() == 1, "enabled after open");
    const char *odd[] = {"", " ", "a b", "\"", "\\", "x=y", "back\\slash \"quoted\"", "nl\nnl", "\x01\x1f\x7f",
                         "=", "trailing ", "caf\xc3\xa9"};
    int nodd = (int)(sizeof odd / sizeof odd[0]);
    for (int i = 0; i < nodd; i++) {
        char v[128];
        dl_event("odd", "i=%d s=%s n=%d", i, dl_event_str(odd[i], v, sizeof v), 7);
    }
    dl_event("nums", " a=%d b=%.17g c=%s", -12, 0.1, "bare"); /* a leading space is allowed */
    dl_event("nofields", "%s", "");
    dl_event_close();
    CHECK(dl_event_enabled() == 0, "off after close");
    dl_event_close(); /* safe twice */

    size_t n;
    char *all = slurp(p, &n);
    REQUIRE(all, "read %s", p);
    CHECK(n > 0 && all[n - 1] == '\n', "file ends with a newline");
    int line_no = 0;
    fields *f = dl_xmalloc(sizeof *f);
    for (char *save = NULL, *ln = strtok_r(all, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save), line_no++) {
        int ok = parse(ln, f) == 0;
        CHECK(ok, "line %d is not logfmt: %s", line_no, ln);
        if (!ok) continue;
        CHECK(f->n >= 4 && !strcmp(f->key[0], "ts") && !strcmp(f->key[1], "proc") && !strcmp(f->key[2], "pid") &&
                  !strcmp(f->key[3], "event"),
              "header ts proc pid event: %s", ln);
        CHECK_STR(get(f, "proc"), "test proc");
        CHECK_EQ(atol(get(f, "pid") ? get(f, "pid") : "0"), getpid());
        CHECK(atoll(get(f, "ts") ? get(f, "ts") : "0") > 1500000000LL * 1000000000LL, "ts is unix ns: %s", ln);
        if (line_no < nodd) {
            CHECK_STR(get(f, "event"), "odd");
            CHECK_EQ(atoi(get(f, "i") ? get(f, "i") : "-1"), line_no);
            CHECK_STR(get(f, "s"), odd[line_no]);
            CHECK_STR(get(f, "n"), "7");
        } else if (line_no == nodd) {
            CHECK_STR(get(f, "event"), "nums");
            CHECK_STR(get(f, "a"), "-12");
            CHECK(get(f, "b") && strtod(get(f, "b"), NULL) == 0.1, "b=%s round-trips 0.1", get(f, "b"));
            CHECK_STR(get(f, "c"), "bare");
        } else {
            CHECK_STR(get(f, "event"), "nofields");
            CHECK_EQ(f->n, 4);
        }
    }
    CHECK_EQ(line_no, nodd + 2);
    free(f);
    free(all);
}

/* ---- a line written by a child that is then SIGKILLed is in the file, whole */

static void test_sigkill(void)
{
    char p[300];
    path_of(p, sizeof p, "kill.log");
    int sync_pipe[2];
    REQUIRE(pipe(sync_pipe) == 0, "pipe");
    pid_t c = fork();
    REQUIRE(c >= 0, "fork");
    if (c == 0) {
        if (dl_event_open(p, "child")) _exit(2);
        for (int i = 0; i < 3; i++) dl_event("before_kill", "i=%d pad=%0600d", i, 0);
        char ok = 1;
        if (write(sync_pipe[1], &ok, 1) != 1) _exit(3);
        for (;;) pause(); /* no exit handlers, no flush: only SIGKILL ends this */
    }
    close(sync_pipe[1]);
    char got = 0;
    CHECK(read(sync_pipe[0], &got, 1) == 1, "child reported its events written");
    close(sync_pipe[0]);
    kill(c, SIGKILL);
    int st = 0;
    waitpid(c, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child died of SIGKILL (status %d)", st);

    size_t n;
    char *all = slurp(p, &n);
    REQUIRE(all, "read %s", p);
    CHECK(n > 0 && all[n - 1] == '\n', "last line complete");
    fields *f = dl_xmalloc(sizeof *f);
    int lines = 0;
    for (char *save = NULL, *ln = strtok_r(all, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save), lines++) {
        CHECK(parse(ln, f) == 0, "line %d: %s", lines, ln);
        CHECK_STR(get(f, "event"), "before_kill");
        CHECK_EQ(atol(get(f, "pid") ? get(f, "pid") : "0"), c);
        CHECK_EQ(strlen(get(f, "pad") ? get(f, "pad") : ""), 600);
    }
    CHECK_EQ(lines, 3);
    free(f);
    free(all);
}

/* ---- two processes appending to one file never interleave within a line */

#define NLINES 2000
#define PAD 1500 /* long lines make a torn write likely if writes were split */

static void writer(const char *p, char tag)
{
    if (dl_event_open(p, tag == 'a' ? "wa" : "wb")) _exit(2);
    static char pad[PAD + 1];
    memset(pad, tag, PAD);
    for (int i = 0; i < NLINES; i++) dl_event("w", "seq=%d pad=%s end=%c", i, pad, tag);
    dl_event_close();
    _exit(0);
}

static void test_two_writers(void)
{
    char p[300];
    path_of(p, sizeof p, "two.log");
    pid_t a = fork();
    REQUIRE(a >= 0, "fork");
    if (a == 0) writer(p, 'a');
    pid_t b = fork();
    REQUIRE(b >= 0, "fork");
    if (b == 0) writer(p, 'b');
    int sa = 0, sb = 0;
    waitpid(a, &sa, 0);
    waitpid(b, &sb, 0);
    CHECK(WIFEXITED(sa) && WEXITSTATUS(sa) == 0, "writer a status %d", sa);
    CHECK(WIFEXITED(sb) && WEXITSTATUS(sb) == 0, "writer b status %d", sb);

    size_t n;
    char *all = slurp(p, &n);
    REQUIRE(all, "read %s", p);
    CHECK(n > 0 && all[n - 1] == '\n', "ends with a newline");
    fields *f = dl_xmalloc(sizeof *f);
    int next[2] = {0, 0}, bad = 0, lines = 0;
    for (char *save = NULL, *ln = strtok_r(all, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save), lines++) {
        if (parse(ln, f) != 0 || !get(f, "end") || !get(f, "pad") || !get(f, "seq")) {
            if (bad++ < 3) CHECK(0, "torn or malformed line %d (%.80s...)", lines, ln);
            continue;
        }
        char tag = get(f, "end")[0];
        int k = tag == 'b';
        const char *pad = get(f, "pad");
        int pad_ok = strlen(pad) == PAD && strspn(pad, tag == 'a' ? "a" : "b") == PAD;
        long pid = atol(get(f, "pid"));
        if (!pad_ok || pid != (k ? b : a) || atoi(get(f, "seq")) != next[k]) {
            if (bad++ < 3) CHECK(0, "line %d mixes writers or skips: tag %c seq %s", lines, tag, get(f, "seq"));
            continue;
        }
        next[k]++;
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(lines, 2 * NLINES);
    CHECK_EQ(next[0], NLINES);
    CHECK_EQ(next[1], NLINES);
    free(f);
    free(all);
}

/* ---- a line over 4096 bytes is cut at the last whole field */

static void test_long_lines(void)
{
    char p[300];
    path_of(p, sizeof p, "long.log");
    REQUIRE(dl_event_open(p, "t") == 0, "open: %s", dl_errmsg());
    char *x = dl_xmalloc(3001), *y = dl_xmalloc(3001), *q = dl_xmalloc(5000);
    memset(x, 'x', 3000);
    x[3000] = 0;
    memset(y, 'y', 3000);
    y[3000] = 0;
    /* b fits, c would cross 4096: the line keeps a and b, drops c, marks it */
    dl_event("long1", "a=1 b=%s c=%s d=2", x, y);
    /* a quoted value with spaces that crosses the limit: the cut is before
     * it, never at one of its inner spaces */
    char *w = q;
    for (int i = 0; i < 1500; i++) w += sprintf(w, "w%d ", i % 10);
    char qv[4800];
    dl_event("long2", "a=1 q=%s z=3", dl_event_str(q, qv, sizeof qv));
    /* a first field longer than a line: only the header is left */
    char *big = dl_xmalloc(9000);
    memset(big, 'g', 8999);
    big[8999] = 0;
    dl_event("long3", "g=%s", big);
    dl_event("after", "ok=1");
    dl_event_close();

    size_t n;
    char *all = slurp(p, &n);
    REQUIRE(all, "read %s", p);
    fields *f = dl_xmalloc(sizeof *f);
    int lines = 0;
    for (char *save = NULL, *ln = strtok_r(all, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save), lines++) {
        CHECK(strlen(ln) + 1 <= 4096, "line %d is %zu bytes", lines, strlen(ln) + 1);
        int ok = parse(ln, f) == 0;
        CHECK(ok, "line %d not logfmt after cutting: %.100s", lines, ln);
        if (!ok) continue;
        if (lines == 0) {
            CHECK_STR(get(f, "event"), "long1");
            CHECK_STR(get(f, "a"), "1");
            CHECK_STR(get(f, "b"), x);
            CHECK(!get(f, "c") && !get(f, "d"), "fields past the cut are gone");
            CHECK_STR(get(f, "cut"), "1");
        } else if (lines == 1) {
            CHECK_STR(get(f, "event"), "long2");
            CHECK_STR(get(f, "a"), "1");
            CHECK(!get(f, "q") && !get(f, "z"), "the quoted field is dropped whole");
            CHECK_STR(get(f, "cut"), "1");
        } else if (lines == 2) {
            CHECK_STR(get(f, "event"), "long3");
            CHECK(!get(f, "g"), "an over-long first field is dropped");
            CHECK_STR(get(f, "cut"), "1");
        } else {
            CHECK_STR(get(f, "event"), "after");
            CHECK(!get(f, "cut"), "a short line is not marked");
        }
    }
    CHECK_EQ(lines, 4);
    free(f);
    free(all);
    free(x);
    free(y);
    free(q);
    free(big);
}

/* ---- off: path "" writes nothing, and reopening with "" closes the file */

static void test_off(void)
{
    char p[300];
    path_of(p, sizeof p, "off.log");
    CHECK(dl_event_open("", "t") == 0, "\"\" is accepted");
    CHECK(dl_event_enabled() == 0, "\"\" is off");
    dl_event("ignored", "a=1");
    CHECK(dl_event_open(NULL, "t") == 0, "NULL is accepted");
    CHECK(dl_event_enabled() == 0, "NULL is off");

    REQUIRE(dl_event_open(p, "t") == 0, "open: %s", dl_errmsg());
    dl_event("one", "a=1");
    CHECK(dl_event_open("", "t") == 0, "reopen off");
    dl_event("two", "a=2");
    dl_event_close();
    size_t n;
    char *all = slurp(p, &n);
    REQUIRE(all, "read %s", p);
    CHECK(strstr(all, "event=one") && !strstr(all, "event=two") && !strstr(all, "ignored"),
          "only the event written while on: %s", all);
    free(all);

    /* an unwritable path is an error with the reason, and leaves events off */
    char bad[300];
    path_of(bad, sizeof bad, "no-such-dir/x.log");
    int rc = dl_event_open(bad, "t");
    CHECK_EQ(rc, DL_EIO);
    CHECK(strstr(dl_errmsg(), "no-such-dir") != NULL, "message names the path: %s", dl_errmsg());
    CHECK(dl_event_enabled() == 0, "off after a failed open");
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s/dloco-test-event-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    REQUIRE(mkdtemp(dir), "mkdtemp %s", dir);
    test_quoting();
    test_sigkill();
    test_two_writers();
    test_long_lines();
    test_off();
    if (!failures) {
        const char *names[] = {"quote.log", "kill.log", "two.log", "long.log", "off.log"};
        for (int i = 0; i < 5; i++) {
            char p[300];
            path_of(p, sizeof p, names[i]);
            unlink(p);
        }
        rmdir(dir);
    } else printf("test_event: files kept in %s\n", dir);
    return CHECK_DONE("test_event");
}
