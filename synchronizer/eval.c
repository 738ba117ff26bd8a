/* The synchronizer's evaluation of the global model: the periodic one (a
 * thread, synchronizer/evalthread.h, polled from the loop) and the final one at a clean stop. */
#include "synchronizer/sync_int.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"
#include "gpt/evaluate.h"
#include "gpt/gpt.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* A finished periodic evaluation: event, metric, and the store's record. */
void dl_eval_poll(dl_sync *s)
{
    dl_store_eval r;
    int ok = 0;
    char err[320];
    if (!s->evalt || !dl_evalthread_take(s->evalt, &r, &ok, err, sizeof err)) return;
    if (!ok) {
        char eb[400];
        DL_WARN("periodic evaluation failed: %s", err);
        dl_event("eval_failed", "reason=%s", dl_event_str(err, eb, sizeof eb));
        return;
    }
    s->met.has_eval = 1;
    s->met.evals++;
    s->met.eval_version = r.version;
    s->met.eval_loss = r.loss;
    s->met.eval_seqs = (int)r.seqs;
    s->met.eval_wall = r.wallclock_ns;
    char ed[600];
    DL_INFO("global model at total version %llu: val loss %.4f on %s (%u sequences)", (unsigned long long)r.version,
            r.loss, s->cfg.eval_data, r.seqs);
    dl_event("eval", "version=%llu loss=%.6f seqs=%u data=%s final=0", (unsigned long long)r.version, r.loss, r.seqs,
             dl_event_str(s->cfg.eval_data, ed, sizeof ed));
    if (s->stopping) return;
    dl_job *j = dl_job_new(DL_JOB_EVAL);
    j->erec = r;
    submit(s, j);
}

static void on_eval_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    dl_sync *s = w->data;
    if (!s->stopping && dl_evalthread_request(s->evalt))
        DL_DEBUG("periodic evaluation still running: this one skipped");
}

/* eval_every_s > 0: the evaluation thread over this store; a data file that
 * cannot be read is a warning (the default is on), not a start-up error. */
void dl_eval_open(dl_sync *s)
{
    dl_store_eval last;
    if (dl_store_get_eval(s->store, &last) == 0) {
        s->met.has_eval = 1;
        s->met.eval_version = last.version;
        s->met.eval_loss = last.loss;
        s->met.eval_seqs = (int)last.seqs;
        s->met.eval_wall = last.wallclock_ns;
    }
    /* the data the run is evaluated on, for dloco eval and status; the
     * built-in default may not be what the learners read: say so */
    dl_store_evaldata rec = {.val_frac = s->cfg.eval_val_frac};
    snprintf(rec.path, sizeof rec.path, "%s", s->cfg.eval_data);
    snprintf(rec.format, sizeof rec.format, "auto");
    if (s->cfg.eval_data[0] && dl_store_put_evaldata(s->store, &rec))
        DL_WARN("could not record the evaluation data in the store: %s", dl_errmsg());
    if (s->cfg.eval_data_default && s->cfg.eval_every_s > 0 && s->cfg.shards <= 1)
        DL_WARN("the global model is evaluated on %s, the built-in default: if the learners train on other data, "
                "give dloco-sync --eval_data their data (same vocab), or the validation losses shown are not of "
                "their data", s->cfg.eval_data);
    if (s->cfg.eval_every_s <= 0) return;
    if (s->cfg.manifest) {
        DL_INFO("periodic evaluation off: it evaluates dloco's GPT-2 only, and this run's model is described by a "
                "manifest");
        return;
    }
    if (s->cfg.shards > 1) {
        DL_INFO("periodic evaluation off: shard %d of %d holds only its own fragments", s->cfg.shard, s->cfg.shards);
        return;
    }
    dl_evaluate_opts o = {.data = s->cfg.eval_data,
                          .val_frac = s->cfg.eval_val_frac,
                          .batch = s->cfg.eval_batch > 0 ? s->cfg.eval_batch : 8,
                          .seqs = s->cfg.eval_seqs > 0 ? s->cfg.eval_seqs : 256};
    size_t need = dl_gpt_open_bytes(&s->cfg.model, o.batch);
    if (s->cfg.eval_max_bytes > 0 && need > (uint64_t)s->cfg.eval_max_bytes) {
        char eb[400], msg[300];
        snprintf(msg, sizeof msg, "it would hold %.0f MiB (model state + activations of eval_batch %d), more than "
                 "eval_max_mb %lld: lower eval_batch or raise eval_max_mb", (double)need / 1048576.0, o.batch,
                 (long long)(s->cfg.eval_max_bytes >> 20));
        DL_WARN("periodic evaluation off: %s", msg);
        dl_event("eval_failed", "reason=%s", dl_event_str(msg, eb, sizeof eb));
        return;
    }
    s->eval_opts = o;
    if (dl_evalthread_open(&s->cfg.model, s->plan, s->store, &o, s->cfg.eval_threads, dl_sync_wake, s, &s->evalt)) {
        char eb[400];
        DL_WARN("periodic evaluation off: %s (option eval_data)", dl_errmsg());
        dl_event("eval_failed", "reason=%s", dl_event_str(dl_errmsg(), eb, sizeof eb));
        return;
    }
    ev_timer_init(&s->eval_timer, on_eval_timer, s->cfg.eval_every_s, s->cfg.eval_every_s);
    s->eval_timer.data = s;
    ev_timer_start(s->loop, &s->eval_timer);
}

/* The final evaluation's bound: a second SIGTERM/SIGINT, or eval_final_max_s. */
static atomic_int final_stop;
static void on_final_signal(int sig)
{
    (void)sig;
    atomic_store(&final_stop, 1);
}

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int max_s;
} final_watch;

static void *final_watchdog(void *arg)
{
    final_watch *w = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += w->max_s;
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT) {
            atomic_store(&final_stop, 1);
            break;
        }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int dl_sync_final_eval(dl_sync *s)
{
    if (!s->evalt || s->cfg.eval_final_max_s <= 0) return 0;
    /* the thread's evaluation in progress (if any) ends; this one runs here,
     * after the loop and the merge worker have finished */
    dl_evalthread_close(&s->evalt);
    dl_evaluate *ev = NULL;
    dl_store_eval r = {0};
    double loss = 0;
    char eb[600], ed[600];
    /* one batch first: an evaluation that would outlast eval_final_max_s is
     * not started (a stop is never held up by one known to be too long) */
    dl_evaluate_opts probe = s->eval_opts;
    probe.seqs = probe.batch;
    int rc = dl_evaluate_open(&s->cfg.model, &probe, &ev);
    if (!rc) rc = dl_evaluate_load(ev, s->store, s->plan, &r.version);
    if (!rc && s->met.has_eval && s->met.eval_version == r.version) {
        /* the last periodic evaluation was of this model: it is the final one (the store holds it) */
        DL_INFO("final global model at total version %llu: already evaluated (val loss %.4f on %s)",
                (unsigned long long)r.version, s->met.eval_loss, s->cfg.eval_data);
        dl_event("eval", "version=%llu loss=%.6f seqs=%d data=%s final=1", (unsigned long long)r.version,
                 s->met.eval_loss, s->met.eval_seqs, dl_event_str(s->cfg.eval_data, ed, sizeof ed));
        dl_evaluate_close(&ev);
        return 0;
    }
    double t0 = dl_clock_s();
    if (!rc) rc = dl_evaluate_run(ev, NULL, &loss);
    double predicted = (dl_clock_s() - t0) * ((s->eval_opts.seqs + probe.batch - 1) / probe.batch);
    dl_evaluate_close(&ev);
    if (!rc && predicted > s->cfg.eval_final_max_s) {
        DL_INFO("final evaluation skipped: it would take about %.0f s, more than eval_final_max_s %d (the store keeps "
                "the last periodic evaluation)", predicted, s->cfg.eval_final_max_s);
        dl_event("eval_skipped", "predicted_s=%.1f max_s=%d", predicted, s->cfg.eval_final_max_s);
        return 0;
    }
    if (!rc) rc = dl_evaluate_open(&s->cfg.model, &s->eval_opts, &ev);
    if (!rc) rc = dl_evaluate_load(ev, s->store, s->plan, &r.version);
    if (!rc) {
        DL_INFO("evaluating the final global model at total version %llu on %s (at most %d s; SIGTERM again skips it)",
                (unsigned long long)r.version, s->cfg.eval_data, s->cfg.eval_final_max_s);
        atomic_store(&final_stop, 0);
        struct sigaction sa = {.sa_handler = on_final_signal}, old_int, old_term;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, &old_int);
        sigaction(SIGTERM, &sa, &old_term);
        final_watch w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .max_s = s->cfg.eval_final_max_s};
        pthread_t th;
        int watching = pthread_create(&th, NULL, final_watchdog, &w) == 0;
        rc = dl_evaluate_run(ev, &final_stop, &loss);
        if (watching) {
            pthread_mutex_lock(&w.mu);
            w.done = 1;
            pthread_cond_signal(&w.cv);
            pthread_mutex_unlock(&w.mu);
            pthread_join(th, NULL);
        }
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        if (rc == DL_EAGAIN && atomic_load(&final_stop)) {
            char why[160];
            snprintf(why, sizeof why, "%s", dl_errmsg());
            rc = dl_err(DL_ETIMEDOUT, "%s (eval_final_max_s %d, or a second signal): the store keeps the last periodic "
                        "evaluation", why, s->cfg.eval_final_max_s);
        }
    }
    if (!rc) {
        r.loss = loss;
        r.seqs = (uint32_t)dl_evaluate_seqs(ev);
        r.wallclock_ns = dl_wallclock_ns();
        rc = dl_store_put_eval(s->store, &r);
    }
    dl_evaluate_close(&ev);
    if (rc) {
        char msg[400];
        snprintf(msg, sizeof msg, "final evaluation: %s: %s", dl_strerror(rc), dl_errmsg());
        DL_WARN("%s", msg);
        dl_event("eval_failed", "reason=%s", dl_event_str(msg, eb, sizeof eb));
        return rc;
    }
    s->met.has_eval = 1;
    s->met.evals++;
    s->met.eval_version = r.version;
    s->met.eval_loss = r.loss;
    s->met.eval_seqs = (int)r.seqs;
    s->met.eval_wall = r.wallclock_ns;
    DL_INFO("final global model at total version %llu: val loss %.4f on %s (%u sequences)",
            (unsigned long long)r.version, r.loss, s->cfg.eval_data, r.seqs);
    dl_event("eval", "version=%llu loss=%.6f seqs=%u data=%s final=1", (unsigned long long)r.version, r.loss, r.seqs,
             dl_event_str(s->cfg.eval_data, ed, sizeof ed));
    return 0;
}

const char *dl_sync_endpoint(const dl_sync *s) { return s->endpoint; }
