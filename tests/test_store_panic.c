/* A commit whose meta-page write fails (a full disk at that instant) makes LMDB stop the
 * environment (MDB_PANIC from every later transaction): the store opens it again and commits
 * succeed as soon as the disk does, at the last commit on disk, with no restart. */
#define _GNU_SOURCE /* RTLD_NEXT */
#include "core/manifest.h"
#include "storage/store.h"

#include "core/err.h"
#include "tests/check.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* LMDB (a shared library) writes its two meta pages with pwrite at offsets
 * below two pages, data pages above them (writev, or pwrite for one page).
 * While g_fail_meta is set, this executable's pwrite -- the one liblmdb's
 * calls bind to -- fails those meta writes with ENOSPC, as a full disk would:
 * the data pages reach the file and the commit fails at its meta page, and
 * LMDB's attempt to put the old meta back fails too, so it marks the
 * environment failed for good. */
static atomic_int g_fail_meta, g_failed;
static long g_page;

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    static ssize_t (*real)(int, const void *, size_t, off_t);
    if (!real) real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
    if (atomic_load(&g_fail_meta) && off < 2 * g_page) {
        atomic_fetch_add(&g_failed, 1);
        errno = ENOSPC;
        return -1;
    }
    return real(fd, buf, n, off);
}

#define OK(expr)                                                                                         \
    do {                                                                                                 \
        int ok_rc_ = (expr);                                                                             \
        REQUIRE(ok_rc_ == 0, "%s -> %d (%s): %s", #expr, ok_rc_, dl_strerror(ok_rc_), dl_errmsg());        \
    } while (0)

static float val(uint64_t v, size_t i) { return (float)(v * 1000 + i % 97); }

static int commit(dl_store *s, uint64_t v, size_t n)
{
    float *x = malloc(n * sizeof *x), *m = calloc(n, sizeof *m);
    for (size_t i = 0; i < n; i++) x[i] = val(v, i);
    dl_merge_contrib c = {.base_version = v - 1, .staleness = 1, .steps = 1, .tokens = 64, .weight = 1.0,
                          .decision = DL_MERGE_MERGED, .learner_id = "l0"};
    dl_merge_record rec = {.epoch = 1, .wallclock_ns = 1, .staleness_fn = "constant", .delta_norm = 1,
                           .n_contrib = 1, .contrib = &c};
    dl_store_ledger led = {{[DL_LEDGER_APPLIED] = 64}};
    int rc = dl_store_commit_merge(s, 0, v, x, m, &rec, &led);
    free(x);
    free(m);
    return rc;
}

static void expect_version(dl_store *s, uint64_t want, size_t n)
{
    float *x = malloc(n * sizeof *x);
    uint64_t v = 0;
    OK(dl_store_read_fragment(s, 0, &v, x, NULL));
    REQUIRE(v == want, "fragment 0 at version %llu, expected %llu", (unsigned long long)v, (unsigned long long)want);
    for (size_t i = 0; i < n; i++) REQUIRE(x[i] == val(want, i), "param %zu of v%llu", i, (unsigned long long)want);
    free(x);
}

#define NUMEL 5000 /* fragment 0's parameters, the run's only fragment */

/* A store in a new directory (dir: a mkdtemp template, filled in) for a run of one fragment of NUMEL zeros,
 * opened with grow_wait_ms (0: the default) and v1 committed. */
static dl_store *fresh_store(char *dir, const char *run_id, uint64_t fingerprint, uint32_t grow_wait_ms)
{
    REQUIRE(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    static const uint64_t numel[1] = {NUMEL};
    float *init = calloc(NUMEL, sizeof *init);
    dl_store_run run = {run_id, fingerprint, "", 1, numel, {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 16,
                                                            .vocab = 256}, 1};
    dl_store *s = NULL;
    dl_store_opts o = dl_store_opts_default();
    o.grow_wait_ms = grow_wait_ms;
    OK(dl_store_open(dir, &o, &s));
    OK(dl_store_init_run(s, &run, (const float *const *)&init));
    OK(commit(s, 1, NUMEL));
    free(init);
    return s;
}

static void remove_dir(const char *dir)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    REQUIRE(system(cmd) == 0, "rm %s", dir);
}

/* One store call in a thread of its own (the caller joins it with joined_within): its store and result. */
typedef struct {
    dl_store *s;
    int rc;
} store_call;
/* A read on a stopped environment. */
static void *read_stats(void *arg)
{
    store_call *r = arg;
    dl_store_stats st;
    r->rc = dl_store_get_stats(r->s, &st);
    return NULL;
}

/* 1 when thread t ended within `seconds` (a deadline for the join, not a measurement: the waits these
 * tests replace were 600 s). */
static int joined_within(pthread_t t, int seconds)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    return pthread_timedjoin_np(t, NULL, &until) == 0;
}

/* The synchronizer's loop holds pinned read snapshots (Updates being sent) and reads (stats, new
 * snapshots) while the worker's write finds the environment stopped: a read must not wait for the reopen,
 * which waits for the loop's own snapshots to end. With grow_wait_ms at 10 minutes, a read while a
 * snapshot is open returns DL_EAGAIN at once (it waited grow_wait_ms before: test_chaos's synchronizer
 * stalled 10 s at a time and ignored SIGTERM); once the snapshot ends, the write reopens and commits. */
static void reader_never_waits(void)
{
    char dir[] = "/tmp/dloco_test_store_panic2_XXXXXX"; /* mkdtemp's template */
    dl_store *s = fresh_store(dir, "run-panic2", 0x78, 600000);
    dl_store_snap *pin = NULL;
    OK(dl_store_snapshot_begin(s, &pin)); /* an Update being sent */
    atomic_store(&g_fail_meta, 1);
    REQUIRE(commit(s, 2, NUMEL) != 0, "the commit of v2 succeeded with its meta page refused");
    store_call r = {.s = s};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, read_stats, &r) == 0, "thread");
    int joined = joined_within(t, 30);
    REQUIRE(joined && r.rc == DL_EAGAIN, "a read while a snapshot is open on the stopped environment returns "
                                       "DL_EAGAIN at once (joined %d, rc %d: %s)", joined, r.rc,
          joined ? dl_strerror(r.rc) : "still waiting");
    printf("ok: a read on the stopped environment with a snapshot open fails at once (DL_EAGAIN)\n");
    dl_store_snapshot_end(&pin);
    atomic_store(&g_fail_meta, 0);
    OK(commit(s, 2, NUMEL)); /* the writer reopens: nothing is open now */
    expect_version(s, 2, NUMEL);
    printf("ok: once the snapshot ended, the next commit reopened the environment and v2 is stored\n");
    dl_store_close(&s);
    remove_dir(dir);
}

/* The writer of three_threads: a commit of v2 that finds the environment stopped and must reopen it. */
static void *write_v2(void *arg)
{
    store_call *w = arg;
    w->rc = commit(w->s, 2, NUMEL);
    return NULL;
}

/* The reader of three_threads, the synchronizer's loop: it holds a pinned snapshot (an Update being sent)
 * and reads again and again while the worker's write waits to reopen the environment; every read must
 * return at once (DL_EAGAIN), and then it lets the snapshot go. */
typedef struct {
    dl_store *s;
    dl_store_snap *pin;
    int reads, eagain, other_rc;
} looper;
static void *loop_reads(void *arg)
{
    looper *l = arg;
    for (int i = 0; i < 25; i++) {
        dl_store_stats st;
        int rc = dl_store_get_stats(l->s, &st);
        l->reads++;
        if (rc == DL_EAGAIN) l->eagain++;
        else if (rc) l->other_rc = rc;
        struct timespec ts = {0, 10 * 1000 * 1000}; /* spreads the reads over the writer's wait; not a sync */
        nanosleep(&ts, NULL);
    }
    dl_store_snapshot_end(&l->pin);
    return NULL;
}

/* Stop 36's deadlock, three parties: the loop holds a snapshot, the environment is stopped, the worker's
 * commit waits (grow_wait_ms, 10 minutes here) for the loop's snapshot to end so that it can reopen, and
 * the loop reads meanwhile. A read that waited for the reopen (untimed once, grow_wait_ms at a time later)
 * kept the loop from ever ending its snapshot: the synchronizer stopped answering. Now every read returns
 * DL_EAGAIN at once, the loop ends its snapshot, and the commit goes through. */
static void three_threads(void)
{
    char dir[] = "/tmp/dloco_test_store_panic3_XXXXXX"; /* mkdtemp's template */
    dl_store *s = fresh_store(dir, "run-panic3", 0x79, 600000);
    looper lp = {.s = s};
    OK(dl_store_snapshot_begin(s, &lp.pin));
    atomic_store(&g_fail_meta, 1);
    REQUIRE(commit(s, 2, NUMEL) != 0, "the commit of v2 succeeded with its meta page refused");
    atomic_store(&g_fail_meta, 0); /* the disk has room again: the reopen is all the commit needs */
    store_call wr = {.s = s, .rc = -1};
    pthread_t tw, tl;
    REQUIRE(pthread_create(&tw, NULL, write_v2, &wr) == 0, "thread");
    REQUIRE(pthread_create(&tl, NULL, loop_reads, &lp) == 0, "thread");
    int joined = joined_within(tl, 30);
    REQUIRE(joined, "the loop's reads did not all return within 30 s while the worker waited to reopen (%d of 25 "
                    "returned): a read waits for the reopen", lp.reads);
    REQUIRE(lp.other_rc == 0 && lp.eagain >= 1, "the loop's reads: %d of %d DL_EAGAIN, another error %d (%s)",
            lp.eagain, lp.reads, lp.other_rc, dl_strerror(lp.other_rc));
    printf("ok: 25 reads with a snapshot open while the worker waited to reopen the environment returned at once "
           "(%d DL_EAGAIN)\n", lp.eagain);
    joined = joined_within(tw, 30);
    REQUIRE(joined && wr.rc == 0, "the worker's commit after the loop's snapshot ended: joined %d, rc %d (%s)",
            joined, wr.rc, joined ? dl_errmsg() : "still waiting");
    expect_version(s, 2, NUMEL);
    printf("ok: once the loop's snapshot ended, the waiting commit reopened the environment and v2 is stored\n");
    dl_store_close(&s);
    remove_dir(dir);
}

int main(void)
{
    g_page = sysconf(_SC_PAGESIZE);
    char dir[] = "/tmp/dloco_test_store_panic_XXXXXX"; /* mkdtemp's template */
    dl_store *s = fresh_store(dir, "run-panic", 0x77, 0);
    const uint64_t numel[1] = {NUMEL};

    /* the disk fills while v2 commits: its meta page cannot be written */
    atomic_store(&g_fail_meta, 1);
    int rc = commit(s, 2, numel[0]);
    REQUIRE(rc != 0, "the commit of v2 succeeded with its meta page refused");
    REQUIRE(atomic_load(&g_failed) >= 1, "LMDB wrote no meta page through pwrite (%d refused)", atomic_load(&g_failed));
    printf("ok: the commit of v2 failed at its meta page: %s\n", dl_errmsg());
    /* still full: the next commit fails too, and nothing is lost */
    REQUIRE(commit(s, 2, numel[0]) != 0, "a commit succeeded on the full disk");
    printf("ok: a commit on the still-full disk fails: %s\n", dl_errmsg());

    /* the disk has room again: the next commit succeeds in this process */
    atomic_store(&g_fail_meta, 0);
    rc = commit(s, 2, numel[0]);
    REQUIRE(rc == 0, "the first commit after the disk recovered failed: %d %s (LMDB's environment stays stopped "
                     "until it is opened again)", rc, dl_errmsg());
    dl_store_stats st;
    OK(dl_store_get_stats(s, &st));
    REQUIRE(st.env_reopens >= 1, "no environment reopen counted (%u)", st.env_reopens);
    printf("ok: v2 committed after the disk recovered (%u environment reopen(s))\n", st.env_reopens);
    expect_version(s, 2, numel[0]);
    OK(commit(s, 3, numel[0]));
    expect_version(s, 3, numel[0]);
    dl_store_ledger led;
    OK(dl_store_ledger_get(s, &led));
    REQUIRE(led.tokens[DL_LEDGER_APPLIED] == 3 * 64, "applied tokens %llu, expected %d (each commit once)",
            (unsigned long long)led.tokens[DL_LEDGER_APPLIED], 3 * 64);
    dl_store_close(&s);

    /* the store on disk: the checker passes and a fresh open reads v3 */
    REQUIRE(dl_store_check(dir, stdout) == 0, "dloco check failed on the store: %s", dl_errmsg());
    dl_store_opts o = dl_store_opts_default();
    OK(dl_store_open(dir, &o, &s));
    expect_version(s, 3, numel[0]);
    dl_store_close(&s);
    printf("ok: the store checks clean and reopens at v3\n");
    remove_dir(dir);
    reader_never_waits();
    three_threads();
    printf("test_store_panic: all checks passed\n");
    return 0;
}
