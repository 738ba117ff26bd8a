/* --data_shard_mode cluster (gpt/data.h): on real text (this repository's
 * docs/), the cluster shards are deterministic (the same for any --seed and on
 * every open), disjoint, cover the training sequences, are of equal size (to a
 * document), and differ in distribution from the corpus far more than the iid
 * shards do; a shard too small for a batch and an unknown mode are refused
 * with their numbers. */
#include "gpt/data.h"

#include "core/err.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"

#define K 4
#define T 64

static char path[1024];

static dl_data *open_shard(int mode, int i, int n, uint64_t seed, int min_seqs, int *rc)
{
    dl_data_opts o = {.path = path, .format = "text", .seq_len = T, .vocab = 256, .val_frac = 0.05, .seed = seed,
                      .shard_index = i, .shard_count = n, .shard_mode = mode, .min_seqs = min_seqs};
    dl_data *d = NULL;
    *rc = dl_data_open(&o, &d);
    return d;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* byte distribution of a shard's training sequences (tokens 0..T-1 of each) */
static void hist(dl_data *dd, double *h)
{
    memset(h, 0, 256 * sizeof *h);
    uint64_t n = dl_data_train_seqs(dd);
    int32_t inp[T], tgt[T];
    /* one epoch of next_train visits every training sequence once; the
     * position is put back after */
    dl_data_pos p0 = dl_data_get_pos(dd);
    for (uint64_t s = 0; s < n; s++) {
        dl_data_next_train(dd, 1, inp, tgt);
        for (int t = 0; t < T; t++) h[inp[t]] += 1.0;
    }
    dl_data_set_pos(dd, p0);
    for (int b = 0; b < 256; b++) h[b] /= (double)(n * T);
}

static double tv(const double *a, const double *b)
{
    double s = 0;
    for (int i = 0; i < 256; i++) s += fabs(a[i] - b[i]);
    return 0.5 * s;
}

int main(void)
{
    const char *src = getenv("DLOCO_SRC");
    REQUIRE(src, "DLOCO_SRC is not set (run through ctest)");
    snprintf(path, sizeof path, "%s/docs", src);
    int rc;
    dl_data *all = open_shard(DL_DATA_SHARD_IID, 0, 1, 1, 0, &rc);
    REQUIRE(rc == 0, "open %s: %s", path, dl_errmsg());
    uint64_t na = dl_data_train_seqs(all);
    uint64_t *aoff = malloc(na * sizeof *aoff), *got = malloc(na * sizeof *got), ng = 0;
    for (uint64_t i = 0; i < na; i++) aoff[i] = dl_data_train_offset(all, i);
    double hall[256], h[256];
    hist(all, hall);
    printf("corpus %s: %llu training sequences of %d\n", path, (unsigned long long)na, T);

    double tv_cluster = 0, tv_iid = 0;
    for (int i = 0; i < K; i++) {
        dl_data *c = open_shard(DL_DATA_SHARD_CLUSTER, i, K, 1, 4, &rc);
        REQUIRE(rc == 0, "cluster shard %d: %s", i, dl_errmsg());
        dl_data *c2 = open_shard(DL_DATA_SHARD_CLUSTER, i, K, 99, 4, &rc); /* another learner seed */
        REQUIRE(rc == 0, "cluster shard %d again: %s", i, dl_errmsg());
        uint64_t n = dl_data_train_seqs(c), same = n == dl_data_train_seqs(c2);
        for (uint64_t s = 0; s < n && same; s++) same = dl_data_train_offset(c, s) == dl_data_train_offset(c2, s);
        CHECK(same, "cluster shard %d is the same for --seed 1 and 99", i);
        /* equal sizes: ceil(documents / K) documents each, the last shard's last document may be short */
        uint64_t docs = (na + DL_DATA_CLUSTER_DOC - 1) / DL_DATA_CLUSTER_DOC, cap = (docs + K - 1) / K;
        CHECK(n <= cap * DL_DATA_CLUSTER_DOC && n + 2 * DL_DATA_CLUSTER_DOC * (uint64_t)K >= na / K,
              "cluster shard %d: %llu sequences, about %llu", i, (unsigned long long)n, (unsigned long long)(na / K));
        for (uint64_t s = 0; s < n && ng < na; s++) got[ng++] = dl_data_train_offset(c, s);
        hist(c, h);
        double t = tv(h, hall);
        tv_cluster += t / K;
        dl_data *d = open_shard(DL_DATA_SHARD_IID, i, K, 1, 0, &rc);
        REQUIRE(rc == 0, "iid shard %d: %s", i, dl_errmsg());
        double hi[256];
        hist(d, hi);
        tv_iid += tv(hi, hall) / K;
        printf("shard %d: cluster %llu sequences, TV from the corpus %.4f; iid %llu sequences, TV %.4f\n", i,
               (unsigned long long)n, t, (unsigned long long)dl_data_train_seqs(d), tv(hi, hall));
        dl_data_close(&c);
        dl_data_close(&c2);
        dl_data_close(&d);
    }
    /* disjoint and covering: the shards' offsets sorted are the corpus's */
    qsort(got, ng, sizeof *got, cmp_u64);
    qsort(aoff, na, sizeof *aoff, cmp_u64);
    CHECK(ng == na && memcmp(got, aoff, na * sizeof *aoff) == 0, "the %d cluster shards partition the %llu sequences "
          "(got %llu)", K, (unsigned long long)na, (unsigned long long)ng);
    printf("mean total-variation distance from the corpus: cluster %.4f, iid %.4f (x%.1f)\n", tv_cluster, tv_iid,
           tv_cluster / tv_iid);
    CHECK(tv_cluster > 3 * tv_iid, "cluster shards differ in distribution: TV %.4f vs iid %.4f", tv_cluster, tv_iid);

    /* refusals */
    dl_data *x = open_shard(DL_DATA_SHARD_CLUSTER, 1, K, 1, 1000000, &rc);
    CHECK(rc == DL_ERANGE && !x && strstr(dl_errmsg(), "cluster shard 1 of 4 holds") &&
              strstr(dl_errmsg(), "fewer than the 1000000 a batch needs (clusters: "),
          "a shard smaller than a batch is refused: %s", dl_errmsg());
    x = open_shard(7, 0, K, 1, 1, &rc);
    CHECK(rc == DL_EINVAL && !x && strstr(dl_errmsg(), "data shard mode 7"), "unknown mode refused: %s", dl_errmsg());
    /* one shard: cluster mode is the whole corpus, as iid */
    x = open_shard(DL_DATA_SHARD_CLUSTER, 0, 1, 1, 1, &rc);
    CHECK(rc == 0 && dl_data_train_seqs(x) == na, "cluster mode with 1 shard: the whole corpus");
    dl_data_close(&x);
    dl_data_close(&all);
    free(aoff), free(got);
    return CHECK_DONE("test_data_cluster");
}
