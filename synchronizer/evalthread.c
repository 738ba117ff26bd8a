/* Background evaluation thread of the synchronizer (see evalthread.h). */
#include "synchronizer/evalthread.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"

struct dl_evalthread {
    dl_evaluate *ev;
    const dl_plan *plan;
    dl_store *store;
    int threads;
    void (*wake)(void *);
    void *ctx;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int requested, running, quit; /* under mu */
    atomic_int stop;              /* close: an evaluation in progress ends at its next batch */
    int have, ok;                 /* a result waits for dl_evalthread_take */
    dl_store_eval res;
    char err[320];
};

static void *eval_main(void *arg)
{
    dl_evalthread *t = arg;
    omp_set_num_threads(t->threads); /* this thread's parallel regions only */
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->requested && !t->quit) pthread_cond_wait(&t->cv, &t->mu);
        if (t->quit) break;
        t->requested = 0;
        t->running = 1;
        pthread_mutex_unlock(&t->mu);
        dl_store_eval r = {0};
        double loss = 0;
        dl_err_clear();
        int rc = dl_evaluate_load(t->ev, t->store, t->plan, &r.version);
        /* the model is loaded and the forward passes begin: what a stop during an evaluation waits on */
        if (!rc)
            dl_event("eval_start", "version=%llu seqs=%d", (unsigned long long)r.version, dl_evaluate_seqs(t->ev));
        if (!rc) rc = dl_evaluate_run(t->ev, &t->stop, &loss);
        r.loss = loss;
        r.seqs = (uint32_t)dl_evaluate_seqs(t->ev);
        r.wallclock_ns = dl_wallclock_ns();
        pthread_mutex_lock(&t->mu);
        t->running = 0;
        t->have = 1;
        t->ok = rc == 0;
        t->res = r;
        snprintf(t->err, sizeof t->err, "%s: %s", dl_strerror(rc), dl_errmsg());
        pthread_mutex_unlock(&t->mu);
        t->wake(t->ctx);
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int dl_evalthread_open(const dl_model_config *m, const dl_plan *plan, dl_store *store, const dl_evaluate_opts *o,
                       int threads, void (*wake)(void *), void *ctx, dl_evalthread **out)
{
    *out = NULL;
    dl_evalthread *t = dl_xcalloc(1, sizeof *t);
    int rc = dl_evaluate_open(m, o, &t->ev);
    if (rc) {
        free(t);
        return rc;
    }
    t->plan = plan;
    t->store = store;
    t->threads = threads > 0 ? threads : 1;
    t->wake = wake;
    t->ctx = ctx;
    atomic_init(&t->stop, 0);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    if (pthread_create(&t->th, NULL, eval_main, t)) DL_PANIC("pthread_create (evaluation thread) failed");
    *out = t;
    return 0;
}

int dl_evalthread_request(dl_evalthread *t)
{
    pthread_mutex_lock(&t->mu);
    int busy = t->running || t->requested;
    if (!busy) {
        t->requested = 1;
        pthread_cond_signal(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return busy;
}

int dl_evalthread_take(dl_evalthread *t, dl_store_eval *out, int *ok, char *err, size_t cap)
{
    pthread_mutex_lock(&t->mu);
    int have = t->have;
    if (have) {
        *out = t->res;
        *ok = t->ok;
        snprintf(err, cap, "%s", t->err);
        t->have = 0;
    }
    pthread_mutex_unlock(&t->mu);
    return have;
}

void dl_evalthread_close(dl_evalthread **tp)
{
    if (!tp || !*tp) return;
    dl_evalthread *t = *tp;
    atomic_store(&t->stop, 1);
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->th, NULL);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    dl_evaluate_close(&t->ev);
    free(t);
    *tp = NULL;
}
