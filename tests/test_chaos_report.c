/* Tests of the chaos accounting and report (chaos/logfmt.c, chaos/account.c,
 * chaos/report.c): the event-line reader against core/event.c's writer and
 * hostile lines, then synthetic run directories whose buckets, ledger and
 * faults are computed by hand below, then the report of three runs. */
#define _GNU_SOURCE /* nftw */
#include "chaos/account.h"
#include "chaos/logfmt.h"
#include "chaos/report.h"

#include "core/err.h"
#include "core/event.h"
#include "tests/check.h"

#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

static int parse_str(const char *s, dl_logfmt_line *l) { return dl_logfmt_parse(s, strlen(s), l); }

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && st.st_size > 0;
}

/* ---- logfmt: one line */

static void test_parse(void)
{
    static dl_logfmt_line l;
    const char *s = "ts=123 proc=learner pid=5 event=x a=1 b=\"q \\\"x\\\" \\\\ \\n\\t\\r \\x41\" c=-2.5 d=nan "
                    "e=\"caf\xc3\xa9\" f=\"\" g=tcp://127.0.0.1:5555";
    REQUIRE(parse_str(s, &l) == 0, "parse: %s", dl_errmsg());
    CHECK_EQ(l.n, 11);
    CHECK_EQ(l.ts, 123);
    CHECK_STR(l.event, "x");
    CHECK_EQ(l.cut, 0);
    CHECK_STR(dl_logfmt_get(&l, "b"), "q \"x\" \\ \n\t\r A");
    CHECK_STR(dl_logfmt_get(&l, "e"), "caf\xc3\xa9");
    CHECK_STR(dl_logfmt_get(&l, "f"), "");
    CHECK_STR(dl_logfmt_get(&l, "g"), "tcp://127.0.0.1:5555");
    CHECK(dl_logfmt_get(&l, "zz") == NULL, "absent key");
    CHECK(dl_logfmt_get(&l, "pi") == NULL, "no prefix match");
    int64_t i = 7;
    uint64_t u = 7;
    double d = 0;
    CHECK(dl_logfmt_i64(&l, "a", &i) == 0 && i == 1, "i64 a");
    CHECK(dl_logfmt_i64(&l, "c", &i) == DL_EFORMAT && i == 1, "i64 of a float is EFORMAT, *out kept");
    CHECK(dl_logfmt_i64(&l, "zz", &i) == DL_ENOTFOUND, "i64 absent");
    CHECK(dl_logfmt_f64(&l, "c", &d) == 0 && d == -2.5, "f64 c");
    CHECK(dl_logfmt_f64(&l, "d", &d) == 0 && isnan(d), "f64 nan");
    CHECK(dl_logfmt_f64(&l, "g", &d) == DL_EFORMAT, "f64 of a string");
    CHECK(dl_logfmt_u64(&l, "a", &u) == 0 && u == 1, "u64 a");
    CHECK(dl_logfmt_u64(&l, "c", &u) == DL_EFORMAT, "u64 of a negative");
    CHECK_EQ(dl_logfmt_i64_or(&l, "zz", -9), -9);
    CHECK_NEAR(dl_logfmt_f64_or(&l, "b", 4.5), 4.5, 0);
    CHECK_STR(dl_logfmt_str_or(&l, "zz", "dflt"), "dflt");
    REQUIRE(parse_str("ts=1 proc=chaos pid=1 event=y big=99999999999999999999 neg=-1", &l) == 0, "parse big");
    CHECK(dl_logfmt_i64(&l, "big", &i) == DL_EFORMAT, "i64 overflow");
    CHECK(dl_logfmt_u64(&l, "neg", &u) == DL_EFORMAT, "u64 of -1");

    /* the harness's proc_start: its own pid= first, the child's after it */
    REQUIRE(parse_str("ts=5 proc=chaos pid=100 event=proc_start role=learner pid=1001", &l) == 0, "dup");
    CHECK_EQ(dl_logfmt_i64_or(&l, "pid", -1), 1001);
    REQUIRE(parse_str("ts=5 proc=sync pid=3 event=merge frag=1 cut=1", &l) == 0, "cut");
    CHECK_EQ(l.cut, 1);
    REQUIRE(parse_str("ts=5 proc=sync pid=3 event=merge cut=0", &l) == 0, "cut=0");
    CHECK_EQ(l.cut, 0);
    REQUIRE(parse_str("a=1", &l) == 0, "no ts");
    CHECK(l.ts == INT64_MIN && l.event == NULL, "no ts, no event");
    REQUIRE(parse_str("ts=x1 event=e", &l) == 0, "non-integer ts");
    CHECK(l.ts == INT64_MIN, "non-integer ts is INT64_MIN");

    const char *bad[] = {"",           "a=1  b=2",        "a=1 ",          "a=",        "=1",         "a",
                         "a=\"open",   "a=\"x\\q\"",      "a=\"\\x00\"",   "a=\"\\x4\"", "a=b\"c",     "a=\"x\"y",
                         "a=\"x\x01\"", "a= b",            "a-b=1",         " a=1",      "a=b\\c",     "a=\"x\\\"",
                         "a=x\x7f",    "a=1\tb=2"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int rc = parse_str(bad[k], &l);
        CHECK(rc == DL_EFORMAT && l.n == 0, "garbage #%zu \"%s\" parsed (rc %d)", k, bad[k], rc);
    }
    /* the bound is 4096 bytes without the newline */
    char *big = dl_xmalloc(DL_LOGFMT_LINE + 2);
    memset(big, 'x', DL_LOGFMT_LINE + 1);
    memcpy(big, "ts=1 event=e v=", 15);
    CHECK(dl_logfmt_parse(big, DL_LOGFMT_LINE, &l) == 0, "a line of exactly %d bytes", DL_LOGFMT_LINE);
    CHECK_EQ(strlen(dl_logfmt_get(&l, "v")), DL_LOGFMT_LINE - 15);
    CHECK(dl_logfmt_parse(big, DL_LOGFMT_LINE + 1, &l) == DL_ERANGE, "one byte more");
    free(big);
    /* many fields: the bound, then one more */
    char many[DL_LOGFMT_LINE];
    size_t o = 0;
    for (int k = 0; k < DL_LOGFMT_FIELDS + 1; k++) o += (size_t)snprintf(many + o, sizeof many - o, "%sk%d=1", k ? " " : "", k);
    CHECK(dl_logfmt_parse(many, o, &l) == DL_EFORMAT, "%d fields", DL_LOGFMT_FIELDS + 1);
    o = 0;
    for (int k = 0; k < DL_LOGFMT_FIELDS; k++) o += (size_t)snprintf(many + o, sizeof many - o, "%sk%d=1", k ? " " : "", k);
    CHECK(dl_logfmt_parse(many, o, &l) == 0 && l.n == DL_LOGFMT_FIELDS, "%d fields", DL_LOGFMT_FIELDS);
}

/* Every odd string the writer quotes comes back the same through the
 * iterator; a line the writer cuts comes back with cut=1. */
static void test_writer_roundtrip(void)
{
    char p[300];
    path_of(p, sizeof p, "roundtrip.log");
    REQUIRE(dl_event_open(p, "test") == 0, "open %s", p);
    const char *odd[] = {"", " ", "a b", "\"", "\\", "x=y", "nl\nnl\r\t", "\x01\x1f\x7f", "caf\xc3\xa9", "bare-1.0"};
    int nodd = (int)(sizeof odd / sizeof odd[0]);
    for (int k = 0; k < nodd; k++) {
        char q[128];
        dl_event("odd", "k=%d s=%s x=%.17g", k, dl_event_str(odd[k], q, sizeof q), 0.1 * k);
    }
    char longv[6000];
    memset(longv, 'y', sizeof longv - 1);
    longv[sizeof longv - 1] = 0;
    dl_event("long", "a=1 b=%s c=3", longv);
    dl_event_close();

    dl_logfmt_file *f = NULL;
    REQUIRE(dl_logfmt_open(p, &f) == 0, "open for reading");
    static dl_logfmt_line l;
    for (int k = 0; k < nodd; k++) {
        REQUIRE(dl_logfmt_next(f, &l) == 1, "line %d", k);
        CHECK_STR(l.event, "odd");
        CHECK_STR(dl_logfmt_get(&l, "proc"), "test");
        CHECK_EQ(dl_logfmt_i64_or(&l, "k", -1), k);
        CHECK_STR(dl_logfmt_get(&l, "s"), odd[k]);
        CHECK(dl_logfmt_f64_or(&l, "x", -1) == 0.1 * k, "%%.17g round-trips (%d)", k);
        CHECK(l.ts > 1000000000LL * 1000000000LL, "ts is unix ns");
    }
    REQUIRE(dl_logfmt_next(f, &l) == 1, "the cut line");
    CHECK_EQ(l.cut, 1);
    CHECK_EQ(dl_logfmt_i64_or(&l, "a", -1), 1);
    CHECK(dl_logfmt_get(&l, "b") == NULL, "the over-long field was cut");
    CHECK_EQ(dl_logfmt_next(f, &l), 0);
    const dl_logfmt_stats *st = dl_logfmt_file_stats(f);
    CHECK_EQ(st->events, nodd + 1);
    CHECK_EQ(st->cut, 1);
    CHECK_EQ(st->garbage + st->too_long + st->torn, 0);
    dl_logfmt_close(&f);
    dl_logfmt_close(&f);
    CHECK(f == NULL, "close twice");
    CHECK(dl_logfmt_open("/nonexistent/x.log", &f) == DL_ENOTFOUND && f == NULL, "absent file");
}

/* Garbage, an empty line, an over-long line, a NUL byte and a torn end. */
static void test_iterator(void)
{
    char p[300];
    path_of(p, sizeof p, "hostile.log");
    FILE *fp = fopen(p, "wb");
    REQUIRE(fp, "create");
    fputs("ts=1 proc=a pid=1 event=one\n", fp);
    fputs("not logfmt at all\n", fp);
    fputs("\n", fp);
    fputs("ts=2 proc=a pid=1 event=long v=", fp);
    for (int k = 0; k < 5000; k++) fputc('z', fp);
    fputc('\n', fp);
    static const char nul[] = "ts=3 proc=a pid=1 event=nul v=a\0b\n";
    fwrite(nul, 1, sizeof nul - 1, fp);
    fputs("ts=4 proc=a pid=1 event=two\n", fp);
    fputs("ts=5 proc=a pid=1 event=torn v=12", fp);
    fclose(fp);
    dl_logfmt_file *f = NULL;
    REQUIRE(dl_logfmt_open(p, &f) == 0, "open");
    static dl_logfmt_line l;
    REQUIRE(dl_logfmt_next(f, &l) == 1, "first");
    CHECK_STR(l.event, "one");
    CHECK_EQ(dl_logfmt_lineno(f), 1);
    REQUIRE(dl_logfmt_next(f, &l) == 1, "second");
    CHECK_STR(l.event, "two");
    CHECK_EQ(dl_logfmt_lineno(f), 6);
    CHECK_EQ(dl_logfmt_next(f, &l), 0);
    CHECK_EQ(dl_logfmt_next(f, &l), 0);
    const dl_logfmt_stats *st = dl_logfmt_file_stats(f);
    CHECK_EQ(st->lines, 7);
    CHECK_EQ(st->events, 2);
    CHECK_EQ(st->garbage, 3);
    CHECK_EQ(st->too_long, 1);
    CHECK_EQ(st->torn, 1);
    dl_logfmt_close(&f);
}

/* ---- synthetic run directories */

#define TS0 1700000000000000000LL

typedef struct {
    FILE *f;
    const char *proc;
} evf;

static evf ev_open(const char *run, const char *name, const char *proc)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", run, name);
    evf e = {fopen(p, "w"), proc};
    REQUIRE(e.f, "create %s", p);
    return e;
}

/* One event at t seconds after the run start from process pid. */
static void ev(evf *e, double t, long pid, const char *event, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void ev(evf *e, double t, long pid, const char *event, const char *fmt, ...)
{
    fprintf(e->f, "ts=%lld proc=%s pid=%ld event=%s", TS0 + llround(t * 1e9), e->proc, pid, event);
    if (fmt[0]) {
        fputc(' ', e->f);
        va_list ap;
        va_start(ap, fmt);
        vfprintf(e->f, fmt, ap);
        va_end(ap);
    }
    fputc('\n', e->f);
}

static void raw(evf *e, const char *s) { fputs(s, e->f); }

enum { LEDGER_BALANCED, LEDGER_STATES, LEDGER_POOLED, LEDGER_NONE };

/* The faulty run. Hand-computed results (checked in check_faulty):
 *
 * slot 0 a1 [0,100]: pid 1001 0..30 (ready 5, barrier 17..20), killed at 30,
 *   pid 1002 from 40 (ready 42) past the end. down 10, startup 5, recovery 2,
 *   idle 3, compute 80; merged compute_s 40+100+100 = 240 -> goodput 60;
 *   dropped_stale 20 -> 5; wasted 15. (A rejected push of 100 counts nowhere;
 *   a torn barrier_wait of 5 s at the file's end must not count.)
 * slot 1 a2 [0,100]: pid 2001 from 1 (ready 4; a barrier wait inside its
 *   start-up and one inside its hang count as those), hung 50..60. down 11,
 *   startup 3, compute 86; merged 60+80+60+80 = 280 -> 70; wasted 16.
 * slot 2 b1 [70,90] (joins, leaves): pid 3001 from 70 (ready 71). startup 1,
 *   compute 19; merged 140 -> 35 and dropped 20 -> 5 exceed 19: scaled by
 *   19/40 to 16.625 and 2.375, skew 21, wasted 0.
 * fleet: provisioned 220 = down 21 + startup 9 + recovery 2 + idle 3 +
 *   goodput 146.625 + dropped 7.375 + wasted 31; the 10 s that slot 1 was hung come off its merged
 *   compute (a stop inside a step inflates the pushes): goodput 136.625, wasted 41.
 * Wasted by cause (P = 4): a1's pid 1001 pushed fragments 0..3 at 25, 28, 29, 27 and was killed at 30:
 *   killed (5+2+1+3)/4 = 2.75; pid 1002 pushed all four at 99 (final), the slot ends at 100: unpushed 1;
 *   tokens 500 (1001's last step) + 1500 (1002's summary) = 2000, discarded 100 (1001's push_returned) +
 *   300 (1002's summary) = 400 fragment-tokens x 80 s / (4 x 2000) = 4; other 15 - 7.75 = 7.25.
 *   a2 never pushed (no push events): its four tails from ready 4 to 100 are 96 s, more than its wasted
 *   26: scaled to unpushed 26. b1's 19 s of tails scale to its wasted 0.
 * The synchronizer's view: a1 joined at 5 and again at 42 (its new process, must_fetch=1): 1 rejoin,
 *   1 refetch; refused: the nonfinite (rejected_other), a dropped_stale, a busy. a2 declared dead at 58
 *   (hung), rejoined at 61 without a fetch; refused: a norm. b1: one join, a dropped_stale, chunks out of
 *   order.
 * Goodput shares 0.6, 0.6, 0.83: median 0.6, nobody below half of it. */
static void gen_faulty(const char *run, int ledger)
{
    REQUIRE(mkdir(run, 0755) == 0, "mkdir %s", run);
    evf c = ev_open(run, "events-chaos.log", "chaos");
    const long H = 100; /* the harness's pid */
    ev(&c, 0, H, "run_start",
       "label=decoupled policy=decoupled baseline=0 scenario=unit seed=7 duration_s=100 fragments=4 slots=2 dcs=1 "
       "netns=0 eval_every_s=50");
    ev(&c, 0, H, "dc", "name=dc0 mode=relay bandwidth_mbit=100 rtt_ms=20 learners=2");
    ev(&c, 0, H, "proc_start", "role=sync slot=-1 id=sync child_pid=500 incarnation=0");
    ev(&c, 0, H, "slot_begin", "slot=0 id=a1 dc=dc0 speed=1 batch=8");
    ev(&c, 0, H, "proc_start", "role=learner slot=0 id=a1 child_pid=1001 incarnation=0");
    ev(&c, 0, H, "slot_begin", "slot=1 id=a2 dc=dc0 speed=0.5 batch=8");
    ev(&c, 1, H, "proc_start", "role=learner slot=1 id=a2 child_pid=2001 incarnation=0");
    ev(&c, 0, H, "state", "slot=0 id=a1 state=up");
    ev(&c, 0, H, "state", "slot=1 id=a2 state=up");
    ev(&c, 1, H, "link", "dc=dc0 up_bytes=1000 down_bytes=2000");
    ev(&c, 2, H, "link", "dc=dc0 up_bytes=3000 down_bytes=6000");
    ev(&c, 3, H, "link", "dc=dc0 up_bytes=6000 down_bytes=12000");
    ev(&c, 3.5, H, "progress", "note=\"a cut line\" cut=1");
    /* the first synchronizer exits by itself (cleanly: it writes a ledger) */
    ev(&c, 25, H, "proc_exit", "role=sync slot=-1 id=sync child_pid=500 incarnation=0 code=1 signal=0 expected=0");
    ev(&c, 26, H, "proc_start", "role=sync slot=-1 id=sync child_pid=501 incarnation=1");
    ev(&c, 30, H, "fault", "n=0 kind=learner_kill target=a1 phase=begin value=0 detail=\"pid=1001\"");
    ev(&c, 30, H, "proc_exit", "role=learner slot=0 id=a1 child_pid=1001 incarnation=0 code=-1 signal=9 expected=1");
    ev(&c, 30, H, "state", "slot=0 id=a1 state=dead");
    ev(&c, 40, H, "fault", "n=0 kind=learner_kill target=a1 phase=end value=0 detail=restarted");
    ev(&c, 40, H, "proc_start", "role=learner slot=0 id=a1 child_pid=1002 incarnation=1");
    ev(&c, 40, H, "state", "slot=0 id=a1 state=up");
    ev(&c, 45, H, "fault", "n=1 kind=sync_kill target=sync phase=begin value=0 detail=\"pid=501\"");
    ev(&c, 45, H, "proc_exit", "role=sync slot=-1 id=sync child_pid=501 incarnation=1 code=-1 signal=9 expected=1");
    ev(&c, 47, H, "fault", "n=1 kind=sync_kill target=sync phase=end value=0 detail=restarted");
    ev(&c, 47, H, "proc_start", "role=sync slot=-1 id=sync child_pid=502 incarnation=2");
    ev(&c, 50, H, "fault", "n=2 kind=learner_hang target=a2 phase=begin value=0 detail=\"pid=2001\"");
    ev(&c, 50, H, "state", "slot=1 id=a2 state=hung");
    ev(&c, 60, H, "fault", "n=2 kind=learner_hang target=a2 phase=end value=0 detail=\"\"");
    ev(&c, 60, H, "state", "slot=1 id=a2 state=up");
    /* fault 3 begins and never ends: missing */
    ev(&c, 65, H, "fault", "n=3 kind=partition target=dc0 phase=begin value=0 detail=\"relay holds every byte\"");
    ev(&c, 65, H, "state", "slot=0 id=a1 state=partitioned");
    ev(&c, 65, H, "state", "slot=1 id=a2 state=partitioned");
    ev(&c, 70, H, "state", "slot=0 id=a1 state=up");
    ev(&c, 70, H, "state", "slot=1 id=a2 state=up");
    ev(&c, 70, H, "slot_begin", "slot=2 id=b1 dc=dc0 speed=1 batch=8");
    ev(&c, 70, H, "proc_start", "role=learner slot=2 id=b1 child_pid=3001 incarnation=0");
    ev(&c, 70, H, "fault", "n=4 kind=learner_join target=b1 phase=instant value=0 detail=\"pid=3001\"");
    ev(&c, 70, H, "state", "slot=2 id=b1 state=up");
    /* fault 5 never happens: missing; fault 6 is skipped by the harness */
    ev(&c, 85, H, "fault", "n=6 kind=learner_kill target=a9 phase=skipped value=0 detail=\"a9 is not provisioned\"");
    ev(&c, 90, H, "slot_end", "slot=2 id=b1 reason=leave");
    ev(&c, 90, H, "fault", "n=7 kind=learner_leave target=b1 phase=instant value=0 detail=\"SIGTERM pid=3001\"");
    ev(&c, 90, H, "state", "slot=2 id=b1 state=left");
    ev(&c, 90.5, H, "proc_exit", "role=learner slot=2 id=b1 child_pid=3001 incarnation=0 code=0 signal=0 expected=1");
    ev(&c, 98, H, "fault", "n=8 kind=partition target=dc0 phase=begin value=0 detail=\"relay holds every byte\"");
    ev(&c, 98, H, "state", "slot=0 id=a1 state=partitioned");
    ev(&c, 98, H, "state", "slot=1 id=a2 state=partitioned");
    ev(&c, 50, H, "eval", "elapsed_s=50.000 merges=3 val_loss=4.000000");
    ev(&c, 100, H, "eval", "elapsed_s=100.000 merges=4 val_loss=3.500000");
    ev(&c, 100, H, "fault", "n=8 kind=partition target=dc0 phase=end value=0 detail=\"undone: the run ends\"");
    ev(&c, 100, H, "slot_end", "slot=0 id=a1 reason=run_end");
    ev(&c, 100, H, "slot_end", "slot=1 id=a2 reason=run_end");
    ev(&c, 100.5, H, "proc_exit", "role=learner slot=0 id=a1 child_pid=1002 incarnation=1 code=0 signal=0 expected=1");
    ev(&c, 100.5, H, "proc_exit", "role=learner slot=1 id=a2 child_pid=2001 incarnation=0 code=0 signal=0 expected=1");
    ev(&c, 102, H, "proc_exit", "role=sync slot=-1 id=sync child_pid=502 incarnation=2 code=0 signal=0 expected=1");
    ev(&c, 103, H, "eval", "elapsed_s=103.000 merges=5 val_loss=3.200000");
    ev(&c, 104, H, "check", "ok=1 detail=\"store ok: 5 versions\"");
    ev(&c, 104.5, H, "run_end", "wall_s=104.500 unplanned_exits=1");
    fclose(c.f);

    evf s = ev_open(run, "events-sync.log", "sync");
    ev(&s, 0.1, 500, "sync_start", "epoch=1 resumed=0 fragments=4");
    ev(&s, 10, 500, "merge", "frag=0 version=1 n=2 staleness_mean=0.000 share=1 norm=1 tokens=20 compute_s=100.000000 retries=0");
    ev(&s, 10, 500, "merge_contrib", "id=a1 frag=0 version=1 base=0 staleness=0 tokens=10 compute_s=40.000000 weight=0.5");
    ev(&s, 10, 500, "merge_contrib", "id=a2 frag=0 version=1 base=0 staleness=0 tokens=10 compute_s=60.000000 weight=0.5");
    ev(&s, 20, 500, "push", "id=a1 frag=1 base=0 steps=5 tokens=10 compute_s=100.000000 decision=rejected reason=\"nonfinite\"");
    ev(&s, 4, 500, "learner_join", "id=a2 device=cpu again=0 must_fetch=1 step=0 batch=8 auth=0");
    ev(&s, 5, 500, "learner_join", "id=a1 device=cpu again=0 must_fetch=1 step=0 batch=8 auth=0");
    ev(&s, 22, 500, "push", "id=a2 frag=1 base=0 steps=5 tokens=10 compute_s=80.000000 decision=pooled reason=\"\"");
    raw(&s, "hello world\n");
    if (ledger != LEDGER_NONE)
        ev(&s, 24.9, 500, "ledger",
           "applied=1000 dropped_stale=100 rejected=50 lost=0 discarded=20 outstanding=30 pooled=0 carried=0 "
           "processed=1200 overclaim=0 carried_in=0");
    ev(&s, 26.1, 501, "sync_start", "epoch=2 resumed=1 fragments=4");
    ev(&s, 33, 501, "push", "id=a1 frag=2 base=0 steps=5 tokens=10 compute_s=20.000000 decision=dropped_stale reason=\"\"");
    ev(&s, 35, 501, "merge", "frag=1 version=1 n=1 staleness_mean=1.000 share=1 norm=1 tokens=10 compute_s=80.000000 retries=0");
    ev(&s, 35, 501, "merge_contrib", "id=a2 frag=1 version=1 base=0 staleness=1 tokens=10 compute_s=80.000000 weight=1");
    ev(&s, 42, 501, "learner_join", "id=a1 device=cpu again=1 must_fetch=1 step=0 batch=8 auth=0");
    ev(&s, 44, 501, "push", "id=a1 frag=0 base=0 steps=5 tokens=10 compute_s=5.000000 decision=busy reason=\"commits are failing\"");
    ev(&s, 47.2, 502, "sync_start", "epoch=3 resumed=1 fragments=4");
    ev(&s, 58, 502, "learner_dead", "id=a2 silent_ms=8000");
    ev(&s, 61, 502, "learner_join", "id=a2 device=cpu again=1 must_fetch=0 step=90 batch=8 auth=0");
    ev(&s, 62, 502, "push", "id=a2 frag=2 base=0 steps=412 tokens=10 compute_s=5.000000 decision=rejected "
       "reason=\"norm 5.65 > 10 x median 0.555\"");
    ev(&s, 71, 502, "learner_join", "id=b1 device=cpu again=0 must_fetch=1 step=0 batch=8 auth=0");
    ev(&s, 55, 502, "merge", "frag=2 version=1 n=1 staleness_mean=2.000 share=1 norm=1 tokens=10 compute_s=100.000000 retries=0");
    ev(&s, 55, 502, "merge_contrib", "id=a1 frag=2 version=1 base=0 staleness=2 tokens=10 compute_s=100.000000 weight=1");
    ev(&s, 75, 502, "merge", "frag=3 version=1 n=3 staleness_mean=1.333 share=1 norm=1 tokens=30 compute_s=300.000000 retries=0");
    ev(&s, 75, 502, "merge_contrib", "id=a1 frag=3 version=1 base=0 staleness=0 tokens=10 compute_s=100.000000 weight=0.3");
    ev(&s, 75, 502, "merge_contrib", "id=a2 frag=3 version=1 base=0 staleness=1 tokens=10 compute_s=60.000000 weight=0.3");
    ev(&s, 75, 502, "merge_contrib", "id=b1 frag=3 version=1 base=0 staleness=3 tokens=10 compute_s=140.000000 weight=0.3");
    ev(&s, 80, 502, "push", "id=b1 frag=0 base=0 steps=5 tokens=10 compute_s=20.000000 decision=dropped_stale reason=\"\"");
    ev(&s, 82, 502, "push", "id=b1 frag=1 base=0 steps=5 tokens=10 compute_s=20.000000 decision=rejected "
       "reason=\"chunk at 2048, expected 1024: chunks must come in order\"");
    ev(&s, 81, 502, "push", "id=zz frag=0 base=0 steps=5 tokens=10 compute_s=8.000000 decision=dropped_stale reason=\"\"");
    /* the synchronizer's own periodic evaluation */
    ev(&s, 90, 502, "eval", "version=7 loss=3.400000 seqs=64");
    ev(&s, 99, 502, "eval", "version=9 loss=3.250000 seqs=64");
    /* the final flush: merged after the run's end, still counted */
    ev(&s, 101, 502, "merge", "frag=0 version=2 n=1 staleness_mean=0.000 share=1 norm=1 tokens=10 compute_s=80.000000 retries=0");
    ev(&s, 101, 502, "merge_contrib", "id=a2 frag=0 version=2 base=1 staleness=0 tokens=10 compute_s=80.000000 weight=1");
    if (ledger == LEDGER_BALANCED || ledger == LEDGER_STATES || ledger == LEDGER_POOLED)
        ev(&s, 101.9, 502, "ledger",
           "applied=%d dropped_stale=200 rejected=0 lost=300 discarded=100 outstanding=400 pooled=%d carried=0 "
           "processed=3900 overclaim=0 carried_in=100",
           ledger == LEDGER_STATES ? 2993 : 3000, ledger == LEDGER_POOLED ? 5 : 0);
    fclose(s.f);

    evf a1 = ev_open(run, "events-a1.log", "learner");
    ev(&a1, 0.2, 1001, "learner_start", "id=a1 mode=networked");
    ev(&a1, 5, 1001, "ready", "id=a1 fragments=4 fetched=4 h=10 wait_s=5.0");
    ev(&a1, 25, 1001, "push", "learner=a1 epoch=1 fragment=0 base_version=0 steps=5 tokens=10 final=0");
    ev(&a1, 28, 1001, "push", "learner=a1 epoch=1 fragment=1 base_version=0 steps=5 tokens=10 final=0");
    ev(&a1, 29, 1001, "push", "learner=a1 epoch=1 fragment=2 base_version=0 steps=5 tokens=10 final=0");
    ev(&a1, 26, 1001, "push", "learner=a1 epoch=1 fragment=3 base_version=0 steps=5 tokens=10 final=0");
    ev(&a1, 27, 1001, "push", "learner=a1 epoch=1 fragment=3 base_version=0 steps=5 tokens=10 final=0");
    ev(&a1, 27.5, 1001, "push_returned", "fragment=1 base_version=0 steps=5 tokens=10 discarded_tokens=100");
    ev(&a1, 29.5, 1001, "step", "id=a1 step=50 loss=3.1 tokens=500 pushes=5 coalesced=0");
    ev(&a1, 20, 1001, "barrier_wait", "id=a1 waited_ms=3000");
    raw(&a1, "not logfmt at all\n");
    ev(&a1, 41, 1002, "step", "id=a1 detail=\"bad \\q escape\"");
    raw(&a1, "ts=abc proc=learner pid=1002 event=ready id=a1\n");
    ev(&a1, 42, 1002, "ready", "id=a1 fragments=4 fetched=4 h=10 wait_s=2.0");
    ev(&a1, 43, 9999, "ready", "id=a1 stray=1");
    {
        char pad[5001];
        memset(pad, 'p', sizeof pad - 1);
        pad[sizeof pad - 1] = 0;
        ev(&a1, 44, 1002, "step", "id=a1 pad=%s", pad);
    }
    for (int p = 0; p < 4; p++)
        ev(&a1, 99, 1002, "push", "learner=a1 epoch=2 fragment=%d base_version=1 steps=5 tokens=10 final=1", p);
    ev(&a1, 100.4, 1002, "learner_summary", "id=a1 steps=150 tokens=1500 discarded_tokens=300");
    /* torn: no newline, so it is not believed (it would add 5 s of barrier) */
    fprintf(a1.f, "ts=%lld proc=learner pid=1002 event=barrier_wait id=a1 waited_ms=5000", TS0 + 60000000000LL);
    fclose(a1.f);

    evf a2 = ev_open(run, "events-a2.log", "learner");
    ev(&a2, 2, 2001, "barrier_wait", "id=a2 waited_ms=500");
    ev(&a2, 4, 2001, "ready", "id=a2 fragments=4 fetched=4 h=10 wait_s=3.0");
    ev(&a2, 55, 2001, "barrier_wait", "id=a2 waited_ms=2000");
    fclose(a2.f);

    evf b1 = ev_open(run, "events-b1.log", "learner");
    ev(&b1, 71, 3001, "ready", "id=b1 fragments=4 fetched=4 h=10 wait_s=1.0");
    ev(&b1, 80, 3001, "ready", "id=b1 again=1");
    fclose(b1.f);

    char p[600];
    snprintf(p, sizeof p, "%s/timeline.tsv", run);
    FILE *t = fopen(p, "w");
    REQUIRE(t, "timeline");
    fputs("n\tat_s\tkind\ttarget\tduration_s\tvalue\tsource\n"
          "0\t30.000\tlearner_kill\ta1\t10.000\t0\tscheduled:kill\n"
          "1\t45.000\tsync_kill\tsync\t2.000\t0\tscheduled:skill\n"
          "2\t50.000\tlearner_hang\ta2\t10.000\t0\tscheduled:hang\n"
          "3\t65.000\tpartition\tdc0\t5.000\t0\tscheduled:part\n"
          "4\t70.000\tlearner_join\tb1\t0.000\t0\tscheduled:join\n"
          "5\t80.000\tdelay\tdc0\t5.000\t50\trandom:delay\n"
          "6\t85.000\tlearner_kill\ta9\t5.000\t0\trandom:kill\n"
          "7\t90.000\tlearner_leave\tb1\t0.000\t0\tscheduled:leave\n"
          "8\t98.000\tpartition\tdc0\t10.000\t0\tscheduled:part\n"
          "9\t120.000\tbandwidth\tdc0\t10.000\t1\tscheduled:bw\n",
          t);
    fclose(t);
}

/* The failure-free twin: two learners, one merge, a balanced ledger. With
 * low, a2's merged compute is 20 s instead of 200 (goodput 5 s: 5% against
 * a1's 50%) and the run has a check.out with the store's ledger. */
static void gen_baseline(const char *run, int low)
{
    REQUIRE(mkdir(run, 0755) == 0, "mkdir %s", run);
    evf c = ev_open(run, "events-chaos.log", "chaos");
    ev(&c, 0, 100, "run_start",
       "label=decoupled-baseline policy=decoupled baseline=1 scenario=unit seed=7 duration_s=100 fragments=4 slots=2 "
       "dcs=1 netns=0 eval_every_s=50");
    ev(&c, 0, 100, "proc_start", "role=sync slot=-1 id=sync child_pid=600 incarnation=0");
    for (int i = 0; i < 2; i++) {
        ev(&c, 0, 100, "slot_begin", "slot=%d id=a%d dc=dc0 speed=1 batch=8", i, i + 1);
        ev(&c, 0, 100, "proc_start", "role=learner slot=%d id=a%d child_pid=%d incarnation=0", i, i + 1, 1100 + i);
        ev(&c, 0, 100, "state", "slot=%d id=a%d state=up", i, i + 1);
    }
    ev(&c, 100, 100, "slot_end", "slot=0 id=a1 reason=run_end");
    ev(&c, 100, 100, "slot_end", "slot=1 id=a2 reason=run_end");
    ev(&c, 101, 100, "eval", "elapsed_s=101.000 merges=1 val_loss=3.000000");
    ev(&c, 102, 100, "check", "ok=1 detail=ok");
    ev(&c, 103, 100, "run_end", "wall_s=103.000 unplanned_exits=0");
    fclose(c.f);
    evf s = ev_open(run, "events-sync.log", "sync");
    ev(&s, 50, 600, "merge", "frag=0 version=1 n=2 staleness_mean=0 share=1 norm=1 tokens=20 compute_s=400 retries=0");
    ev(&s, 50, 600, "merge_contrib", "id=a1 frag=0 version=1 base=0 staleness=0 tokens=10 compute_s=200 weight=0.5");
    ev(&s, 50, 600, "merge_contrib", "id=a2 frag=0 version=1 base=0 staleness=0 tokens=10 compute_s=%d weight=0.5",
       low ? 20 : 200);
    ev(&s, 101, 600, "ledger",
       "applied=80 dropped_stale=0 rejected=0 lost=0 discarded=0 outstanding=20 pooled=0 carried=0 processed=100 "
       "overclaim=0 carried_in=0");
    fclose(s.f);
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "events-a%d.log", i + 1);
        evf l = ev_open(run, name, "learner");
        ev(&l, 2, 1100 + i, "ready", "id=a%d", i + 1);
        fclose(l.f);
    }
    char p[600];
    snprintf(p, sizeof p, "%s/timeline.tsv", run);
    FILE *t = fopen(p, "w");
    REQUIRE(t, "timeline");
    fputs("n\tat_s\tkind\ttarget\tduration_s\tvalue\tsource\n", t);
    fclose(t);
    if (!low) return;
    snprintf(p, sizeof p, "%s/check.out", run);
    t = fopen(p, "w");
    REQUIRE(t, "check.out");
    /* storage/store_check.c's report */
    fputs("dloco store check: /x/store\n"
          "  schema 3, run 'r', fingerprint 0123456789abcdef, epoch 2, 4 fragments (8 blocks), 1 merge records, 2 "
          "learners\n"
          "  ledger fragment-tokens: applied 90, dropped_stale 4, rejected 3, lost 2, discarded 1, outstanding 20\n"
          "  result: OK\n",
          t);
    fclose(t);
}

static int has_note(const dl_account *a, const char *part)
{
    for (int i = 0; i < a->n_notes; i++)
        if (strstr(a->notes[i], part)) return 1;
    return 0;
}

static void check_time_sums(const dl_account_time *t, const char *who)
{
    double s = 0, secs = 0;
    for (int b = 0; b < DL_ACCT_NBUCKETS; b++) s += t->frac[b], secs += t->bucket_s[b];
    CHECK(fabs(s - 1.0) <= 1e-9, "%s: fractions sum to %.17g", who, s);
    CHECK(fabs(secs - t->provisioned_s) <= 1e-9 * t->provisioned_s, "%s: seconds sum to %.17g of %.17g", who, secs,
          t->provisioned_s);
}

static void check_faulty(const dl_account *a)
{
    const double tol = 1e-6;
    CHECK_STR(a->label, "decoupled");
    CHECK_STR(a->scenario, "unit");
    CHECK_STR(a->seed, "7");
    CHECK_EQ(a->fragments, 4);
    CHECK_EQ(a->netns, 0);
    CHECK_NEAR(a->duration_s, 100, 0);
    CHECK_NEAR(a->end_s, 104.5, tol);
    CHECK_NEAR(a->wall_s, 104.5, tol);
    REQUIRE(a->n_slots == 3, "3 slots, got %d", a->n_slots);

    const dl_account_slot *s0 = &a->slots[0], *s1 = &a->slots[1], *s2 = &a->slots[2];
    CHECK_STR(s0->id, "a1");
    CHECK_STR(s1->dc, "dc0");
    CHECK_NEAR(s1->speed, 0.5, 0);
    CHECK_STR(s2->id, "b1");
    CHECK_STR(s2->end_reason, "leave");
    CHECK_STR(s0->end_reason, "run_end");
    CHECK_EQ(s0->incarnations, 2);
    CHECK_EQ(s0->killed, 1);
    CHECK_EQ(s1->incarnations, 1);
    CHECK_EQ(s1->killed, 0);

    const dl_account_time *t0 = &s0->time, *t1 = &s1->time, *t2 = &s2->time, *f = &a->fleet;
    CHECK_NEAR(t0->provisioned_s, 100, tol);
    CHECK_NEAR(t0->bucket_s[DL_ACCT_DOWN], 10, tol);
    CHECK_NEAR(t0->bucket_s[DL_ACCT_STARTUP], 5, tol);
    CHECK_NEAR(t0->bucket_s[DL_ACCT_RECOVERY], 2, tol);
    CHECK_NEAR(t0->bucket_s[DL_ACCT_IDLE_BARRIER], 3, tol);
    CHECK_NEAR(t0->compute_s, 80, tol);
    CHECK_NEAR(t0->bucket_s[DL_ACCT_GOODPUT], 60, tol);
    CHECK_NEAR(t0->bucket_s[DL_ACCT_DROPPED_STALE], 5, tol);
    CHECK_NEAR(t0->bucket_s[DL_ACCT_WASTED], 15, tol);
    CHECK_NEAR(t0->skew_s, 0, tol);
    CHECK_NEAR(t0->availability_bound, 0.9, tol);
    CHECK_NEAR(t0->frac[DL_ACCT_GOODPUT], 0.6, tol);
    CHECK_NEAR(t0->goodput_over_bound, 0.6 / 0.9, tol);

    CHECK_NEAR(t1->provisioned_s, 100, tol);
    CHECK_NEAR(t1->bucket_s[DL_ACCT_DOWN], 11, tol);
    CHECK_NEAR(t1->bucket_s[DL_ACCT_STARTUP], 3, tol);
    CHECK_NEAR(t1->bucket_s[DL_ACCT_RECOVERY], 0, tol);
    CHECK_NEAR(t1->bucket_s[DL_ACCT_IDLE_BARRIER], 0, tol);
    CHECK_NEAR(t1->bucket_s[DL_ACCT_GOODPUT], 60, tol); /* 70 merged, less its 10 s hung */
    CHECK_NEAR(t1->hang_credit_s, 10, tol);
    CHECK_NEAR(t1->bucket_s[DL_ACCT_DROPPED_STALE], 0, tol);
    CHECK_NEAR(t1->bucket_s[DL_ACCT_WASTED], 26, tol);

    CHECK_NEAR(t2->provisioned_s, 20, tol);
    CHECK_NEAR(t2->bucket_s[DL_ACCT_DOWN], 0, tol);
    CHECK_NEAR(t2->bucket_s[DL_ACCT_STARTUP], 1, tol);
    CHECK_NEAR(t2->compute_s, 19, tol);
    CHECK_NEAR(t2->bucket_s[DL_ACCT_GOODPUT], 35.0 * 19 / 40, tol);
    CHECK_NEAR(t2->bucket_s[DL_ACCT_DROPPED_STALE], 5.0 * 19 / 40, tol);
    CHECK_NEAR(t2->bucket_s[DL_ACCT_WASTED], 0, tol);
    CHECK_NEAR(t2->skew_s, 21, tol);
    CHECK(has_note(a, "slot 2 (b1): goodput + dropped_stale exceed"), "the skew is a note");

    CHECK_NEAR(f->provisioned_s, 220, tol);
    CHECK_NEAR(f->bucket_s[DL_ACCT_DOWN], 21, tol);
    CHECK_NEAR(f->bucket_s[DL_ACCT_STARTUP], 9, tol);
    CHECK_NEAR(f->bucket_s[DL_ACCT_RECOVERY], 2, tol);
    CHECK_NEAR(f->bucket_s[DL_ACCT_IDLE_BARRIER], 3, tol);
    CHECK_NEAR(f->bucket_s[DL_ACCT_GOODPUT], 136.625, tol);
    CHECK_NEAR(f->hang_credit_s, 10, tol);
    CHECK_NEAR(f->bucket_s[DL_ACCT_DROPPED_STALE], 7.375, tol);
    CHECK_NEAR(f->bucket_s[DL_ACCT_WASTED], 41, tol);
    CHECK_NEAR(f->compute_s, 185, tol);
    CHECK_NEAR(f->skew_s, 21, tol);
    CHECK_NEAR(f->frac[DL_ACCT_GOODPUT], 136.625 / 220, tol);
    CHECK_NEAR(f->frac[DL_ACCT_DOWN], 21.0 / 220, tol);
    CHECK_NEAR(f->frac[DL_ACCT_WASTED], 41.0 / 220, tol);
    CHECK_NEAR(f->availability_bound, 199.0 / 220, tol);
    CHECK_NEAR(f->goodput_over_bound, 136.625 / 199.0, tol);
    CHECK_NEAR(a->unattributed_s, 2, tol);
    check_time_sums(t0, "slot 0");
    check_time_sums(t1, "slot 1");
    check_time_sums(t2, "slot 2");
    check_time_sums(f, "fleet");

    /* states, sorted, with the partition and the leave */
    REQUIRE(s0->n_states == 6, "a1 states: %d", s0->n_states);
    CHECK_EQ(s0->states[1].state, DL_ACCT_DEAD);
    CHECK_NEAR(s0->states[1].t_s, 30, tol);
    CHECK_EQ(s0->states[3].state, DL_ACCT_PARTITIONED);
    CHECK_EQ(s2->states[s2->n_states - 1].state, DL_ACCT_LEFT);

    /* merges: sorted, liveness and the goodput series */
    REQUIRE(a->merges == 5, "merges %d", a->merges);
    const int alive[5] = {2, 1, 1, 3, 0}, n[5] = {2, 1, 1, 3, 1}, in_run[5] = {1, 1, 1, 1, 0};
    const double gp[5] = {25.0 / 20, 45.0 / 70, 70.0 / 110, 145.0 / 155, 165.0 / 220};
    for (int m = 0; m < 5; m++) {
        CHECK_EQ(a->merge[m].alive, alive[m]);
        CHECK_EQ(a->merge[m].n, n[m]);
        CHECK_EQ(a->merge[m].in_run, in_run[m]);
        CHECK_NEAR(a->merge[m].goodput, gp[m], tol);
    }
    CHECK_NEAR(a->mean_alive, 1.75, tol);
    CHECK_NEAR(a->mean_participation, 1.75, tol);
    CHECK_EQ(a->contributions, 8);
    CHECK_EQ(a->staleness_hist[0], 4);
    CHECK_EQ(a->staleness_hist[1], 2);
    CHECK_EQ(a->staleness_hist[2], 1);
    CHECK_EQ(a->staleness_hist[3], 1);
    CHECK_EQ(a->staleness_hist[4], 0);
    CHECK_NEAR(a->staleness_mean, 7.0 / 8, tol);

    /* the quality series */
    REQUIRE(a->n_evals == 3, "evals %d", a->n_evals);
    CHECK_NEAR(a->evals[0].elapsed_s, 50, tol);
    CHECK_EQ(a->evals[1].merges, 4);
    CHECK_NEAR(a->final_val_loss, 3.2, tol);
    REQUIRE(a->n_sync_evals == 2, "sync evals %d", a->n_sync_evals);
    CHECK_NEAR(a->sync_evals[0].t_s, 90, tol);
    CHECK_EQ(a->sync_evals[1].version, 9);
    CHECK_EQ(a->sync_evals[1].seqs, 64);
    CHECK_NEAR(a->final_sync_val_loss, 3.25, tol);
    CHECK_EQ(a->check_ok, 1);
    CHECK_STR(a->check_detail, "store ok: 5 versions");
    CHECK_EQ(a->unplanned_exits, 1);

    /* links */
    REQUIRE(a->n_links == 1, "links %d", a->n_links);
    const dl_account_link *k = &a->links[0];
    CHECK_STR(k->name, "dc0");
    CHECK_STR(k->mode, "relay");
    CHECK_NEAR(k->bandwidth_mbit, 100, 0);
    CHECK_EQ(k->n_samples, 3);
    CHECK_NEAR(k->up_bytes, 6000, 0);
    CHECK_NEAR(k->down_bytes, 12000, 0);
    CHECK_NEAR(k->mean_up_Bps, 2500, tol);
    CHECK_NEAR(k->mean_down_Bps, 5000, tol);
    CHECK_NEAR(k->peak_up_Bps, 3000, tol);
    CHECK_NEAR(k->peak_down_Bps, 6000, tol);

    /* faults: 0-8 planned (9 is after the end); 3 has no end, 5 no event, 6 was skipped */
    CHECK_EQ(a->n_faults, 10);
    CHECK_EQ(a->faults_planned, 9);
    CHECK_EQ(a->faults_applied, 6);
    REQUIRE(a->n_missing == 3, "missing %d", a->n_missing);
    CHECK_EQ(a->faults[a->missing[0]].n, 3);
    CHECK_STR(a->faults[a->missing[0]].why, "no end event");
    CHECK_EQ(a->faults[a->missing[1]].n, 5);
    CHECK_STR(a->faults[a->missing[1]].why, "no begin event");
    CHECK_EQ(a->faults[a->missing[2]].n, 6);
    CHECK_STR(a->faults[a->missing[2]].why, "skipped by the harness");
    CHECK_EQ(a->faults[9].planned, 0);
    CHECK_EQ(a->faults[8].applied, 1);
    CHECK_STR(a->faults[5].source, "random:delay");
    CHECK_NEAR(a->faults[5].value, 50, 0);
    CHECK_EQ(a->faults_unplanned, 0);
    CHECK_EQ(a->n_fault_events, 12);

    /* the synchronizer */
    CHECK_EQ(a->sync_incarnations, 3);
    CHECK_EQ(a->sync_crashes, 1);
    CHECK(has_note(a, "synchronizer incarnation 1 (pid 501) was SIGKILLed at 45.000 s: its ledger is not recoverable"),
          "the crash is a note");

    /* what was skipped on the way */
    CHECK_EQ(a->lines_garbage, 4);
    CHECK_EQ(a->lines_too_long, 1);
    CHECK_EQ(a->lines_torn, 1);
    CHECK_EQ(a->lines_cut, 1);
    CHECK_EQ(a->events_unmatched, 1);
    CHECK(has_note(a, "events-a1.log: skipped 3 garbage, 1 over-long and 1 torn"), "skipped lines are a note");

    /* wasted by cause, tokens of every incarnation, the synchronizer's view (gen_faulty's comment) */
    CHECK_NEAR(s0->wasted_s[DL_ACCT_WASTE_KILLED], 2.75, tol);
    CHECK_NEAR(s0->wasted_s[DL_ACCT_WASTE_DISCARDED], 4.0, tol);
    CHECK_NEAR(s0->wasted_s[DL_ACCT_WASTE_UNPUSHED], 1.0, tol);
    CHECK_NEAR(s0->wasted_s[DL_ACCT_WASTE_OTHER], 7.25, tol);
    CHECK_NEAR(s0->tokens, 2000, 0);
    CHECK_NEAR(s1->wasted_s[DL_ACCT_WASTE_UNPUSHED], 26.0, tol);
    CHECK_NEAR(s1->wasted_s[DL_ACCT_WASTE_KILLED] + s1->wasted_s[DL_ACCT_WASTE_DISCARDED] +
                   s1->wasted_s[DL_ACCT_WASTE_OTHER], 0.0, tol);
    for (int k = 0; k < DL_ACCT_NWASTE; k++) CHECK_NEAR(s2->wasted_s[k], 0.0, tol);
    CHECK_NEAR(a->wasted_s[DL_ACCT_WASTE_KILLED], 2.75, tol);
    CHECK_NEAR(a->wasted_s[DL_ACCT_WASTE_UNPUSHED], 27.0, tol);
    double wsum = 0;
    for (int k = 0; k < DL_ACCT_NWASTE; k++) wsum += a->wasted_s[k];
    CHECK_NEAR(wsum, a->fleet.bucket_s[DL_ACCT_WASTED], tol);
    CHECK_EQ(s0->deaths, 0);
    CHECK_EQ(s0->joins, 2);
    CHECK_EQ(s0->rejoins, 1);
    CHECK_EQ(s0->refetches, 1);
    CHECK_EQ(s0->refused[DL_ACCT_REF_OTHER], 1);
    CHECK_EQ(s0->refused[DL_ACCT_REF_STALE], 1);
    CHECK_EQ(s0->refused[DL_ACCT_REF_BUSY], 1);
    CHECK_EQ(s0->refused[DL_ACCT_REF_NORM], 0);
    CHECK_EQ(s1->deaths, 1);
    CHECK_EQ(s1->rejoins, 1);
    CHECK_EQ(s1->refetches, 0);
    CHECK_EQ(s1->refused[DL_ACCT_REF_NORM], 1);
    CHECK_EQ(s2->joins, 1);
    CHECK_EQ(s2->rejoins, 0);
    CHECK_EQ(s2->refused[DL_ACCT_REF_STALE], 1);
    CHECK_EQ(s2->refused[DL_ACCT_REF_CHUNK], 1);
    CHECK_EQ(s2->refused[DL_ACCT_REF_OTHER], 0);
    CHECK_NEAR(a->median_goodput, 0.6, tol);
    CHECK_EQ(a->low_goodput_slots, 0);
}

static void test_faulty(void)
{
    char run[300];
    path_of(run, sizeof run, "faulty");
    gen_faulty(run, LEDGER_BALANCED);
    dl_account *a = NULL;
    int rc = dl_account_run(run, &a);
    REQUIRE(rc == 0 && a, "account %s: %s", run, dl_errmsg());
    check_faulty(a);
    CHECK_EQ(a->ledger_balanced, 1);
    CHECK_EQ(a->n_ledgers, 2);
    CHECK_EQ(a->ledgers[0].incarnation, 0);
    CHECK_EQ(a->ledgers[1].incarnation, 2);
    CHECK_EQ(a->applied, 4000);
    CHECK_EQ(a->dropped_stale, 300);
    CHECK_EQ(a->rejected, 50);
    CHECK_EQ(a->lost, 300);
    CHECK_EQ(a->discarded, 120);
    CHECK_EQ(a->outstanding, 430);
    CHECK_EQ(a->processed, 5100);
    CHECK_EQ(a->carried_in, 100);
    CHECK_NEAR(a->token_goodput, 4000.0 / 5200, 1e-12);
    CHECK_EQ(a->store_ledger, 0);
    CHECK(isnan(a->store_token_goodput), "no store ledger without check.out");
    dl_account_close(&a);
    dl_account_close(&a);
    CHECK(a == NULL, "close twice");
}

static void test_ledgers(void)
{
    static const struct {
        int kind, balanced;
        const char *why;
    } cases[] = {
        {LEDGER_STATES, 0, "ledger 2 of 2 (synchronizer pid 502, incarnation 2, at 101.900 s): states sum to 3993, "
                           "processed + carried_in to 4000"},
        {LEDGER_POOLED, 0, "pooled 5 and carried 0 at exit"},
        {LEDGER_NONE, -1, "no ledger event"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char run[300], name[32];
        snprintf(name, sizeof name, "ledger%zu", k);
        path_of(run, sizeof run, name);
        gen_faulty(run, cases[k].kind);
        dl_account *a = NULL;
        REQUIRE(dl_account_run(run, &a) == 0, "account %s: %s", run, dl_errmsg());
        CHECK_EQ(a->ledger_balanced, cases[k].balanced);
        CHECK(strstr(a->ledger_mismatch, cases[k].why) != NULL, "case %zu: mismatch \"%s\"", k, a->ledger_mismatch);
        if (cases[k].kind == LEDGER_STATES) {
            CHECK_EQ(a->ledgers[0].balanced, 1);
            CHECK_EQ(a->ledgers[1].balanced, 0);
            CHECK_NEAR(a->token_goodput, 3993.0 / 5193, 1e-12);
        }
        if (cases[k].kind == LEDGER_NONE) {
            CHECK_EQ(a->n_ledgers, 0);
            CHECK(isnan(a->token_goodput), "no token goodput without a ledger");
            CHECK(has_note(a, "synchronizer incarnation 0 (pid 500) exited (code 1, signal 0) without a ledger"),
                  "a clean exit without a ledger is a note");
        }
        /* the time accounting does not depend on the ledger */
        CHECK_NEAR(a->fleet.bucket_s[DL_ACCT_GOODPUT], 136.625, 1e-6);
        dl_account_close(&a);
    }
}

static void test_errors(void)
{
    dl_account *a = (dl_account *)&a; /* not NULL, so the check sees it cleared */
    CHECK(dl_account_run("/nonexistent/run", &a) == DL_ENOTFOUND && a == NULL, "no run directory");
    char run[300], p[400];
    path_of(run, sizeof run, "nostart");
    REQUIRE(mkdir(run, 0755) == 0, "mkdir");
    snprintf(p, sizeof p, "%s/events-chaos.log", run);
    FILE *f = fopen(p, "w");
    fprintf(f, "ts=%lld proc=chaos pid=1 event=slot_begin slot=0 id=a1\n", TS0);
    fclose(f);
    CHECK(dl_account_run(run, &a) == DL_EFORMAT, "no run_start");
    CHECK(strstr(dl_errmsg(), "no run_start") != NULL, "says why: %s", dl_errmsg());
    f = fopen(p, "w");
    fprintf(f, "ts=%lld proc=chaos pid=1 event=run_start label=x duration_s=10\n", TS0);
    fclose(f);
    CHECK(dl_account_run(run, &a) == DL_EFORMAT, "run_start without fragments");

    /* only a run_start: everything else missing is a note, and nothing is provisioned */
    f = fopen(p, "w");
    fprintf(f, "ts=%lld proc=chaos pid=1 event=run_start label=x duration_s=10 fragments=2\n", TS0);
    fclose(f);
    REQUIRE(dl_account_run(run, &a) == 0, "bare run: %s", dl_errmsg());
    CHECK_EQ(a->n_slots, 0);
    CHECK(isnan(a->fleet.frac[DL_ACCT_GOODPUT]) && isnan(a->fleet.availability_bound), "NaN without provisioned time");
    CHECK_EQ(a->ledger_balanced, -1);
    CHECK_EQ(a->check_ok, -1);
    CHECK_EQ(a->unplanned_exits, -1);
    CHECK(isnan(a->final_val_loss), "no eval");
    CHECK(has_note(a, "no events-sync.log"), "missing sync log noted");
    CHECK(has_note(a, "no timeline.tsv"), "missing timeline noted");
    CHECK(has_note(a, "no run_end"), "missing run_end noted");
    /* and it still makes a report */
    char out[300];
    path_of(out, sizeof out, "bare-report");
    dl_account *one[1] = {a};
    CHECK(dl_report_write(out, "bare", NULL, one, 1) == 0, "report of a bare run: %s", dl_errmsg());
    dl_account_close(&a);

    /* merges without merge_contrib (a synchronizer that predates them): said, not hidden */
    path_of(run, sizeof run, "nocontrib");
    REQUIRE(mkdir(run, 0755) == 0, "mkdir");
    snprintf(p, sizeof p, "%s/events-chaos.log", run);
    f = fopen(p, "w");
    fprintf(f, "ts=%lld proc=chaos pid=1 event=run_start label=x duration_s=10 fragments=2\n", TS0);
    fclose(f);
    snprintf(p, sizeof p, "%s/events-sync.log", run);
    f = fopen(p, "w");
    fprintf(f, "ts=%lld proc=sync pid=2 event=merge frag=0 version=1 n=1 compute_s=3.0\n", TS0 + 1000000000LL);
    fclose(f);
    REQUIRE(dl_account_run(run, &a) == 0, "nocontrib: %s", dl_errmsg());
    CHECK(has_note(a, "1 merges but no merge_contrib event"), "missing merge_contrib noted");
    CHECK(has_note(a, "(1.500 learner-s were merged)"), "with the merged compute / P");
    dl_account_close(&a);
}

/* ---- report.json: a small validating JSON parser */

typedef struct {
    const char *p;
    int depth, ok;
} jp;

static void jp_ws(jp *j)
{
    while (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r') j->p++;
}

static int jp_value(jp *j);

static int jp_string(jp *j)
{
    if (*j->p != '"') return 0;
    for (j->p++; *j->p != '"'; j->p++) {
        unsigned char c = (unsigned char)*j->p;
        if (c < 0x20) return 0;
        if (c == '\\') {
            j->p++;
            if (*j->p == 'u') {
                for (int k = 1; k <= 4; k++)
                    if (!strchr("0123456789abcdefABCDEF", j->p[k]) || !j->p[k]) return 0;
                j->p += 4;
            } else if (!*j->p || !strchr("\"\\/bfnrt", *j->p)) return 0;
        }
    }
    j->p++;
    return 1;
}

static int jp_value(jp *j)
{
    jp_ws(j);
    if (++j->depth > 64) return 0;
    int ok = 0;
    char c = *j->p;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        jp_ws(j);
        if (*j->p == close) ok = 1, j->p++;
        else
            for (;;) {
                if (c == '{') {
                    jp_ws(j);
                    if (!jp_string(j)) break;
                    jp_ws(j);
                    if (*j->p++ != ':') break;
                }
                if (!jp_value(j)) break;
                jp_ws(j);
                if (*j->p == ',') {
                    j->p++;
                    continue;
                }
                if (*j->p == close) ok = 1, j->p++;
                break;
            }
    } else if (c == '"') ok = jp_string(j);
    else if (!strncmp(j->p, "true", 4)) ok = 1, j->p += 4;
    else if (!strncmp(j->p, "false", 5)) ok = 1, j->p += 5;
    else if (!strncmp(j->p, "null", 4)) ok = 1, j->p += 4;
    else {
        /* a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
        const char *s = j->p;
        if (*s == '-') s++;
        if (*s == '0') s++;
        else if (*s >= '1' && *s <= '9')
            while (*s >= '0' && *s <= '9') s++;
        else return 0;
        if (*s == '.') {
            s++;
            if (!(*s >= '0' && *s <= '9')) return 0;
            while (*s >= '0' && *s <= '9') s++;
        }
        if (*s == 'e' || *s == 'E') {
            s++;
            if (*s == '+' || *s == '-') s++;
            if (!(*s >= '0' && *s <= '9')) return 0;
            while (*s >= '0' && *s <= '9') s++;
        }
        j->p = s;
        ok = 1;
    }
    j->depth--;
    return ok;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = dl_xmalloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = 0;
    fclose(f);
    return b;
}

static int json_valid(const char *s)
{
    jp j = {.p = s};
    if (!jp_value(&j)) return 0;
    jp_ws(&j);
    return *j.p == 0;
}

static void test_json_validator(void)
{
    CHECK(json_valid("{\"a\": [1, -2.5e3, true, null, \"x\\u00e9\\n\"], \"b\": {}}"), "valid");
    const char *bad[] = {"{\"a\": NaN}", "{\"a\": 1,}", "[1 2]", "{\"a\" 1}", "\"\x01\"", "01", "{", "[nan]", "1."};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) CHECK(!json_valid(bad[k]), "invalid #%zu: %s", k, bad[k]);
}

/* 1 when PATH has an executable gnuplot. */
static int have_gnuplot(void)
{
    const char *p = getenv("PATH");
    char buf[4096];
    while (p && *p) {
        size_t n = strcspn(p, ":");
        snprintf(buf, sizeof buf, "%.*s/gnuplot", (int)n, p);
        if (n && access(buf, X_OK) == 0) return 1;
        p += n;
        if (*p == ':') p++;
    }
    return 0;
}

static void test_report(void)
{
    char r1[300], r2[300], r3[300], out[300];
    path_of(r1, sizeof r1, "rep-decoupled");
    path_of(r2, sizeof r2, "rep-sync");
    path_of(r3, sizeof r3, "rep-baseline");
    gen_faulty(r1, LEDGER_BALANCED);
    gen_faulty(r2, LEDGER_STATES);
    gen_baseline(r3, 0);
    dl_account *acc[3] = {0};
    REQUIRE(dl_account_run(r1, &acc[0]) == 0, "r1: %s", dl_errmsg());
    REQUIRE(dl_account_run(r2, &acc[1]) == 0, "r2: %s", dl_errmsg());
    REQUIRE(dl_account_run(r3, &acc[2]) == 0, "r3: %s", dl_errmsg());
    /* the baseline: 2 x 100 s, ready at 2, 400 / 4 merged */
    CHECK_NEAR(acc[2]->fleet.frac[DL_ACCT_STARTUP], 0.02, 1e-9);
    CHECK_NEAR(acc[2]->fleet.frac[DL_ACCT_GOODPUT], 0.5, 1e-9);
    CHECK_NEAR(acc[2]->fleet.frac[DL_ACCT_WASTED], 0.48, 1e-9);
    CHECK_NEAR(acc[2]->fleet.availability_bound, 1.0, 1e-12);
    CHECK_EQ(acc[2]->faults_planned, 0);
    check_time_sums(&acc[2]->fleet, "baseline");

    const char *labels[3] = {"decoupled", "sync", "decoupled-baseline"};
    path_of(out, sizeof out, "report");
    int gp = have_gnuplot();
    int rc = dl_report_write(out, "unit \"test\" scenario", labels, acc, 3);
    CHECK(rc == 0, "report: %s", dl_errmsg());

    char p[400];
    snprintf(p, sizeof p, "%s/report.md", out);
    char *md = slurp(p);
    REQUIRE(md, "report.md exists");
    CHECK(strstr(md, "# Chaos report: unit \"test\" scenario") != NULL, "title");
    CHECK(strstr(md, "**loopback**") != NULL, "mode");
    CHECK(strstr(md, "| decoupled | 62.1% | 90.5% | 68.7% | 3.2000 | +6.67% (vs decoupled-baseline) | 5 | 76.9% | yes "
                     "| 6/9 | yes | 1 |") != NULL,
          "the headline row of decoupled");
    CHECK(strstr(md, "| sync | 62.1% | 90.5% | 68.7% | 3.2000 | n/a | 5 | 76.9% | **NO** | 6/9 |") != NULL,
          "the headline row of sync (no twin, unbalanced)");
    CHECK(strstr(md, "| **sum** | 100.0% | 100.0% | 100.0% |") != NULL, "badput columns sum to 100%%");
    CHECK(strstr(md, "| idle_barrier | 1.4% |") != NULL, "idle row");
    CHECK(strstr(md, "**MISSING**: no end event") != NULL, "a missing fault");
    CHECK(strstr(md, "states sum to 3993") != NULL, "the mismatch is shown");
    CHECK(strstr(md, "![validation loss of the global model](plots/loss.svg)") != NULL, "plot link");
    CHECK(strstr(md, "(plots/timeline-decoupled-baseline.svg)") != NULL, "timeline link");
    CHECK(strstr(md, "## How to read this") != NULL, "definitions");
    CHECK(strstr(md, "| wasted: killed (s) | 2.8 | 2.8 | 0.0 |") != NULL, "wasted by cause");
    CHECK(strstr(md, "| 0 | a1 | 0 | 1 | 1 | dropped_stale 1, busy 1, rejected_other 1 | 2.8 | 4.0 | 1.0 | 7.2 | 2000 |") !=
              NULL,
          "a1: the synchronizer's view");
    CHECK(strstr(md, "| 1 | a2 | 1 | 1 | 0 | norm 1 |") != NULL, "a2: declared dead once, a norm refusal");
    CHECK(strstr(md, "peak up Mbit/s") != NULL && strstr(md, "| 0.020 | 0.040 | 0.024 | 0.048 |") != NULL,
          "links in Mbit/s");
    free(md);

    snprintf(p, sizeof p, "%s/report.json", out);
    char *js = slurp(p);
    REQUIRE(js, "report.json exists");
    CHECK(json_valid(js), "report.json parses");
    CHECK(strstr(js, "\"schema\": \"dloco-chaos-report/1\"") != NULL, "schema");
    CHECK(strstr(js, "\"scenario\": \"unit \\\"test\\\" scenario\"") != NULL, "escaped scenario");
    CHECK(strstr(js, "\"faults_planned\": 9") != NULL, "faults_planned");
    CHECK(strstr(js, "\"loss_cost\": 0.0666666666667") != NULL, "loss cost of decoupled");
    CHECK(strstr(js, "\"loss_cost\": null") != NULL, "no loss cost without a twin");
    CHECK(strstr(js, "\"twin\": \"decoupled-baseline\"") != NULL, "twin named");
    CHECK(strstr(js, "\"ledger_balanced\": false") != NULL, "unbalanced ledger");
    CHECK(strstr(js, "\"goodput\": 0.621022727273") != NULL, "goodput");
    CHECK(strstr(js, "\"sync_view\": {\"deaths\": 1, \"joins\": 2, \"rejoins\": 1, \"refetches\": 0") != NULL,
          "a2's sync view in JSON");
    CHECK(strstr(js, "\"wasted_s\": {\"killed\": 2.75, \"discarded\": 4, \"unpushed\": 27, \"other\": 7.25}") != NULL,
          "fleet wasted by cause in JSON");
    CHECK(strstr(js, "\"mean_up_mbit_s\": 0.02,") != NULL, "link rate in Mbit/s in JSON");
    CHECK(strstr(js, "NaN") == NULL && strstr(js, "nan") == NULL && strstr(js, "inf") == NULL, "no NaN in JSON");
    free(js);

    const char *dats[] = {"loss.gp", "goodput.gp", "staleness.gp", "staleness.dat", "loss-decoupled.dat",
                          "goodput-sync.dat", "timeline-decoupled.dat", "timeline-decoupled.gp", "links-decoupled.dat",
                          "links-decoupled-baseline.gp"};
    for (size_t k = 0; k < sizeof dats / sizeof dats[0]; k++) {
        snprintf(p, sizeof p, "%s/plots/%s", out, dats[k]);
        CHECK(exists(p), "%s written", p);
    }
    const char *svgs[] = {"loss.svg", "goodput.svg", "staleness.svg", "timeline-decoupled.svg", "timeline-sync.svg",
                          "links-decoupled.svg", "links-decoupled-baseline.svg"};
    if (gp) {
        snprintf(p, sizeof p, "%s/plots/loss.gp.log", out);
        CHECK(access(p, F_OK) != 0, "no gnuplot log left after a success");
        for (size_t k = 0; k < sizeof svgs / sizeof svgs[0]; k++) {
            snprintf(p, sizeof p, "%s/plots/%s", out, svgs[k]);
            char *svg = slurp(p);
            CHECK(svg && strstr(svg, "</svg>"), "%s drawn", p);
            free(svg);
        }
    } else {
        printf("SKIP test_chaos_report: gnuplot not in PATH, the SVGs are not checked (install gnuplot-nox)\n");
    }

    /* without gnuplot: the scripts and data, a warning, success */
    char *path = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
    setenv("PATH", "/nonexistent-dloco-test", 1);
    path_of(out, sizeof out, "report-nognuplot");
    rc = dl_report_write(out, "unit", labels, acc, 3);
    CHECK(rc == 0, "report without gnuplot: %s", dl_errmsg());
    snprintf(p, sizeof p, "%s/plots/loss.gp", out);
    CHECK(exists(p), "scripts without gnuplot");
    snprintf(p, sizeof p, "%s/plots/loss.svg", out);
    CHECK(!exists(p), "no SVG without gnuplot");

    /* a gnuplot that fails: DL_EIO naming its log, and everything else written */
    char bin[300], fake[400];
    path_of(bin, sizeof bin, "fakebin");
    REQUIRE(mkdir(bin, 0755) == 0, "mkdir %s", bin);
    snprintf(fake, sizeof fake, "%s/gnuplot", bin);
    FILE *g = fopen(fake, "w");
    REQUIRE(g, "create %s", fake);
    fputs("#!/bin/sh\necho 'fake gnuplot: broken' >&2\nexit 3\n", g);
    fclose(g);
    REQUIRE(chmod(fake, 0755) == 0, "chmod");
    setenv("PATH", bin, 1);
    path_of(out, sizeof out, "report-badgnuplot");
    rc = dl_report_write(out, "unit", labels, acc, 3);
    CHECK(rc == DL_EIO, "a failing gnuplot is DL_EIO, got %d", rc);
    CHECK(strstr(dl_errmsg(), "gnuplot loss.gp: exit status 3") != NULL, "says which: %s", dl_errmsg());
    snprintf(p, sizeof p, "%s/plots/loss.gp.log", out);
    char *log = slurp(p);
    CHECK(log && strstr(log, "fake gnuplot: broken"), "its output is kept in %s", p);
    free(log);
    snprintf(p, sizeof p, "%s/report.md", out);
    CHECK(exists(p), "report.md still written");
    snprintf(p, sizeof p, "%s/plots/timeline-sync.gp", out);
    CHECK(exists(p), "every script still written");
    if (path) setenv("PATH", path, 1), free(path);
    else unsetenv("PATH");

    /* labels NULL: the runs' own labels; and no runs at all */
    path_of(out, sizeof out, "report-own");
    CHECK(dl_report_write(out, "unit", NULL, acc, 3) == 0, "own labels");
    snprintf(p, sizeof p, "%s/plots/timeline-decoupled-baseline.gp", out);
    CHECK(exists(p), "own label used");
    path_of(out, sizeof out, "report-none");
    CHECK(dl_report_write(out, "unit", NULL, NULL, 0) == 0, "no runs");
    snprintf(p, sizeof p, "%s/report.json", out);
    js = slurp(p);
    CHECK(js && json_valid(js) && strstr(js, "\"runs\": []"), "empty report.json parses");
    free(js);
    for (int i = 0; i < 3; i++) dl_account_close(&acc[i]);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(p);
}

/* A learner far below the fleet's goodput is flagged; with check.out the
 * token totals are the store's ledger (every incarnation), the balance the
 * events'. */
static void test_low_and_store(void)
{
    char run[300];
    path_of(run, sizeof run, "low");
    gen_baseline(run, 1);
    dl_account *a = NULL;
    REQUIRE(dl_account_run(run, &a) == 0, "account %s: %s", run, dl_errmsg());
    REQUIRE(a->n_slots == 2, "slots %d", a->n_slots);
    CHECK_NEAR(a->slots[0].time.frac[DL_ACCT_GOODPUT], 0.5, 1e-9);
    CHECK_NEAR(a->slots[1].time.frac[DL_ACCT_GOODPUT], 0.05, 1e-9);
    CHECK_NEAR(a->median_goodput, 0.275, 1e-9);
    CHECK_EQ(a->slots[0].low_goodput, 0);
    CHECK_EQ(a->slots[1].low_goodput, 1);
    CHECK_EQ(a->low_goodput_slots, 1);
    CHECK_EQ(a->store_ledger, 1);
    static const uint64_t want[6] = {90, 4, 3, 2, 1, 20};
    for (int k = 0; k < 6; k++) CHECK_EQ(a->store_tokens[k], want[k]);
    CHECK_NEAR(a->store_token_goodput, 90.0 / 120, 1e-12);
    CHECK_EQ(a->applied, 80); /* the ledger event's totals stay theirs */
    CHECK_NEAR(a->token_goodput, 0.8, 1e-12);
    CHECK_EQ(a->ledger_balanced, 1);

    char out[300], p[400];
    path_of(out, sizeof out, "low-report");
    const char *labels[] = {"decoupled-baseline"};
    REQUIRE(dl_report_write(out, "low", labels, &a, 1) == 0, "report: %s", dl_errmsg());
    dl_account_close(&a);
    snprintf(p, sizeof p, "%s/report.md", out);
    char *md = slurp(p);
    CHECK(md && strstr(md, "| 1 | a2 | 0 | 0 | 0 | - | 0.0 | 0.0 | 93.0 | 0.0 | 0 | 5.0% | **LOW** |"),
          "a2 flagged LOW in the synchronizer's view");
    CHECK(md && strstr(md, "| store: applied | 90 |") && strstr(md, "| store: token goodput | 75.0% |"),
          "the store's ledger");
    free(md);
    snprintf(p, sizeof p, "%s/report.json", out);
    char *js = slurp(p);
    CHECK(js && json_valid(js), "report.json parses");
    CHECK(js && strstr(js, "\"low_goodput\": true") && strstr(js, "\"low_goodput_learners\": 1"), "flag in JSON");
    CHECK(js && strstr(js, "\"store\": {\"applied\": 90, \"dropped_stale\": 4"), "the store's ledger in JSON");
    free(js);
    printf("ok: a learner at 5%% goodput against a median of 27.5%% is flagged; the store's ledger read\n");
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s/dloco-test-chaos-report-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    REQUIRE(mkdtemp(dir), "mkdtemp %s", dir);
    test_parse();
    test_writer_roundtrip();
    test_iterator();
    test_faulty();
    test_ledgers();
    test_low_and_store();
    test_errors();
    test_json_validator();
    test_report();
    if (!failures) nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    else printf("test_chaos_report: files kept in %s\n", dir);
    return CHECK_DONE("test_chaos_report");
}
