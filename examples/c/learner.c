/* A dloco learner in C with its own update rule, built against the installed library only:
 *   cc learner.c $(pkg-config --cflags --libs dloco-learner) -lm -o learner
 *   ./learner tcp://127.0.0.1:5555 RUN_ID LEARNER_ID STEPS [OPTIONS.ini]
 * The model is laid out as dloco's GPT-2 (L=2 C=32 T=32 V=256, what `dloco-sync --n_layer 2 --n_embd 32
 * --seq_len 32 --vocab 256` serves); the rule pulls every parameter toward a target by gradient steps on
 * 0.5 (theta - target)^2, so the run's merges have something to average. */
#include <dloco/learner.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static dloco_learner *L;
static void on_signal(int sig) { (void)sig; dloco_learner_stop(L); } /* async-signal-safe */

int main(int argc, char **argv)
{
    if (argc < 5) return fprintf(stderr, "usage: %s ENDPOINT RUN_ID LEARNER_ID STEPS [OPTIONS.ini]\n", argv[0]), 2;
    if (dloco_learner_api_version() / 10000 != DLOCO_LEARNER_API_MAJOR) return fprintf(stderr, "wrong library\n"), 2;
    dloco_gpt2_config g = {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 32, .vocab = 256};
    int nt = dloco_learner_gpt2_manifest(&g, NULL, 0);
    dloco_tensor *manifest = calloc((size_t)nt, sizeof *manifest);
    dloco_learner_gpt2_manifest(&g, manifest, nt);
    dloco_learner_opts o;
    dloco_learner_opts_init(&o);
    o.connect = argv[1], o.run_id = argv[2], o.learner_id = argv[3], o.config_path = argc > 5 ? argv[5] : NULL;
    o.fragments = 4, o.tensors = manifest, o.n_tensors = nt, o.gpt2 = &g;
    o.max_tokens_per_step = 8 * 32; /* what one step claims: a batch of 8 sequences of 32 tokens */
    if (dloco_learner_open(&o, &L)) return fprintf(stderr, "open: %s\n", dloco_learner_errmsg(NULL)), 1;
    uint64_t n = dloco_learner_numel(L);
    float *theta = calloc(n, sizeof *theta); /* join overwrites it with the global model */
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    int rc = dloco_learner_bind_contiguous(L, theta, n);
    if (!rc) rc = dloco_learner_join(L, 30000);
    dloco_step_info info = {.struct_size = sizeof info};
    for (long s = 0; !rc && s < atol(argv[4]) && !info.stop_requested; s++) {
        double loss = 0;
        for (uint64_t i = 0; i < n; i++) {
            float d = theta[i] - 0.05f * sinf((float)i); /* the target differs per element */
            loss += 0.5 * d * d;
            theta[i] -= 0.1f * d;
        }
        rc = dloco_learner_step(L, o.max_tokens_per_step, loss / (double)n, -1, &info);
    }
    int left = rc ? rc : dloco_learner_finish(L, -1, info.stop_requested ? "signal" : "done");
    dloco_learner_stats st = {.struct_size = sizeof st};
    dloco_learner_get_stats(L, &st);
    printf("steps %llu pushes %llu accepted %llu adopted %llu unanswered %d\n", (unsigned long long)st.steps,
           (unsigned long long)st.pushes, (unsigned long long)st.accepted, (unsigned long long)st.adopted, left);
    if (rc) fprintf(stderr, "learner: %s: %s\n", dloco_learner_strerror(rc), dloco_learner_errmsg(L));
    dloco_learner_close(&L);
    free(theta);
    free(manifest);
    return rc ? 1 : 0;
}
