/* Synchronous local SGD in one process: M learners (the real trainer, each on
 * its own data shard) step in lockstep and average their parameters every H
 * steps. The reference the networked system is held against: if it matches
 * this, the asynchrony costs nothing and any gap to data-parallel is the
 * algorithm's. Usage: bench_localsgd key=value ... (see defaults below). */
#include "core/err.h"
#include "kernels/blas_select.h"
#include "learner/train.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXM 64

int main(int argc, char **argv)
{
    if (dl_blas_select(&argc, argv)) return 2;
    /* M learners x B sequences, averaged every H steps; fleet = --adam_fleet */
    long M = 4, H = 8, steps = 250, B = 16, L = 4, C = 128, NH = 4, T = 128, every = 64;
    double lr = 3e-3, fleet = 0;
    const char *data = "/usr/share/games/fortunes";
    for (int i = 1; i < argc; i++) {
        char k[32];
        const char *eq = strchr(argv[i], '=');
        if (!eq || eq - argv[i] >= (long)sizeof k) goto usage;
        snprintf(k, sizeof k, "%.*s", (int)(eq - argv[i]), argv[i]);
        const char *v = eq + 1;
        long *lp = !strcmp(k, "M") ? &M : !strcmp(k, "H") ? &H : !strcmp(k, "steps") ? &steps : !strcmp(k, "B") ? &B
                 : !strcmp(k, "L") ? &L : !strcmp(k, "C") ? &C : !strcmp(k, "NH") ? &NH : !strcmp(k, "T") ? &T
                 : !strcmp(k, "every") ? &every : NULL;
        if (lp) *lp = atol(v);
        else if (!strcmp(k, "lr")) lr = atof(v);
        else if (!strcmp(k, "fleet")) fleet = atof(v);
        else if (!strcmp(k, "data")) data = v;
        else goto usage;
    }
    if (M < 1 || M > MAXM || H < 1 || steps < 1 || B < 1 || every < 1) goto usage;

    dl_train_cfg tc = {
        .model = {.n_layer = (int)L, .n_head = (int)NH, .n_embd = (int)C, .seq_len = (int)T, .vocab = 256},
        .batch = (int)B, .steps = steps, .lr = (float)lr, .warmup = steps > 20 ? 20 : steps / 10,
        .min_lr_frac = 0.1f,
        .adamw = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f},
        .seed = 1337, .val_batches = (int)(256 / B > 0 ? 256 / B : 1), .fleet = (float)fleet};
    dl_trainer *t[MAXM];
    for (int i = 0; i < M; i++) {
        /* the learners' options of bench/quality.sh: shard i of M, seed 7+i */
        dl_data_opts o = {.path = data, .format = "auto", .seq_len = (int)T, .vocab = 256, .val_frac = 0.05,
                          .seed = (uint64_t)(7 + i), .shard_index = M > 1 ? i : 0, .shard_count = (int)M};
        dl_data *d = NULL;
        int rc = dl_data_open(&o, &d);
        if (!rc) rc = dl_trainer_open(&tc, d, &t[i]);
        if (rc) {
            fprintf(stderr, "bench_localsgd: %s: %s\n", dl_strerror(rc), dl_errmsg());
            return 2;
        }
    }
    size_t n = dl_trainer_num_params(t[0]);
    float *g = malloc(n * sizeof *g);
    memcpy(g, dl_gpt_params(dl_trainer_model(t[0])), n * sizeof *g);
    printf("local SGD: %ld learners x B=%ld, average every H=%ld, %ld steps, lr %g, adam_fleet %g, %d threads\n", M, B,
           H, steps, lr, fleet, omp_get_max_threads());
    double val = 0;
    for (long s = 1; s <= steps; s++) {
        for (int i = 0; i < M; i++) {
            double loss;
            if (dl_trainer_step(t[i], &loss, NULL)) return fprintf(stderr, "step: %s\n", dl_errmsg()), 2;
        }
        if (s % H && s != steps) continue;
        /* the mean of the learners' parameters becomes everyone's (outer lr 1, no momentum) */
        memset(g, 0, n * sizeof *g);
        for (int i = 0; i < M; i++) {
            const float *th = dl_gpt_params(dl_trainer_model(t[i]));
            for (size_t k = 0; k < n; k++) g[k] += th[k] / (float)M;
        }
        for (int i = 0; i < M; i++) memcpy(dl_gpt_params(dl_trainer_model(t[i])), g, n * sizeof *g);
        if (s % every == 0 || s == steps) {
            dl_trainer_eval(t[0], &val);
            printf("step %5ld | val loss %.4f\n", s, val);
            fflush(stdout);
        }
    }
    printf("final val loss %.4f\n", val);
    for (int i = 0; i < M; i++) dl_trainer_close(&t[i]);
    free(g);
    return 0;
usage:
    fprintf(stderr, "usage: bench_localsgd [M=4] [H=8] [steps=250] [B=16] [L=4] [C=128] [NH=4] [T=128] [lr=3e-3] "
                    "[fleet=0] [every=64] [data=PATH]\n");
    return 2;
}
