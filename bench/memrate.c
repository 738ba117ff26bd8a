/* memrate: the references of bench/sync_load.sh's capacity case, on one
 * thread of this machine: memcpy bytes/s, and the merge arithmetic
 * (token-weighted mean of M deltas + the outer Nesterov step, the kernels
 * dloco-sync merges with, kernels/outer.h) in delta bytes merged per second.
 * Usage: memrate [floats per fragment (default 5200000, GPT-2 124M / 24)] [M (16)] [seconds per figure (1)]
 * Prints "memcpy_bytes_per_s X" and "merge_bytes_per_s Y", best of 3 runs each, and
 * "memcpy_cpu_bytes_per_s Z": memcpy's bytes per second of this thread's CPU time (best of the
 * same runs), the figure to set against another process's CPU seconds on a shared core (wall
 * time counts what other processes on the core took). */
#include "core/clock.h"
#include "kernels/outer.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* This thread's CPU seconds. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 5200000;
    int M = argc > 2 ? atoi(argv[2]) : 16;
    double secs = argc > 3 ? atof(argv[3]) : 1.0;
    if (n < 1024 || M < 1 || M > 1024 || !(secs > 0)) {
        fprintf(stderr, "usage: memrate [floats >= 1024] [M 1..1024] [seconds > 0]\n");
        return 2;
    }
    omp_set_num_threads(1); /* one thread: the figures are per core */
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    float *params = malloc(n * sizeof(float)), *mom = calloc(n, sizeof(float)), *merged = malloc(n * sizeof(float));
    float **x = malloc((size_t)M * sizeof(float *));
    double *w = malloc((size_t)M * sizeof(double));
    if (!a || !b || !params || !mom || !merged || !x || !w) return 2;
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)(i % 1000) * 1e-3f;
        params[i] = 0.02f * (float)((i * 7919) % 1000) * 1e-3f;
    }
    memset(b, 0, n * sizeof(float));
    for (int k = 0; k < M; k++) {
        if (!(x[k] = malloc(n * sizeof(float)))) return 2;
        for (size_t i = 0; i < n; i++) x[k][i] = 1e-4f * (float)((i + (size_t)k * 31) % 200) - 1e-2f;
        w[k] = 1.0 + 0.1 * k;
    }

    double best_copy = 0, best_merge = 0, best_copy_cpu = 0;
    for (int r = 0; r < 3; r++) {
        long it = 0;
        double t0 = dl_clock_s(), c0 = cpu_s(), t;
        do {
            memcpy(it & 1 ? a : b, it & 1 ? b : a, n * sizeof(float));
            it++;
        } while ((t = dl_clock_s() - t0) < secs);
        double c = cpu_s() - c0;
        double bps = (double)it * (double)n * sizeof(float) / t;
        if (bps > best_copy) best_copy = bps;
        if (c > 0 && (double)it * (double)n * sizeof(float) / c > best_copy_cpu)
            best_copy_cpu = (double)it * (double)n * sizeof(float) / c;
    }
    for (int r = 0; r < 3; r++) {
        long it = 0;
        double t0 = dl_clock_s(), t;
        do {
            dl_cpu_weighted_mean(merged, (const float *const *)x, w, M, n);
            dl_cpu_nesterov(params, mom, merged, n, 0.7f, 0.9f);
            it++;
        } while ((t = dl_clock_s() - t0) < secs);
        double bps = (double)it * (double)M * (double)n * sizeof(float) / t;
        if (bps > best_merge) best_merge = bps;
    }
    /* keep the results live */
    volatile float sink = a[n / 2] + b[n / 3] + params[n / 5];
    (void)sink;
    printf("memcpy_bytes_per_s %.6g\n", best_copy);
    printf("merge_bytes_per_s %.6g\n", best_merge);
    printf("memcpy_cpu_bytes_per_s %.6g\n", best_copy_cpu);
    printf("fragment_floats %zu\nM %d\n", n, M);
    for (int k = 0; k < M; k++) free(x[k]);
    free(x);
    free(w);
    free(a);
    free(b);
    free(params);
    free(mom);
    free(merged);
    return 0;
}
