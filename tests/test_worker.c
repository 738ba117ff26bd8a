/* Tests of the synchronizer's worker thread against a real store: a merge
 * whose commit needs the map to grow while a snapshot is open is retried, not
 * abandoned, and a commit that keeps failing gives up after a bounded number
 * of retries leaving the store and the in-memory global untouched; with a
 * downlink codec the committed fragment is the old one plus the decoded
 * payload, bit for bit, and the residual carries what the payload did not;
 * with outer momentum 0 no momentum is held or stored, and switching it on
 * and off allocates and drops it. */
#define _GNU_SOURCE /* nftw */
#include "synchronizer/worker.h"

#include "core/err.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/tensor.h"
#include "kernels/codec.h"
#include "kernels/outer.h"
#include "tests/check.h"

#include <errno.h>
#include <math.h>
#include <ftw.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define OK(expr)                                                                                         \
    do {                                                                                                 \
        int ok_rc_ = (expr);                                                                             \
        REQUIRE(ok_rc_ == 0, "%s -> %d (%s): %s", #expr, ok_rc_, dl_strerror(ok_rc_), dl_errmsg());        \
    } while (0)

#define NUMEL (DL_STORE_BLOCK_FLOATS + 1000) /* two blocks: a commit writes 2 MiB */
#define DIR_LEN 4096                        /* a test directory's path buffer */

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void wake(void *ctx) { atomic_fetch_add((atomic_int *)ctx, 1); }

/* A merge job of one delta onto `version` of fragment 0, outer lr 0.7 and momentum mu. */
static dl_job *merge_job_mu(uint64_t version, float *delta, float mu)
{
    dl_job *j = dl_job_new(DL_JOB_MERGE);
    j->fragment = 0;
    j->version = version;
    j->mopts = (dl_merge_opts){.rule = DL_MERGE_RULE_MEAN, .outer_lr = 0.7f, .outer_momentum = mu};
    j->share = 1.0;
    j->m = 1;
    j->deltas = malloc(sizeof *j->deltas);
    j->w = malloc(sizeof *j->w);
    j->handles = malloc(sizeof *j->handles);
    j->deltas[0] = delta;
    j->w[0] = 1.0;
    j->handles[0] = 0;
    j->rec = (dl_merge_record){.epoch = 1, .staleness_fn = "constant", .n_contrib = 1,
                               .contrib = calloc(1, sizeof(dl_merge_contrib))};
    snprintf(j->rec.contrib[0].learner_id, sizeof j->rec.contrib[0].learner_id, "learner-0");
    j->rec.contrib[0].base_version = version;
    j->rec.contrib[0].tokens = 10;
    j->rec.contrib[0].weight = 1.0;
    j->rec.contrib[0].decision = DL_MERGE_MERGED;
    j->ledger.tokens[DL_LEDGER_APPLIED] = 10;
    return j;
}
static dl_job *merge_job(uint64_t version, float *delta) { return merge_job_mu(version, delta, 0.9f); }

/* The job back from the worker (bounded wait). */
static dl_job *wait_done(dl_worker *w)
{
    for (int i = 0; i < 6000; i++) {
        dl_job *j = dl_worker_done(w);
        if (j) return j;
        nap_ms(5);
    }
    REQUIRE(0, "the worker did not finish the job within 30 s");
    return NULL;
}

/* A new directory under DLOCO_BIN (or /tmp) named after `tag`, and a store
 * there (periodic durability; map_size and grow_wait_ms as dl_store_opts,
 * 0 = their defaults) holding a one-fragment run of NUMEL params. */
static dl_store *new_run_store(char dir[DIR_LEN], const char *tag, const float *params, uint64_t map_size,
                               int grow_wait_ms)
{
    const char *bin = getenv("DLOCO_BIN");
    snprintf(dir, DIR_LEN, "%s/test_worker%s.XXXXXX", bin && *bin ? bin : "/tmp", tag);
    REQUIRE(mkdtemp(dir) != NULL, "mkdtemp %s: %s", dir, strerror(errno));
    dl_store_opts o = dl_store_opts_default();
    o.durability = DL_STORE_PERIODIC;
    o.map_size = map_size;
    o.grow_wait_ms = grow_wait_ms;
    dl_store *s = NULL;
    OK(dl_store_open(dir, &o, &s));
    const uint64_t numel[1] = {NUMEL};
    const dl_model_config model = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 16, .vocab = 256};
    dl_store_run run = {"worker", 1, NULL, 1, numel, model, 7};
    const float *init[1] = {params};
    OK(dl_store_init_run(s, &run, init));
    return s;
}

/* 4. Downlink codec int4 (block 128; NUMEL is not a multiple of it, so the
 * last block is short): two merges of fragment 0. Each commits exactly
 * G_old + decode(payload) (one fp32 add, kernels/codec.h), the payload comes
 * back with the job, the residual is what encode leaves (y - decode, y = G' -
 * G_old + e_old), so G' + e_old - G_new and e_p agree to one rounding of the
 * add (2 ulp of the largest operand); the merge's hash is that of the committed bytes; a merge refused by
 * param_abs_max changes neither the global nor the residual. */
static void test_downlink(const dl_plan *plan)
{
    char dir[DIR_LEN];
    size_t n = NUMEL;
    float *params = dl_xaligned(64, n * 4), *mom = dl_xaligned(64, n * 4), *delta = malloc(n * 4);
    float *g_old = malloc(n * 4), *g_ref = malloc(n * 4), *m_ref = malloc(n * 4), *dec = malloc(n * 4);
    float *e_old = calloc(n, 4), *got = malloc(n * 4);
    for (size_t i = 0; i < n; i++) params[i] = (float)((int)(i % 200) - 100) * 0.013f, mom[i] = 0;
    memcpy(m_ref, mom, n * 4);
    dl_store *s = new_run_store(dir, "_dl", params, 0, 0);
    atomic_int wakes = 0;
    dl_worker *w = NULL;
    OK(dl_worker_open(s, plan, &params, &mom, wake, &wakes, &w));
    dl_codec_enc enc = {.c = {.id = DL_CODEC_INT4, .block = 128}, .rounding = DL_ROUND_NEAREST, .seed = 1};
    dl_worker_set_update_codec(w, &enc);
    CHECK(dl_worker_residual(w, 0) == NULL, "no residual before the first merge");
    uint64_t want_bytes = dl_codec_bytes(&enc.c, n);
    for (uint64_t v = 0; v < 2; v++) {
        for (size_t i = 0; i < n; i++) delta[i] = 0.02f * sinf((float)i * 0.37f + (float)v) + 0.001f * (float)(i % 5);
        /* the outer step the worker runs, on copies: G' into g_ref */
        memcpy(g_old, params, n * 4);
        memcpy(g_ref, params, n * 4);
        dl_cpu_nesterov(g_ref, m_ref, delta, n, 0.7f, 0.9f);
        dl_worker_submit(w, merge_job(v, delta));
        dl_job *j = wait_done(w);
        REQUIRE(j->rc == 0, "merge onto v%llu with int4 downlink: rc %d: %s", (unsigned long long)v, j->rc, j->err);
        REQUIRE(j->update && j->update_bytes == want_bytes && j->update_codec.id == DL_CODEC_INT4 &&
                    j->update_codec.block == 128,
                "the job carries the int4 payload: %zu bytes (want %llu)", j->update_bytes,
                (unsigned long long)want_bytes);
        /* the committed global, in memory and in the store, is G_old + decode(payload) bit for bit */
        OK(dl_codec_decode_add(&j->update_codec, j->update, j->update_bytes, n, g_old, got));
        CHECK(memcmp(got, params, n * 4) == 0, "v%llu: the in-memory global is G_old + decode(payload) bit for bit",
              (unsigned long long)v + 1);
        uint64_t sv = 0;
        float *stored = malloc(n * 4);
        OK(dl_store_read_fragment(s, 0, &sv, stored, NULL));
        CHECK(sv == v + 1 && memcmp(stored, got, n * 4) == 0, "v%llu: the store holds G_old + decode(payload)",
              (unsigned long long)v + 1);
        CHECK(j->hash == dl_checksum64(got, n * 4), "v%llu: the merge's hash is the committed fragment's",
              (unsigned long long)v + 1);
        /* the residual: exactly encode's y - decode(payload), y = (G' - G_old) + e_old; and, to the one
         * rounding of G_old + decode, what G_new lacks of G' + e_old */
        OK(dl_codec_decode(&j->update_codec, j->update, j->update_bytes, n, dec));
        const float *e = dl_worker_residual(w, 0);
        REQUIRE(e, "a residual after the merge");
        size_t exact = 0, close = 0;
        double worst = 0, enorm = 0;
        for (size_t i = 0; i < n; i++) {
            float y = (g_ref[i] - g_old[i]) + e_old[i];
            exact += e[i] == y - dec[i];
            double gap = ((double)g_ref[i] + (double)e_old[i] - (double)got[i]) - (double)e[i];
            float big = fmaxf(fmaxf(fabsf(got[i]), fabsf(g_old[i])), fmaxf(fabsf(g_ref[i]), fabsf(y)));
            double ulp = (double)nextafterf(big, INFINITY) - (double)big; /* of the largest operand */
            close += fabs(gap) <= 2 * ulp;
            worst = fmax(worst, fabs(gap));
            enorm = fmax(enorm, fabs(e[i]));
        }
        CHECK(exact == n, "v%llu: e_p == y - decode(payload) at %zu of %zu elements", (unsigned long long)v + 1,
              exact, n);
        CHECK(close == n && enorm > 0, "v%llu: |G' + e_old - G_new - e_p| <= 2 ulp at %zu of %zu (worst %.3g, max |e_p| %.3g)",
              (unsigned long long)v + 1, close, n, worst, enorm);
        printf("ok: int4 downlink merge to v%llu: %zu payload bytes (%.2f bits/element), committed = G_old + "
               "decode bit for bit, max |e_p| %.3g, |G' + e_old - G_new - e_p| <= %.3g\n",
               (unsigned long long)v + 1, j->update_bytes, 8.0 * (double)j->update_bytes / (double)n, enorm, worst);
        memcpy(e_old, e, n * 4);
        /* the momentum follows the outer step (the residual does not touch it) */
        CHECK(memcmp(mom, m_ref, n * 4) == 0, "v%llu: momentum as the outer step left it", (unsigned long long)v + 1);
        free(stored);
        dl_job_free(j);
    }
    /* a merge the parameter guard refuses: nothing committed, residual and global unchanged */
    memcpy(g_old, params, n * 4);
    dl_job *j = merge_job(2, delta);
    j->param_abs_max = 1e-6;
    dl_worker_submit(w, j);
    j = wait_done(w);
    CHECK(j->rc == DL_ECORRUPT && !j->update, "a guarded merge fails without a payload: rc %d", j->rc);
    CHECK(memcmp(params, g_old, n * 4) == 0 && memcmp(dl_worker_residual(w, 0), e_old, n * 4) == 0,
          "the refused merge left the global and the residual as they were");
    dl_job_free(j);
    dl_worker_close(&w);
    dl_store_close(&s);
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(params), free(mom), free(delta), free(g_old), free(g_ref), free(m_ref), free(dec), free(e_old), free(got);
}

/* 5. Outer momentum off, on, off (as a reload switches it): at 0 the worker
 * holds no momentum (the loop gives it none at start) and commits none, the
 * step being G - lr x delta; turned on it allocates the momentum at zero and
 * commits it; turned off again it frees it and the commit deletes the
 * fragment's momentum blocks. The global follows the reference step bit for
 * bit throughout, and the store checks. */
static void test_momentum_switch(const dl_plan *plan)
{
    char dir[DIR_LEN];
    size_t n = NUMEL;
    float *params = dl_xaligned(64, n * 4), *mom = NULL, *delta = malloc(n * 4);
    float *g_ref = malloc(n * 4), *m_ref = calloc(n, 4), *x = malloc(n * 4), *m = malloc(n * 4);
    for (size_t i = 0; i < n; i++) params[i] = (float)((int)(i % 300) - 150) * 0.007f;
    memcpy(g_ref, params, n * 4);
    dl_store *s = new_run_store(dir, "_mom", params, 0, 0);
    dl_store_stats st;
    OK(dl_store_get_stats(s, &st));
    uint64_t params_only = st.state_bytes;
    atomic_int wakes = 0;
    dl_worker *w = NULL;
    OK(dl_worker_open(s, plan, &params, &mom, wake, &wakes, &w));
    const float mus[5] = {0.0f, 0.0f, 0.9f, 0.9f, 0.0f};
    for (uint64_t v = 0; v < 5; v++) {
        float mu = mus[v];
        for (size_t i = 0; i < n; i++) delta[i] = 0.01f * cosf((float)i * 0.21f + (float)v) + 0.002f * (float)(i % 3);
        if (mu == 0.0f) { /* the reference: momentum 0 through the momentum path; a momentum turned off is gone */
            memset(m_ref, 0, n * 4);
            dl_cpu_nesterov(g_ref, m_ref, delta, n, 0.7f, 0.0f);
            memset(m_ref, 0, n * 4);
        } else {
            dl_cpu_nesterov(g_ref, m_ref, delta, n, 0.7f, mu);
        }
        dl_worker_submit(w, merge_job_mu(v, delta, mu));
        dl_job *j = wait_done(w);
        REQUIRE(j->rc == 0, "merge onto v%llu, momentum %g: rc %d: %s", (unsigned long long)v, mu, j->rc, j->err);
        dl_job_free(j);
        uint64_t got = 0;
        OK(dl_store_read_fragment(s, 0, &got, x, m));
        OK(dl_store_get_stats(s, &st));
        CHECK(got == v + 1 && memcmp(params, g_ref, n * 4) == 0 && memcmp(x, g_ref, n * 4) == 0,
              "v%llu (momentum %g): the global, in memory and stored, is the reference step", (unsigned long long)v + 1,
              mu);
        if (mu == 0.0f) {
            CHECK(mom == NULL, "v%llu: momentum 0 keeps no momentum in memory", (unsigned long long)v + 1);
            CHECK(st.state_bytes == params_only, "v%llu: params only stored (%llu bytes, want %llu)",
                  (unsigned long long)v + 1, (unsigned long long)st.state_bytes, (unsigned long long)params_only);
        } else {
            CHECK(mom && memcmp(mom, m_ref, n * 4) == 0, "v%llu: the momentum, from zero, in memory",
                  (unsigned long long)v + 1);
            CHECK(st.state_bytes == 2 * params_only, "v%llu: params and momentum stored (%llu bytes)",
                  (unsigned long long)v + 1, (unsigned long long)st.state_bytes);
        }
        CHECK(memcmp(m, m_ref, n * 4) == 0, "v%llu: the stored momentum reads as the reference's",
              (unsigned long long)v + 1);
    }
    dl_worker_close(&w);
    dl_store_close(&s);
    CHECK(dl_store_check(dir, NULL) == 0, "check: %s", dl_errmsg());
    printf("ok: outer momentum 0, 0, 0.9, 0.9, 0: none held or stored at 0, allocated at zero when turned on, "
           "freed and its blocks deleted when turned off; the global is the reference step bit for bit; "
           "check passes\n");
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(params), free(mom), free(delta), free(g_ref), free(m_ref), free(x), free(m);
}

int main(void)
{
    dl_log_set_level(DL_LOG_ERROR);
    char dir[DIR_LEN];
    dl_tensor t = {.name = "w", .offset = 0, .numel = NUMEL, .ndim = 2, .shape = {NUMEL, 1}, .kind = DL_TENSOR_MATRIX};
    dl_plan *plan = NULL;
    OK(dl_plan_build(&t, 1, 1, &plan));
    float *params = dl_xaligned(64, NUMEL * 4), *mom = dl_xaligned(64, NUMEL * 4), *delta = malloc(NUMEL * 4);
    for (size_t i = 0; i < NUMEL; i++) params[i] = (float)(i % 100) * 0.01f, mom[i] = 0, delta[i] = 0.5f;

    /* a 256 KiB map: the 4 MB run and every commit must grow it; a grow
     * waits 50 ms for open snapshots */
    dl_store *s = new_run_store(dir, "", params, 256 << 10, 50);
    atomic_int wakes = 0;
    dl_worker *w = NULL;
    OK(dl_worker_open(s, plan, &params, &mom, wake, &wakes, &w));

    /* 1. a snapshot stays open while merges commit: the pages they free stay
     * pinned, the map fills and cannot grow; the first commit that does not
     * fit fails with DL_EAGAIN inside the worker, which retries; the
     * snapshot ends; the retry commits. */
    dl_store_snap *snap;
    OK(dl_store_snapshot_begin(s, &snap));
    uint64_t v = 0;
    int jobs = 0, retried = 0;
    float *x = malloc(NUMEL * 4), *m = malloc(NUMEL * 4);
    for (int k = 0; k < 40 && !retried; k++) {
        dl_store_stats st;
        OK(dl_store_get_stats(s, &st));
        uint32_t t0 = st.grow_timeouts;
        memcpy(x, params, NUMEL * 4);
        dl_worker_submit(w, merge_job(v, delta));
        jobs++;
        dl_job *j = NULL;
        for (int i = 0; i < 6000 && !j; i++) {
            if ((j = dl_worker_done(w))) break;
            OK(dl_store_get_stats(s, &st));
            if (st.grow_timeouts >= t0 + 2) { /* the pre-grow and the MAP_FULL grow gave up: a try failed */
                CHECK(memcmp(x, params, NUMEL * 4) == 0, "the global is untouched while the commit retries");
                dl_store_snapshot_end(&snap);
                retried = 1;
                j = wait_done(w);
            }
            nap_ms(2);
        }
        REQUIRE(j, "job %d came back", jobs);
        REQUIRE(j->rc == 0, "merge onto v%llu: rc %d (%s), %d retries: %s", (unsigned long long)v, j->rc,
                dl_strerror(j->rc), j->retries, j->err);
        CHECK(retried ? j->retries >= 1 : j->retries == 0, "merge onto v%llu: %d retries", (unsigned long long)v,
              j->retries);
        dl_job_free(j);
        v++;
    }
    REQUIRE(retried, "no commit ran out of map under the snapshot in 40 merges");
    uint64_t got = 0;
    OK(dl_store_read_fragment(s, 0, &got, x, m));
    CHECK(got == v && memcmp(x, params, NUMEL * 4) == 0 && memcmp(m, mom, NUMEL * 4) == 0,
          "store at v%llu (expected %llu) holds the in-memory global", (unsigned long long)got, (unsigned long long)v);
    printf("ok: %d merges under a long-held snapshot; the last one's commit found the map full, was retried, and "
           "committed (v%llu) once the snapshot ended\n", jobs, (unsigned long long)v);

    /* 2. the snapshot stays open for good: the commit that does not fit
     * gives up after its bounded retries; nothing is written, the global
     * keeps the last committed version */
    OK(dl_store_snapshot_begin(s, &snap));
    dl_job *j = NULL;
    for (int k = 0; k < 40; k++) {
        memcpy(x, params, NUMEL * 4);
        dl_worker_submit(w, merge_job(v, delta));
        jobs++;
        j = wait_done(w);
        if (j->rc) break;
        dl_job_free(j);
        j = NULL;
        v++;
    }
    REQUIRE(j, "no commit ran out of map under the snapshot in 40 merges");
    CHECK(j->rc == DL_EAGAIN && j->retries == 10 && strstr(j->err, "stayed open"),
          "gave up: rc %d (%s), %d retries: %s", j->rc, dl_strerror(j->rc), j->retries, j->err);
    int gave_up_after = j->retries;
    dl_job_free(j);
    dl_store_snapshot_end(&snap);
    OK(dl_store_read_fragment(s, 0, &got, NULL, NULL));
    CHECK(got == v && memcmp(x, params, NUMEL * 4) == 0, "store at v%llu (expected %llu), global unchanged",
          (unsigned long long)got, (unsigned long long)v);
    printf("ok: with the snapshot held throughout, the commit onto v%llu gave up after %d retries (DL_EAGAIN); "
           "store and global unchanged\n", (unsigned long long)v, gave_up_after);

    /* 3. once nothing holds the store the same merge goes through at once */
    dl_worker_submit(w, merge_job(v, delta));
    jobs++;
    j = wait_done(w);
    CHECK(j->rc == 0 && j->retries == 0, "rc %d, %d retries: %s", j->rc, j->retries, j->err);
    dl_job_free(j);
    OK(dl_store_read_fragment(s, 0, &got, NULL, NULL));
    CHECK(got == v + 1, "store at v%llu", (unsigned long long)got);
    CHECK(atomic_load(&wakes) == jobs, "one wake per job: %d of %d", atomic_load(&wakes), jobs);

    dl_worker_close(&w);
    dl_store_close(&s);
    CHECK(dl_store_check(dir, NULL) == 0, "check: %s", dl_errmsg());
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    test_downlink(plan);
    test_momentum_switch(plan);
    dl_plan_close(&plan);
    free(params), free(mom), free(delta), free(x), free(m);
    return CHECK_DONE("test_worker");
}
