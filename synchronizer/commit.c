/* The commit: a round the policy closes goes to the worker as a merge job;
 * the merge comes back (dl_commit_merge_done) and answers its contributors.
 * A commit the store fails backs off before the next one (docs/FAILURE_MODEL.md). */
#include "synchronizer/sync_int.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"
#include "synchronizer/round.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Back-off after a failed commit, ms: DL_COMMIT_BACKOFF_MIN_MS after the
 * first failure, doubling with each failure in a row up to
 * DL_COMMIT_BACKOFF_MAX_MS. A disk that fails every write then costs one
 * failed round per back-off instead of one per push (a round every ~40 ms
 * with 2 learners on loopback), and a disk that comes back is found within
 * the back-off's length. */
#define DL_COMMIT_BACKOFF_MIN_MS 100u
#define DL_COMMIT_BACKOFF_MAX_MS 3200u

uint32_t dl_commit_backoff_left_ms(const dl_sync *s, int64_t now)
{
    if (!s->commit_fails || now >= s->commit_until_ns) return 0;
    int64_t ms = (s->commit_until_ns - now + 999999) / 1000000;
    return ms > 0 ? (uint32_t)ms : 1;
}

static const char *id_of_slot(void *ctx, uint32_t slot)
{
    dl_sync *s = ctx;
    return dl_registry_get(s->reg, (int)slot)->id;
}

static void submit_round(dl_sync *s, const dl_policy_round *r)
{
    int p = r->fragment;
    /* the share is the policy's (policy.h "Share"): per fragment, from pushes
     * that passed the guards */
    dl_round_in in = {.epoch = s->epoch,
                      .staleness_fn = dl_policy_sfn_name(s->cfg.policy.sfn),
                      .learner_id = id_of_slot,
                      .ctx = s,
                      .asides = s->aside[p],
                      .n_asides = s->naside[p]};
    dl_round_out out;
    dl_round_assemble(r, &in, &out);
    s->naside[p] = 0;

    dl_job *j = dl_job_new(DL_JOB_MERGE);
    j->mopts = s->cfg.merge;
    j->param_abs_max = s->cfg.guard.param_abs_max;
    j->fragment = p;
    j->version = r->version;
    j->share = out.share;
    j->rec = out.rec; /* the job owns the contributors now */
    j->m = r->n;
    j->deltas = dl_xcalloc((size_t)r->n, sizeof(float *));
    j->span_ss = dl_xcalloc((size_t)r->n, sizeof(double *));
    j->w = dl_xcalloc((size_t)r->n, sizeof(double));
    j->handles = dl_xcalloc((size_t)r->n, sizeof(uint64_t));
    for (int i = 0; i < r->n; i++) {
        j->handles[i] = r->contribs[i].handle;
        dl_pool_push *pp = dl_pool_get(s->pool, r->contribs[i].handle);
        pp->merging = 1;
        j->deltas[i] = pp->delta;
        j->span_ss[i] = pp->span_ss;
        j->w[i] = r->contribs[i].weight;
    }
    /* the ledger's pending changes and this round's applied tokens commit
     * with the merge, in its transaction */
    dl_ledger_take(s->ledger, &j->ledger);
    j->ledger.tokens[DL_LEDGER_APPLIED] = out.applied_tokens;
    char line[512];
    dl_policy_round_format(r, line, sizeof line);
    dl_syncmet_round(&s->met, r);
    DL_DEBUG("round closed: %s", line);
    submit(s, j);
}

void dl_commit_schedule(dl_sync *s)
{
    if (s->stopping) return;
    /* backing off: the probe's result (dl_commit_merge_done) schedules again */
    if (s->commit_probe) return;
    int64_t now = dl_clock_ns();
    dl_policy_round r;
    int64_t next;
    if (dl_commit_backoff_left_ms(s, now)) {
        next = s->commit_until_ns; /* rounds wait in the pool; the probe leaves then */
    } else {
        while (dl_policy_poll(s->policy, now, &r)) {
            submit_round(s, &r);
            if (s->commit_fails) { /* the back-off ran out: this round is the probe, alone */
                s->commit_probe = 1 + r.fragment;
                return;
            }
        }
        next = dl_policy_next_deadline(s->policy);
    }
    ev_timer_stop(s->loop, &s->deadline);
    if (next != DL_POLICY_NEVER) {
        double after = (double)(next - now) * 1e-9;
        ev_timer_set(&s->deadline, after > 0 ? after + 1e-4 : 1e-4, 0.0);
        ev_timer_start(s->loop, &s->deadline);
    }
}

/* A merge job back from the worker (on_wake): its contributors are answered
 * and the ledger moves them on; the new version is only marked owed to every
 * learner here. It leaves from dl_downlink_serve_owed, which on_wake calls
 * right after (and the tick), from a store snapshot in which the commit and
 * dl_policy_committed are both seen. A failed commit abandons the round. */
void dl_commit_merge_done(dl_sync *s, dl_job *j)
{
    int p = j->fragment;
    int64_t now = dl_clock_ns();
    if (s->commit_probe == 1 + p) s->commit_probe = 0; /* one job per fragment in flight: this is the probe */
    if (j->rc) {
        DL_ERROR("merge of fragment %d onto v%llu failed, round abandoned: %s", p, (unsigned long long)j->version,
                 j->err);
        char ebuf[400];
        dl_event("merge_failed", " frag=%d version=%llu reason=%s", p, (unsigned long long)j->version,
                 dl_event_str(j->err, ebuf, sizeof ebuf));
        if (j->store_failed) {
            /* the disk, not this round's values: back off before the next commit */
            int k = s->commit_fails < 6 ? s->commit_fails : 6;
            uint32_t ms = DL_COMMIT_BACKOFF_MIN_MS << k;
            s->commit_backoff_ms = ms < DL_COMMIT_BACKOFF_MAX_MS ? ms : DL_COMMIT_BACKOFF_MAX_MS;
            s->commit_fails++;
            s->commit_until_ns = now + (int64_t)s->commit_backoff_ms * 1000000;
            dl_event("commit_backoff", "frag=%d fails_in_row=%d backoff_ms=%u", p, s->commit_fails,
                     s->commit_backoff_ms);
            if (s->commit_fails == 1)
                DL_WARN("commits fail (%s): pushes are answered busy for %u ms, then one round probes the store; "
                        "free space on the store's filesystem or fix the disk",
                        j->err, s->commit_backoff_ms);
        }
        dl_policy_abandon(s->policy, p, now);
        /* nothing of the job's ledger delta was persisted: the pending part
         * goes back, the applied part never happened */
        j->ledger.tokens[DL_LEDGER_APPLIED] = 0;
        dl_ledger_untake(s->ledger, &j->ledger);
        for (int i = 0; i < j->m; i++) {
            dl_pool_push *pp = dl_pool_get(s->pool, j->handles[i]);
            dl_registry_learner *l = dl_registry_get(s->reg, (int)pp->learner);
            dl_ledger_failed(s->ledger, (int)pp->learner, p, pp->base_version, pp->tokens);
            /* answered REJECTED below: counted as the learner counts it */
            l->rejected++;
            s->rejected++;
            s->met.push_rejected[DL_SM_REJ_MERGE_FAILED]++;
            /* no rebase: the pushed progress is still in the learner's
             * parameters (theta - base) and goes into its next push */
            dl_downlink_ack(s, l, p, j->rec.contrib[i].base_version, DLOCO__V1__DECISION__DECISION_REJECTED, 0,
                            "merge failed on the synchronizer; the progress goes into your next push", 0);
            dl_pool_release(s->pool, j->handles[i]);
        }
        return;
    }
    uint64_t nv = j->version + 1;
    if (s->commit_fails) {
        dl_event("commit_recovered", "frag=%d fails_in_row=%d", p, s->commit_fails);
        DL_INFO("commits succeed again after %d failure(s) in a row: the back-off ends", s->commit_fails);
        s->commit_fails = 0;
        s->commit_backoff_ms = 0;
        s->commit_until_ns = 0;
    }
    if (j->update) {
        dl_downlink_keep(s, p, nv, j->update, j->update_bytes, j->update_codec);
        j->update = NULL;
    }
    double stale = 0, compute_s = 0;
    for (int i = 0; i < j->m; i++) {
        dl_pool_push *pp = dl_pool_get(s->pool, j->handles[i]);
        compute_s += pp->compute_s;
        dl_registry_learner *l = dl_registry_get(s->reg, (int)pp->learner);
        const dl_merge_contrib *mc = &j->rec.contrib[i];
        l->merged++;
        l->tokens_applied += mc->tokens;
        l->last_staleness = mc->staleness;
        dl_prom_hist_observe(&s->met.staleness, (double)mc->staleness);
        stale += (double)mc->staleness;
        s->stale_sum += mc->staleness;
        dl_ledger_merged(s->ledger, (int)pp->learner, p, pp->tokens);
        dl_guard_applied(s->guard, (int)pp->learner, p, pp->base_version);
        if (registered(s, (int)pp->learner)) {
            dl_downlink_ack(s, l, p, mc->base_version, DLOCO__V1__DECISION__DECISION_ACCEPTED, nv, "", 0);
            dl_downlink_owe(s, l, p); /* sent from a snapshot (on_wake serves it once the policy knows nv) */
        }
        /* one line per merged push, before the merge's own line: whose training
         * time (compute_s) went into which version, with its weight */
        char idbuf[4 * DL_STORE_ID_MAX + 8];
        dl_event("merge_contrib",
                 "frag=%d version=%llu id=%s base=%llu staleness=%llu tokens=%llu compute_s=%.6f weight=%.6g", p,
                 (unsigned long long)nv, dl_event_str(mc->learner_id, idbuf, sizeof idbuf),
                 (unsigned long long)mc->base_version, (unsigned long long)mc->staleness,
                 (unsigned long long)mc->tokens, pp->compute_s, mc->weight);
        dl_pool_release(s->pool, j->handles[i]);
    }
    /* every registered learner holds fragment p (a shard's learners hold
     * all of its fragments), contributor or not: it is owed nv, so nobody
     * stays behind. An Update it is owed and not yet sent ends at the newest
     * version anyway; a dead one is served when it is heard from again
     * (dl_downlink_serve_owed serves live learners only), with whatever is newest
     * then. */
    for (int i = 0; i < dl_registry_count(s->reg) && !s->cfg.unicast; i++) {
        dl_registry_learner *l = dl_registry_get(s->reg, i);
        if (l->used && registered(s, i)) dl_downlink_owe(s, l, p);
    }
    s->param_norm[p] = j->param_norm;
    s->merges++;
    s->merged_contribs += (uint64_t)j->m;
    s->met.tokens_merged += j->ledger.tokens[DL_LEDGER_APPLIED];
    dl_syncmet_merged(&s->met, p, (uint32_t)j->m, j->work_s, j->store_s);
    dl_policy_committed(s->policy, p, nv, now);
    double share = j->mopts.share_scaling ? j->share : 1.0;
    DL_INFO("merge frag %d v%llu: %d learner(s), mean staleness %.2f, share %.2f, |delta| %.4g", p,
            (unsigned long long)nv, j->m, j->m ? stale / j->m : 0.0, share, j->norm);
    dl_event("merge",
             "frag=%d version=%llu n=%d staleness_mean=%.3f share=%.4f norm=%.6g tokens=%llu compute_s=%.6f "
             "retries=%d hash=%016llx",
             p, (unsigned long long)nv, j->m, j->m ? stale / j->m : 0.0, share, j->norm,
             (unsigned long long)j->ledger.tokens[DL_LEDGER_APPLIED], compute_s, j->retries,
             (unsigned long long)j->hash);
}

void dl_commit_aside(dl_sync *s, int p, const dl_merge_contrib *c)
{
    for (int i = 0; i < s->naside[p]; i++)
        if (!strcmp(s->aside[p][i].learner_id, c->learner_id)) { /* the latest per learner: repeats cannot grow it */
            s->aside[p][i] = *c;
            return;
        }
    if (s->naside[p] == s->capaside[p]) {
        s->capaside[p] = s->capaside[p] ? 2 * s->capaside[p] : 8;
        s->aside[p] = dl_xrealloc(s->aside[p], (size_t)s->capaside[p] * sizeof **s->aside);
    }
    s->aside[p][s->naside[p]++] = *c;
}
