/* A learner of a model dloco has never seen (a conv, an embedding, a norm), built like any outside program
 * against the installed library (pkg-config dloco-learner): test_library.sh runs it against dloco-sync
 * --init_from a safetensors file carrying the same manifest.
 *   api_any_model ENDPOINT LEARNER_ID STEPS OPTIONS.ini [other]   ("other": one dim differs: refused) */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <dloco/learner.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv)
{
    if (argc < 5) return fprintf(stderr, "usage: %s ENDPOINT ID STEPS OPTIONS.ini [other]\n", argv[0]), 2;
    dloco_tensor m[3] = {{.name = "conv.weight", .ndim = 4, .role = DLOCO_ROLE_MATRIX, .shape = {8, 3, 3, 3}},
                         {.name = "tok.embedding", .ndim = 2, .role = DLOCO_ROLE_EMBEDDING, .shape = {100, 16}},
                         {.name = "norm.weight", .ndim = 1, .role = DLOCO_ROLE_VECTOR, .shape = {16}}};
    if (argc > 5 && !strcmp(argv[5], "other")) m[1].shape[1] = 17;
    dloco_learner_opts o;
    dloco_learner_opts_init(&o);
    o.connect = argv[1], o.run_id = "dloco", o.learner_id = argv[2], o.config_path = argv[4];
    o.fragments = 3, o.tensors = m, o.n_tensors = 3, o.max_tokens_per_step = 64;
    dloco_learner *l;
    if (dloco_learner_open(&o, &l)) return fprintf(stderr, "open: %s\n", dloco_learner_errmsg(NULL)), 1;
    /* one buffer per tensor (the host binding of separate tensors) */
    float *t[3];
    for (int i = 0; i < 3; i++) {
        size_t n = 1;
        for (int d = 0; d < m[i].ndim; d++) n *= (size_t)m[i].shape[d];
        t[i] = calloc(n, sizeof(float));
    }
    int rc = dloco_learner_bind_host(l, t, 3);
    if (!rc) rc = dloco_learner_join(l, 20000);
    for (int s = 0; !rc && s < atoi(argv[3]); s++) {
        for (int i = 0; i < 3; i++) t[i][0] += 0.01f; /* an update rule, enough to push */
        nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL); /* a step takes time: decisions come between */
        rc = dloco_learner_step(l, 64, 1.0, -1, NULL);
    }
    if (!rc) rc = dloco_learner_finish(l, -1, "done") < 0;
    if (rc) fprintf(stderr, "learner: %s: %s\n", dloco_learner_strerror(rc), dloco_learner_errmsg(l));
    dloco_learner_close(&l);
    for (int i = 0; i < 3; i++) free(t[i]);
    return rc ? 1 : 0;
}
