/* Tests of core/err.c's allocator: injected failures by dl_alloc_fail_after
 * and DLOCO_ALLOC_FAIL_AT, the abort message, and the dl_try_* NULL. */
#include "core/err.h"

#include "core/plan.h"
#include "tests/check.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *self;

/* Run fn in a child with stderr captured; *status is its wait status. */
static void in_child(void (*fn)(void), char *err, size_t cap, int *status)
{
    int pfd[2];
    REQUIRE(pipe(pfd) == 0, "pipe");
    fflush(stdout);
    pid_t c = fork();
    REQUIRE(c >= 0, "fork");
    if (c == 0) {
        dup2(pfd[1], 2);
        close(pfd[0]);
        signal(SIGABRT, SIG_DFL);
        fn();
        _exit(0);
    }
    close(pfd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(pfd[0], err + n, cap - 1 - n)) > 0) n += (size_t)r;
    err[n] = 0;
    close(pfd[0]);
    waitpid(c, status, 0);
}

static void test_try_malloc(void)
{
    long long c0 = dl_alloc_count();
    void *a = dl_try_malloc(16);
    CHECK_EQ(dl_alloc_count(), c0 + 1);
    CHECK(a != NULL, "an unarmed try_malloc succeeds");
    dl_alloc_fail_after(3);
    void *b = dl_try_malloc(16), *c = dl_try_malloc(16), *d = dl_try_malloc(16), *e = dl_try_malloc(16);
    CHECK(b && c, "the first two after arming succeed");
    CHECK(d == NULL, "the third fails");
    CHECK(e != NULL, "injection is one-shot");
    dl_alloc_fail_after(1);
    dl_alloc_fail_after(0); /* disarm */
    void *f = dl_try_malloc(16);
    CHECK(f != NULL, "disarmed");
    free(a), free(b), free(c), free(e), free(f);
}

/* The calloc / realloc / aligned twins: counted, zeroing / keeping / aligning
 * like their aborting siblings, and NULL (not an abort) when failed. */
static void test_try_variants(void)
{
    long long c0 = dl_alloc_count();
    int *z = dl_try_calloc(100, sizeof *z);
    REQUIRE(z != NULL, "an unarmed try_calloc succeeds");
    int zero = 1;
    for (int i = 0; i < 100; i++) zero &= z[i] == 0;
    CHECK(zero, "try_calloc zeroes");
    for (int i = 0; i < 100; i++) z[i] = i;
    int *g = dl_try_realloc(z, 100000 * sizeof *g);
    REQUIRE(g != NULL, "an unarmed try_realloc succeeds");
    int kept = 1;
    for (int i = 0; i < 100; i++) kept &= g[i] == i;
    CHECK(kept, "try_realloc keeps the contents");
    float *al = dl_try_aligned(64, 1000 * sizeof(float));
    REQUIRE(al != NULL, "an unarmed try_aligned succeeds");
    CHECK(((uintptr_t)al & 63) == 0, "try_aligned to 64: %p", (void *)al);
    free(al);
    CHECK_EQ(dl_alloc_count(), c0 + 3);

    dl_alloc_fail_after(1);
    CHECK(dl_try_calloc(4, 4) == NULL, "an injected try_calloc returns NULL");
    dl_alloc_fail_after(1);
    CHECK(dl_try_aligned(64, 16) == NULL, "an injected try_aligned returns NULL");
    dl_alloc_fail_after(1);
    CHECK(dl_try_realloc(g, 200000 * sizeof *g) == NULL, "an injected try_realloc returns NULL");
    kept = 1;
    for (int i = 0; i < 100; i++) kept &= g[i] == i;
    CHECK(kept, "a failed try_realloc leaves the old block as it was");
    free(g);
    CHECK_EQ(dl_alloc_count(), c0 + 6);
}

static void test_variants(void)
{
    char *z = dl_xmalloc(0);
    CHECK(z != NULL, "zero bytes still give a pointer");
    free(z);
    int *v = dl_xcalloc(100, sizeof *v);
    int zero = 1;
    for (int i = 0; i < 100; i++) zero &= v[i] == 0;
    CHECK(zero, "calloc zeroes");
    for (int i = 0; i < 100; i++) v[i] = i;
    v = dl_xrealloc(v, 100000 * sizeof *v);
    int kept = 1;
    for (int i = 0; i < 100; i++) kept &= v[i] == i;
    CHECK(kept, "realloc keeps the contents");
    free(v);
    float *al = dl_xaligned(64, 1000 * sizeof(float));
    CHECK(((uintptr_t)al & 63) == 0, "aligned to 64: %p", (void *)al);
    free(al);
    long long c0 = dl_alloc_count();
    free(dl_xmalloc(1));
    free(dl_xcalloc(1, 1));
    free(dl_xrealloc(NULL, 1));
    free(dl_xaligned(64, 1));
    CHECK_EQ(dl_alloc_count(), c0 + 4); /* every variant is counted, so any one can be failed */
}

static void fail_second_xmalloc(void)
{
    dl_alloc_fail_after(2);
    free(dl_xmalloc(8));
    free(dl_xmalloc(8)); /* this one aborts */
    fprintf(stderr, "survived\n");
}

static void fail_aligned(void)
{
    dl_alloc_fail_after(1);
    free(dl_xaligned(64, 8));
    fprintf(stderr, "survived\n");
}

static void fail_in_plan(void)
{
    dl_tensor t[3] = {
        {.name = "a", .offset = 0, .numel = 6, .ndim = 2, .shape = {2, 3}, .kind = DL_TENSOR_MATRIX},
        {.name = "b", .offset = 6, .numel = 4, .ndim = 1, .shape = {4, 0}, .kind = DL_TENSOR_VECTOR},
        {.name = "c", .offset = 10, .numel = 8, .ndim = 2, .shape = {2, 4}, .kind = DL_TENSOR_EMBED},
    };
    dl_plan *pl = NULL;
    dl_alloc_fail_after(3);
    int rc = dl_plan_build(t, 3, 2, &pl);
    fprintf(stderr, "survived rc %d\n", rc);
}

static void test_abort_message(void)
{
    char err[1024];
    int st = 0;
    long long base = dl_alloc_count();
    in_child(fail_second_xmalloc, err, sizeof err, &st);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "aborted (status %d)", st);
    char want[128];
    snprintf(want, sizeof want, "dloco: injected allocation failure %lld at ", base + 2);
    CHECK(strstr(err, want) != NULL, "message \"%s\" in: %s", want, err);
    CHECK(strstr(err, "test_err.c:") != NULL, "names the caller's file:line: %s", err);
    /* ... relative to the source tree, never the build machine's absolute path */
    CHECK(strstr(err, " at tests/test_err.c:") != NULL, "file:line relative to the source tree: %s", err);
    CHECK(strstr(err, "survived") == NULL, "nothing ran past the failure: %s", err);

    in_child(fail_aligned, err, sizeof err, &st);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "aligned: aborted (status %d)", st);
    CHECK(strstr(err, "injected allocation failure") != NULL, "aligned: %s", err);

    /* A library allocation: dl_plan_build is on the learner library's path (a manifest from
     * outside), so a failed allocation inside it is a DL_ENOMEM, never an abort. */
    in_child(fail_in_plan, err, sizeof err, &st);
    CHECK(WIFEXITED(st), "plan: the process survived (status %d)", st);
    CHECK(strstr(err, "survived rc -2") != NULL, "plan: DL_ENOMEM after a failed allocation: %s", err);
}

/* DLOCO_ALLOC_FAIL_AT=N: the child, started fresh, fails its N-th allocation. */
static int env_child(void)
{
    for (int i = 1; i <= 20; i++) {
        void *p = dl_try_malloc(8);
        if (!p) return i;
        free(p);
    }
    return 0;
}

static void test_env(void)
{
    const char *cases[][2] = {{"5", "5"}, {"1", "1"}, {"", "0"}, {"0", "0"}};
    for (int k = 0; k < 4; k++) {
        fflush(stdout);
        pid_t c = fork();
        REQUIRE(c >= 0, "fork");
        if (c == 0) {
            setenv("DLOCO_ALLOC_FAIL_AT", cases[k][0], 1);
            execl(self, self, "env-child", (char *)NULL);
            _exit(99);
        }
        int st = 0;
        waitpid(c, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == atoi(cases[k][1]),
              "DLOCO_ALLOC_FAIL_AT=\"%s\": failed allocation %d, want %s", cases[k][0],
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, cases[k][1]);
    }
}

int main(int argc, char **argv)
{
    self = argv[0];
    if (argc > 1 && !strcmp(argv[1], "env-child")) return env_child();
    test_try_malloc();
    test_try_variants();
    test_variants();
    test_abort_message();
    test_env();
    return CHECK_DONE("test_err");
}
