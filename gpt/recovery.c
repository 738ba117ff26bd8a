/* dloco-learner's recovery file: a tagged checkpoint (gpt/ckpt.h) copied between steps and written by a
 * thread of its own, and the checks that turn any bad file into a warning and a fresh start. */
#include "gpt/recovery.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/hash.h"
#include "core/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct dl_recovery {
    char *path, *id;
    char *lpath;             /* path.node: the learner library's state */
    dl_recovery_copy_fn lfn; /* its copy, or NULL */
    dl_recovery_write_fn lwrite;
    void *lctx;
    void *lbuf;              /* the copy handed to the writer with snap (llen 0: none) */
    size_t lcap, llen;
    double every_s, budget;
    double copy_s, write_s; /* the last copy's and the last write's seconds (the budget's measure) */
    int64_t every_steps, max_step;
    uint64_t tag;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy; /* the writer owns snap (a copy handed over, not yet written) */
    int quit;
    dl_trainer_snap snap;
    double t_last;     /* dl_clock_s of the last copy (or the open) */
    int64_t step_last; /* its step */
    dl_recovery_stats st;
};

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(dl_xmalloc(n), s, n);
}

uint64_t dl_recovery_tag(const char *run_id, const char *learner_id)
{
    uint64_t h = dl_hash64(run_id, strlen(run_id) + 1, 0x7265636f76ull); /* the NUL keeps ("ab","c") != ("a","bc") */
    h = dl_hash64(learner_id, strlen(learner_id), h);
    return h ? h : 1;
}

static uint64_t snap_moments_hash(const dl_trainer_snap *s)
{
    return dl_hash64(s->buf + s->nparams, (size_t)(s->gpa || s->fleet ? 3 : 2) * s->nparams * sizeof(float), 0);
}

/* The time between files: with a budget, the last copy and write over it (a
 * file costs at most that share of the time), within [DL_RECOVERY_MIN_S,
 * every_s]; the first file comes after DL_RECOVERY_MIN_S. r->mu held or the
 * writer idle. */
static double interval(const dl_recovery *r)
{
    if (!(r->budget > 0) || !(r->every_s > 0)) return r->every_s;
    double t = (r->copy_s + r->write_s) / r->budget;
    if (t < DL_RECOVERY_MIN_S) t = DL_RECOVERY_MIN_S;
    return t < r->every_s ? t : r->every_s;
}

/* the writer: one file per handed-over copy; a failure is warned and the previous file stays */
static void write_snap(dl_recovery *r)
{
    double t0 = dl_clock_s();
    /* the learner's state first: a kill between the two leaves it at a newer
     * step than the trainer's file; the save kept the one before as
     * FILE.node.prev, and the restore takes that one (docs/LIBRARY.md) */
    int lrc = r->llen ? r->lwrite(r->lpath, r->lbuf, r->llen) : 0;
    if (lrc)
        DL_WARN("recovery: the learner state %s not written: %s (a restart fetches the fragments)", r->lpath,
                dl_errmsg());
    int rc = dl_trainer_snap_write(&r->snap, r->path);
    double dt = dl_clock_s() - t0;
    char ev_path[600];
    pthread_mutex_lock(&r->mu);
    r->st.write_s_sum += dt;
    r->write_s = dt;
    if (rc) r->st.failed++;
    else {
        r->st.writes++;
        r->st.last_step = r->snap.st.step;
    }
    pthread_mutex_unlock(&r->mu);
    if (rc) {
        DL_WARN("recovery file %s not written: %s (the previous one stays; check the disk of option state_dir)",
                r->path, dl_errmsg());
        dl_event("recovery_failed", "id=%s path=%s step=%lld", r->id, dl_event_str(r->path, ev_path, sizeof ev_path),
                 (long long)r->snap.st.step);
        return;
    }
    dl_event("recovery_saved",
             "id=%s path=%s step=%lld moments_hash=%016llx write_ms=%.3f learner_state=%d interval_s=%.3f", r->id,
             dl_event_str(r->path, ev_path, sizeof ev_path), (long long)r->snap.st.step,
             (unsigned long long)snap_moments_hash(&r->snap), dt * 1e3, r->llen && !lrc, interval(r));
}

static void *writer(void *arg)
{
    dl_recovery *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->busy && !r->quit) pthread_cond_wait(&r->cv, &r->mu);
        if (!r->busy) break;
        pthread_mutex_unlock(&r->mu);
        write_snap(r);
        pthread_mutex_lock(&r->mu);
        r->busy = 0;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int dl_recovery_open(const dl_recovery_opts *o, dl_recovery **out)
{
    *out = NULL;
    if (!o->path || !o->path[0]) return dl_err(DL_EINVAL, "recovery: no file path");
    if (!(o->every_s >= 0) || o->every_steps < 0) return dl_err(DL_EINVAL, "recovery: negative interval");
    if (!(o->budget >= 0 && o->budget < 1)) return dl_err(DL_EINVAL, "recovery: budget %g outside [0, 1)", o->budget);
    dl_recovery *r = dl_xcalloc(1, sizeof *r);
    r->path = dup_str(o->path);
    r->lpath = dl_xmalloc(strlen(o->path) + 6);
    sprintf(r->lpath, "%s.node", o->path);
    r->id = dup_str(o->id ? o->id : "");
    r->every_s = o->every_s;
    r->budget = o->budget;
    r->every_steps = o->every_steps;
    r->max_step = o->max_step;
    r->tag = o->run_tag;
    r->snap.st.run_tag = o->run_tag;
    r->st.last_step = -1;
    r->t_last = dl_clock_s();
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->th, NULL, writer, r)) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free(r->path);
        free(r->lpath);
        free(r->id);
        free(r);
        return dl_err(DL_ENOMEM, "recovery: cannot start the writer thread");
    }
    *out = r;
    return 0;
}

static void wait_idle(dl_recovery *r)
{
    pthread_mutex_lock(&r->mu);
    while (r->busy) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

void dl_recovery_close(dl_recovery **rp)
{
    dl_recovery *r = *rp;
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->quit = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->th, NULL);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    dl_trainer_snap_free(&r->snap);
    free(r->path);
    free(r->lpath);
    free(r->lbuf);
    free(r->id);
    free(r);
    *rp = NULL;
}

/* Why the file cannot be resumed ("" when it can), before anything is loaded. */
static int check_file(dl_recovery *r, dl_trainer *tr, char *why, size_t cap)
{
    dl_ckpt_state st;
    int hashed = 0;
    if (dl_ckpt_peek(r->path, &st, &hashed)) return snprintf(why, cap, "%s", dl_errmsg()), 1;
    if (!hashed || st.run_tag == 0)
        return snprintf(why, cap, "%s is a plain checkpoint, not a recovery file (give it to --resume)", r->path), 1;
    if (st.run_tag != r->tag)
        return snprintf(why, cap, "%s belongs to another run or learner id (its tag differs from run_id and id "
                                  "of this learner)", r->path), 1;
    if (st.step > r->max_step)
        return snprintf(why, cap, "%s is at step %lld, beyond this run's %lld steps", r->path, (long long)st.step,
                        (long long)r->max_step), 1;
    uint64_t seqs = dl_data_train_seqs(dl_trainer_data(tr));
    if (st.data.index > seqs)
        return snprintf(why, cap, "%s has data position %llu, beyond the %llu training sequences of this data", r->path,
                        (unsigned long long)st.data.index, (unsigned long long)seqs), 1;
    return 0;
}

int dl_recovery_load(dl_recovery *r, dl_trainer *tr, char *why, size_t cap)
{
    why[0] = 0;
    struct stat sb;
    if (stat(r->path, &sb) != 0 && errno == ENOENT) return 0;
    /* the file's checks first, then the load, which stages the whole state
     * and touches the trainer only when every array is read and checked */
    if (!check_file(r, tr, why, cap) && dl_trainer_resume(tr, r->path)) snprintf(why, cap, "%s", dl_errmsg());
    if (why[0]) {
        char aside[4200], ev_path[600], ev_why[800];
        snprintf(aside, sizeof aside, "%s.rejected", r->path);
        if (rename(r->path, aside) != 0) snprintf(aside, sizeof aside, "(not moved: %s)", strerror(errno));
        DL_WARN("recovery file not used, starting fresh: %s; moved to %s", why, aside);
        dl_event("recovery_refused", "id=%s path=%s reason=%s", r->id, dl_event_str(r->path, ev_path, sizeof ev_path),
                 dl_event_str(why, ev_why, sizeof ev_why));
        return 0;
    }
    r->step_last = dl_trainer_steps_done(tr);
    char ev_path[600];
    dl_event("recovery_resumed", "id=%s path=%s step=%lld moments_hash=%016llx", r->id,
             dl_event_str(r->path, ev_path, sizeof ev_path), (long long)r->step_last,
             (unsigned long long)dl_recovery_moments_hash(tr));
    return 1;
}

uint64_t dl_recovery_moments_hash(dl_trainer *tr)
{
    dl_trainer_snap s = {0};
    uint64_t h = dl_trainer_snap_take(tr, &s) ? 0 : snap_moments_hash(&s);
    dl_trainer_snap_free(&s);
    return h;
}

int dl_recovery_prepare(dl_recovery *r, dl_trainer *tr)
{
    wait_idle(r);
    return dl_trainer_snap_take(tr, &r->snap);
}

void dl_recovery_set_learner(dl_recovery *r, dl_recovery_copy_fn fn, dl_recovery_write_fn write, void *ctx)
{
    wait_idle(r);
    r->lfn = fn;
    r->lwrite = write;
    r->lctx = ctx;
}

const char *dl_recovery_learner_path(const dl_recovery *r) { return r->lpath; }

/* the learner's state at the trainer snapshot's step (the writer is idle); none when it fails */
static void copy_learner(dl_recovery *r)
{
    r->llen = 0;
    if (r->lfn && r->lfn(r->lctx, &r->lbuf, &r->lcap, &r->llen)) {
        r->llen = 0;
        DL_WARN("recovery: no copy of the learner state: %s (a restart fetches the fragments)", dl_errmsg());
    }
}

int dl_recovery_step(dl_recovery *r, dl_trainer *tr)
{
    int64_t step = dl_trainer_steps_done(tr);
    double now = dl_clock_s();
    pthread_mutex_lock(&r->mu);
    double every = interval(r);
    pthread_mutex_unlock(&r->mu);
    int due = (every > 0 && now - r->t_last >= every) ||
              (r->every_steps > 0 && step - r->step_last >= r->every_steps);
    if (!due) return 0;
    pthread_mutex_lock(&r->mu);
    int busy = r->busy;
    if (busy) r->st.skipped++;
    pthread_mutex_unlock(&r->mu);
    r->t_last = now;
    r->step_last = step;
    if (busy) return 0; /* the writer is slower than the interval: the next copy waits one interval */
    int rc = dl_trainer_snap_take(tr, &r->snap);
    copy_learner(r);
    double dt = dl_clock_s() - now;
    pthread_mutex_lock(&r->mu);
    r->st.copies++;
    r->st.copy_s_sum += dt;
    r->copy_s = dt;
    if (dt > r->st.copy_s_max) r->st.copy_s_max = dt;
    if (rc) r->st.failed++;
    else r->busy = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (rc) DL_WARN("recovery: no copy of the training state at step %lld: %s", (long long)step, dl_errmsg());
    return rc == 0;
}

int dl_recovery_finish(dl_recovery *r, dl_trainer *tr)
{
    wait_idle(r);
    double t0 = dl_clock_s();
    int rc = dl_trainer_snap_take(tr, &r->snap);
    copy_learner(r);
    pthread_mutex_lock(&r->mu);
    r->copy_s = dl_clock_s() - t0;
    r->st.copy_s_sum += r->copy_s;
    pthread_mutex_unlock(&r->mu);
    if (rc) return rc;
    write_snap(r);
    dl_recovery_stats st;
    dl_recovery_get_stats(r, &st);
    return st.last_step == r->snap.st.step ? 0 : dl_err(DL_EIO, "recovery file %s not written", r->path);
}

int dl_recovery_remove(dl_recovery *r)
{
    wait_idle(r);
    char jpath[4200], prev[4200];
    snprintf(jpath, sizeof jpath, "%s.journal", r->lpath);
    snprintf(prev, sizeof prev, "%s.prev", r->lpath);
    unlink(r->lpath); /* the learner's state, its previous save and its push journal go with it (absent: nothing
                       * to do) */
    unlink(prev);
    unlink(jpath);
    if (unlink(r->path) != 0 && errno != ENOENT)
        return dl_err(DL_EIO, "cannot remove the recovery file %s: %s", r->path, strerror(errno));
    pthread_mutex_lock(&r->mu);
    r->st.removed = 1;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void dl_recovery_get_stats(dl_recovery *r, dl_recovery_stats *out)
{
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    out->interval_s = interval(r);
    pthread_mutex_unlock(&r->mu);
}
