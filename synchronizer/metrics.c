/* Operator view of the synchronizer: the loop's extra counters and the
 * /metrics and /status.json renderers (see metrics.h). */
#include "synchronizer/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/err.h"
#include "storage/store.h"

static const double staleness_le[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64};
static const double wait_le[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double commit_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};
#define NB(a) ((int)(sizeof a / sizeof a[0]))

static const char *const reject_name[DL_SM_REJ_N] = {"counters", "replay", "codec", "nonfinite",
                                                      "norm", "policy", "busy", "merge_failed",
                                                      "chunk_order"};
static const char *const msg_name[DL_SM_MSG_N] = {"invalid", "not_registered", "unauthorized", "duplicate", "limits"};
static const char *const kind_name[DL_SM_KINDS] = {"unparsed", "hello", "welcome", "heartbeat", "push",
                                                   "ack",      "update", "fetch",  "bye",       "error"};

void dl_syncmet_init(dl_syncmet *m, int P)
{
    memset(m, 0, sizeof *m);
    m->P = P;
    dl_prom_hist_init(&m->staleness, staleness_le, NB(staleness_le));
    dl_prom_hist_init(&m->quorum_wait_s, wait_le, NB(wait_le));
    dl_prom_hist_init(&m->grace_s, wait_le, NB(wait_le));
    dl_prom_hist_init(&m->commit_s, commit_le, NB(commit_le));
    dl_prom_hist_init(&m->merge_job_s, commit_le, NB(commit_le));
    m->frag_merges = dl_xcalloc((size_t)P, sizeof *m->frag_merges);
    m->frag_merge_wall = dl_xcalloc((size_t)P, sizeof *m->frag_merge_wall);
    m->frag_contributors = dl_xcalloc((size_t)P, sizeof *m->frag_contributors);
}

void dl_syncmet_free(dl_syncmet *m)
{
    free(m->frag_merges);
    free(m->frag_merge_wall);
    free(m->frag_contributors);
    m->frag_merges = NULL;
    m->frag_merge_wall = NULL;
    m->frag_contributors = NULL;
}

int dl_syncmet_kind(int body_case) { return body_case >= 10 && body_case <= 18 ? body_case - 9 : 0; }

void dl_syncmet_round(dl_syncmet *m, const dl_policy_round *r)
{
    double wait = r->quorum_ns > r->opened_ns ? (double)(r->quorum_ns - r->opened_ns) * 1e-9 : 0.0;
    dl_prom_hist_observe(&m->quorum_wait_s, wait);
    int64_t from = r->quorum_ns > r->opened_ns ? r->quorum_ns : r->opened_ns;
    dl_prom_hist_observe(&m->grace_s, r->closed_ns > from ? (double)(r->closed_ns - from) * 1e-9 : 0);
}

void dl_syncmet_merged(dl_syncmet *m, int p, uint32_t n, double job_s, double commit_s)
{
    dl_prom_hist_observe(&m->merge_job_s, job_s);
    m->frag_merges[p]++;
    m->frag_merge_wall[p] = dl_wallclock_ns();
    m->frag_contributors[p] = n;
    dl_prom_hist_observe(&m->commit_s, commit_s);
}

static const char *state_name(int state)
{
    switch (state) {
    case DL_POLICY_MEMBER_LIVE: return "live";
    case DL_POLICY_MEMBER_DEAD: return "dead";
    case DL_POLICY_MEMBER_LEFT: return "left";
    default: return "none";
    }
}

/* ------------------------------------------------------------------------ */
/* /metrics */

#define FAM(name, type, help) dl_prom_family(out, "dloco_sync_" name, type, help)
#define VAL(name, v) dl_prom_sample(out, "dloco_sync_" name, NULL, (double)(v))

static void lab1(char *b, size_t cap, const char *k, const char *v)
{
    b[0] = 0;
    dl_prom_label(b, cap, k, v);
}

/* One counter family over a fixed label set: dloco_sync_<name>{label=names[i]}
 * = v[i] for i in [from, n). */
static void labelled(dl_prom *out, const char *name, const char *help, const char *label,
                     const char *const *names, const uint64_t *v, int from, int n)
{
    char full[128], lb[128];
    snprintf(full, sizeof full, "dloco_sync_%s", name);
    dl_prom_family(out, full, "counter", help);
    for (int i = from; i < n; i++) {
        lab1(lb, sizeof lb, label, names[i]);
        dl_prom_sample(out, full, lb, (double)v[i]);
    }
}

static void per_learner(dl_prom *out, const dl_sync_stats *st, const char *name, const char *type, const char *help,
                        size_t off, int is_double)
{
    char full[128], lb[256];
    snprintf(full, sizeof full, "dloco_sync_%s", name);
    dl_prom_family(out, full, type, help);
    for (int i = 0; i < st->n_learners; i++) {
        const dl_sync_learner_stats *l = &st->learners[i];
        const char *f = (const char *)l + off;
        lab1(lb, sizeof lb, "learner", l->id);
        dl_prom_sample(out, full, lb, is_double ? *(const double *)f : (double)*(const uint64_t *)f);
    }
}
#define PL(name, type, help, field, dbl) \
    per_learner(out, st, name, type, help, offsetof(dl_sync_learner_stats, field), dbl)

void dl_syncmet_render_metrics(const dl_syncmet *m, const dl_sync_stats *st, const dl_syncmet_ctx *c, dl_prom *out)
{
    char lb[256];
    FAM("info", "gauge", "constant 1, labels: the run, the bound ZeroMQ endpoint, the shard layout");
    lb[0] = 0;
    char fp[20], sh[24];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)c->fingerprint);
    snprintf(sh, sizeof sh, "%d/%d", c->shard, c->shards > 1 ? c->shards : 1);
    dl_prom_label(lb, sizeof lb, "run_id", c->run_id);
    dl_prom_label(lb, sizeof lb, "fingerprint", fp);
    dl_prom_label(lb, sizeof lb, "shard", sh);
    dl_prom_sample(out, "dloco_sync_info", lb, 1);
    FAM("epoch", "gauge", "epoch of this synchronizer process (bumped at every start)");
    VAL("epoch", st->epoch);
    FAM("uptime_seconds", "gauge", "seconds since this process opened the store");
    VAL("uptime_seconds", st->wall_s);

    FAM("learners", "gauge", "registered learners by membership (policy.c is the one owner of live/dead/left)");
    const int by[3] = {st->live, st->dead, st->left};
    const char *bn[3] = {"live", "dead", "left"};
    for (int i = 0; i < 3; i++) {
        lab1(lb, sizeof lb, "state", bn[i]);
        dl_prom_sample(out, "dloco_sync_learners", lb, by[i]);
    }
    FAM("learners_known", "gauge", "learner records in the store (every learner this run has seen, any process)");
    VAL("learners_known", st->known_learners);
    FAM("learner_up", "gauge", "1 while the learner is live, 0 dead or left (label learner: bounded by max_learners)");
    for (int i = 0; i < st->n_learners; i++) {
        lab1(lb, sizeof lb, "learner", st->learners[i].id);
        dl_prom_sample(out, "dloco_sync_learner_up", lb, st->learners[i].state == DL_POLICY_MEMBER_LIVE);
    }
    PL("learner_steps_per_second", "gauge", "inner steps per second, from the learner's latest heartbeat", steps_per_s,
       1);
    PL("learner_train_loss", "gauge", "the learner's recent training loss, from its latest push (on its own data)",
       train_loss, 1);
    PL("learner_step", "gauge", "the learner's inner step, from its latest heartbeat", step, 0);
    PL("learner_tokens_processed", "gauge", "tokens the learner reports processed since its start (heartbeat)", tokens,
       0);
    PL("learner_tokens_applied_total", "counter",
       "fragment-tokens of the learner's pushes merged into committed versions (kept across restarts in the store)",
       tokens_applied, 0);
    PL("learner_pushes_total", "counter", "pushes received from the learner (kept across restarts)", pushes, 0);
    PL("learner_merged_total", "counter", "the learner's pushes merged", merged, 0);
    PL("learner_dropped_stale_total", "counter", "the learner's pushes dropped as too stale", dropped, 0);
    PL("learner_rejected_total", "counter",
       "the learner's pushes answered REJECTED: refused on arrival, busy, or lost to a failed merge (what the "
       "learner counts as rejected)",
       rejected, 0);
    PL("learner_last_staleness", "gauge", "staleness of the learner's latest merged push, versions", last_staleness, 0);
    PL("learner_received_bytes_total", "counter", "bytes received from the learner (frames, headers approximated)",
       bytes_in, 0);
    PL("learner_sent_bytes_total", "counter", "bytes sent to the learner (frames, headers approximated)", bytes_out, 0);
    PL("learner_drain_bytes_per_second", "gauge",
       "what the learner's connection drains, bytes/s, measured on its queue (downlink pacing; 0 = not yet)", drain_bps,
       1);
    PL("learner_control_behind_max_bytes", "gauge",
       "the most Update payload bytes an Ack, heartbeat or Welcome to the learner found queued ahead of it",
       ctl_ahead_max, 0);

    FAM("merges_total", "counter", "merges committed by this process (one per closed round)");
    VAL("merges_total", st->merges);
    FAM("fragment_version", "gauge", "committed global version per fragment (label fragment)");
    for (int p = 0; p < st->P; p++) {
        char ps[16];
        snprintf(ps, sizeof ps, "%d", p);
        lab1(lb, sizeof lb, "fragment", ps);
        dl_prom_sample(out, "dloco_sync_fragment_version", lb, (double)st->versions[p]);
    }
    FAM("fragment_merges_total", "counter", "merges of each fragment committed by this process");
    for (int p = 0; p < st->P; p++) {
        char ps[16];
        snprintf(ps, sizeof ps, "%d", p);
        lab1(lb, sizeof lb, "fragment", ps);
        dl_prom_sample(out, "dloco_sync_fragment_merges_total", lb, (double)m->frag_merges[p]);
    }
    FAM("loop_stalls_total", "counter",
        "times the synchronizer's loop did not run for a heartbeat period or more (stopped, swapped, busy): learners "
        "are not charged for that silence");
    VAL("loop_stalls_total", st->loop_stalls);
    FAM("merged_contributions_total", "counter", "pushes merged (contributions of committed rounds)");
    VAL("merged_contributions_total", st->merged_contribs);
    FAM("staleness", "histogram", "staleness of each merged contribution, versions (round version - push base)");
    dl_prom_histogram(out, "dloco_sync_staleness", NULL, &m->staleness);
    FAM("quorum_wait_seconds", "histogram", "a round's first push until its quorum was reached");
    dl_prom_histogram(out, "dloco_sync_quorum_wait_seconds", NULL, &m->quorum_wait_s);
    FAM("grace_window_seconds", "histogram", "quorum reached until the round closed: the grace window it had");
    dl_prom_histogram(out, "dloco_sync_grace_window_seconds", NULL, &m->grace_s);
    static const char *const close_label[5] = {"none", "all_in", "predicted_none", "grace_expired", "cap"};
    labelled(out, "rounds_closed_total",
             "rounds closed, by reason: all_in (every expected learner: early close or barrier), predicted_none "
             "(quorum and nobody predicted before the cap), grace_expired, cap",
             "reason", close_label, c->policy->close, 1, 5);
    labelled(out, "pushes_rejected_total", "pushes refused, by reason (the push event has the detail)", "reason",
             reject_name, m->push_rejected, 0, DL_SM_REJ_N);
    FAM("pushes_dropped_stale_total", "counter",
        "pushes dropped as staler than max_staleness (learner told to rebase)");
    VAL("pushes_dropped_stale_total", st->dropped_stale);
    labelled(out, "messages_refused_total", "messages refused before any handler, by reason", "reason", msg_name,
             m->msg_refused, 0, DL_SM_MSG_N);
    /* kind 0 ("unparsed") is only ever received */
    labelled(out, "received_bytes_total", "bytes received, by message kind (frames, headers approximated)", "kind",
             kind_name, m->bytes_in, 0, DL_SM_KINDS);
    labelled(out, "sent_bytes_total", "bytes sent, by message kind (frames, headers approximated)", "kind", kind_name,
             m->bytes_out, 1, DL_SM_KINDS);
    labelled(out, "received_messages_total", "messages received, by kind", "kind", kind_name, m->msgs_in, 0,
             DL_SM_KINDS);
    labelled(out, "sent_messages_total", "messages sent, by kind", "kind", kind_name, m->msgs_out, 1, DL_SM_KINDS);
    FAM("pool_bytes", "gauge", "bytes of pushes pooled or arriving");
    VAL("pool_bytes", st->pool_bytes);
    FAM("pool_limit_bytes", "gauge",
        "the pool's bound now (pool_mb, or with pool_mb 0 its default grown to live learners x the model, at "
        "most a quarter of memory); under sync/sync-elastic a waited-for push may use 2x");
    VAL("pool_limit_bytes", st->pool_max);
    FAM("pool_buffers_total", "counter",
        "push buffers handed out: from the spares the pool keeps (reused) or newly allocated (fresh; each costs its "
        "size in page faults)");
    {
        char lb[64];
        lab1(lb, sizeof lb, "how", "reused");
        dl_prom_sample(out, "dloco_sync_pool_buffers_total", lb, (double)st->pool_reused);
        lab1(lb, sizeof lb, "how", "fresh");
        dl_prom_sample(out, "dloco_sync_pool_buffers_total", lb, (double)st->pool_fresh);
    }
    FAM("pool_spare_bytes", "gauge", "bytes of push buffers kept for the next pushes");
    VAL("pool_spare_bytes", st->pool_spare);
    FAM("outbound_bytes", "gauge", "payload bytes queued in libzmq for attached learners");
    VAL("outbound_bytes", st->outbound_attached);
    FAM("outbound_limit_bytes", "gauge", "their bound (max_outbound_mb)");
    VAL("outbound_limit_bytes", st->outbound_max);
    static const char *const update_kind[2] = {"full", "delta"};
    const uint64_t updates[2] = {st->updates_full, st->updates_delta};
    labelled(out, "updates_sent_total",
             "Updates sent whole (every chunk queued): full = the fp32 values, delta = the version-to-version delta "
             "(update_codec)",
             "kind", update_kind, updates, 0, 2);
    FAM("jobs_in_flight", "gauge", "worker jobs submitted and not yet back (merges, records, ledger, fsync)");
    VAL("jobs_in_flight", st->jobs_inflight);
    FAM("commit_failures_in_a_row", "gauge", "merge commits the store failed in a row (0: commits succeed)");
    VAL("commit_failures_in_a_row", st->commit_fails);
    FAM("commit_backoff_seconds", "gauge",
        "the back-off after the latest failed commit (pushes answered busy, then one round probes; 0: none)");
    VAL("commit_backoff_seconds", st->commit_backoff_ms * 1e-3);
    FAM("commit_seconds", "histogram", "the LMDB commit of one merge on the worker (retries and their waits incl.)");
    dl_prom_histogram(out, "dloco_sync_commit_seconds", NULL, &m->commit_s);
    FAM("merge_job_seconds", "histogram", "one merge job on the worker: merge, outer step and the commit");
    dl_prom_histogram(out, "dloco_sync_merge_job_seconds", NULL, &m->merge_job_s);
    FAM("store_file_bytes", "gauge", "size of the LMDB data file (never shrinks)");
    VAL("store_file_bytes", st->store_file_bytes);
    FAM("store_live_bytes", "gauge", "bytes the current state occupies in it (used - freelist)");
    VAL("store_live_bytes", st->store_live_bytes);
    FAM("store_free_bytes", "gauge", "freed pages inside the file that later commits reuse");
    VAL("store_free_bytes", st->store_free_bytes);

    FAM("ledger_fragment_tokens", "gauge",
        "the token ledger, fragment-tokens (one token a learner trained on counts once per fragment it pushed), by "
        "state: persisted (applied .. outstanding, this store's totals) and live (pooled, carried), processed "
        "(reported), overclaim, carried_in");
    static const char *const lname[DL_LEDGER_NSTATES] = {"applied", "dropped_stale", "rejected",
                                                          "lost",    "discarded",     "outstanding"};
    for (int i = 0; i < DL_LEDGER_NSTATES; i++) {
        lab1(lb, sizeof lb, "state", lname[i]);
        dl_prom_sample(out, "dloco_sync_ledger_fragment_tokens", lb, (double)st->ledger.state[i]);
    }
    const struct {
        const char *n;
        uint64_t v;
    } extra[] = {{"pooled", st->ledger.pooled},
                 {"carried", st->ledger.carried},
                 {"processed", st->ledger.processed},
                 {"overclaim", st->ledger.overclaim},
                 {"carried_in", st->ledger.carried_in}};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        lab1(lb, sizeof lb, "state", extra[i].n);
        dl_prom_sample(out, "dloco_sync_ledger_fragment_tokens", lb, (double)extra[i].v);
    }
    FAM("tokens_received_total", "counter",
        "goodput: fragment-tokens of the pushes this process decided (pooled, dropped stale or rejected; busy "
        "refusals are pushed again and not counted)");
    VAL("tokens_received_total", m->tokens_received);
    FAM("tokens_merged_total", "counter", "goodput: fragment-tokens merged into versions committed by this process");
    VAL("tokens_merged_total", m->tokens_merged);

    FAM("evaluations_total", "counter", "periodic evaluations of the global model finished (eval_every_s)");
    VAL("evaluations_total", m->evals);
    if (m->has_eval) {
        FAM("eval_loss", "gauge", "validation loss of the global model at the last evaluation, on eval_data");
        VAL("eval_loss", m->eval_loss);
        FAM("eval_version", "gauge", "sum of the fragment versions that evaluation read");
        VAL("eval_version", m->eval_version);
        FAM("eval_timestamp_seconds", "gauge", "unix time that evaluation finished");
        VAL("eval_timestamp_seconds", (double)m->eval_wall * 1e-9);
    }

    FAM("config", "gauge",
        "current value of each numeric reloadable option (label option), as in the config file; SIGHUP changes show "
        "here");
    const dl_policy_cfg *pc = &c->tun->policy;
    const dl_merge_opts *mo = &c->tun->merge;
    const dl_guard_cfg *g = &c->tun->guard;
    const struct {
        const char *n;
        double v;
    } cfg[] = {{"quorum", pc->quorum},
               {"grace_cap_ms", (double)(pc->grace_cap_ns / 1000000)},
               {"gamma", pc->gamma},
               {"mad_k", pc->mad_k},
               {"grace_steps", pc->tau_steps},
               {"max_staleness", (double)pc->max_staleness},
               {"staleness_a", pc->sfn_a},
               {"staleness_b", pc->sfn_b},
               {"outer_lr", mo->outer_lr},
               {"outer_momentum", mo->outer_momentum},
               {"share_scaling", mo->share_scaling},
               {"clip_norm", mo->clip_norm},
               {"trim", mo->trim},
               {"norm_k", g->norm_k},
               {"norm_window", g->norm_window},
               {"norm_min_history", g->norm_min_history},
               {"norm_param_ratio", g->norm_param_ratio},
               {"param_abs_max", g->param_abs_max},
               {"max_step_rate", g->max_step_rate},
               {"step_slack", (double)g->step_slack},
               {"max_batch", g->max_batch},
               {"max_tokens_per_step", (double)g->max_tokens_per_step}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        lab1(lb, sizeof lb, "option", cfg[i].n);
        /* options held as float as the file spells them (outer_lr 0.7 shows 0.7,
         * not 0.69999998807907104); those held as double exactly */
        double v = cfg[i].v;
        char t[32];
        snprintf(t, sizeof t, "%.7g", v);
        dl_prom_sample(out, "dloco_sync_config", lb, (double)(float)v == v ? strtod(t, NULL) : v);
    }
    FAM("config_choice", "gauge",
        "the reloadable options that are words: 1 for the value in use (labels option, value)");
    const struct {
        const char *n, *v;
    } ch[] = {{"staleness", dl_policy_sfn_name(pc->sfn)},
              {"aggregate", dl_merge_aggregate_name(mo->aggregate)},
              {"norm_action", g->norm_action == DL_GUARD_CLIP ? "clip" : "reject"}};
    for (size_t i = 0; i < sizeof ch / sizeof ch[0]; i++) {
        lb[0] = 0;
        dl_prom_label(lb, sizeof lb, "option", ch[i].n);
        dl_prom_label(lb, sizeof lb, "value", ch[i].v);
        dl_prom_sample(out, "dloco_sync_config_choice", lb, 1);
    }
}

/* ------------------------------------------------------------------------ */
/* /status.json */


static void json_num(dl_prom *out, double v)
{
    if (!isfinite(v)) dl_prom_raw(out, "null");
    else dl_prom_raw(out, "%.10g", v);
}

void dl_syncmet_render_status(const dl_syncmet *m, const dl_sync_stats *st, const dl_syncmet_ctx *c, dl_prom *out)
{
    int64_t now = dl_wallclock_ns();
    dl_prom_raw(out, "{\"schema\":1,\"source\":\"live\",\"run_id\":");
    dl_prom_json_str(out, c->run_id);
    dl_prom_raw(out, ",\"endpoint\":");
    dl_prom_json_str(out, c->endpoint);
    dl_prom_raw(out, ",\"fingerprint\":\"%016llx\",\"epoch\":%llu,\"shard\":%d,\"shards\":%d,\"uptime_s\":",
                (unsigned long long)c->fingerprint, (unsigned long long)st->epoch, c->shard,
                c->shards > 1 ? c->shards : 1);
    json_num(out, st->wall_s);
    dl_prom_raw(out,
                ",\"learners_live\":%d,\"learners_dead\":%d,\"learners_left\":%d,\"learners_known\":%llu,"
                "\"merges\":%llu,\"rejected\":%llu,\"dropped_stale\":%llu,\"busy_refused\":%llu,"
                "\"commit_failures_in_a_row\":%d,\"commit_backoff_ms\":%u,\"learners\":[",
                st->live, st->dead, st->left, (unsigned long long)st->known_learners, (unsigned long long)st->merges,
                (unsigned long long)st->rejected, (unsigned long long)st->dropped_stale,
                (unsigned long long)st->busy_refused, st->commit_fails, st->commit_backoff_ms);
    for (int i = 0; i < st->n_learners; i++) {
        const dl_sync_learner_stats *l = &st->learners[i];
        dl_prom_raw(out, "%s{\"id\":", i ? "," : "");
        dl_prom_json_str(out, l->id);
        dl_prom_raw(out, ",\"site\":null"); /* the protocol carries no site yet */
        dl_prom_raw(out, ",\"state\":\"%s\",\"alive\":%s,\"steps_per_s\":", state_name(l->state),
                    l->state == DL_POLICY_MEMBER_LIVE ? "true" : "false");
        json_num(out, l->steps_per_s);
        dl_prom_raw(out, ",\"train_loss\":");
        json_num(out, l->train_loss);
        dl_prom_raw(out,
                    ",\"step\":%llu,\"tokens_processed\":%llu,\"tokens_applied\":%llu,\"pushes\":%llu,\"merged\":%llu,"
                    "\"dropped_stale\":%llu,\"rejected\":%llu,\"last_staleness\":%llu,\"bytes_in\":%llu,"
                    "\"bytes_out\":%llu,\"control_behind_max_bytes\":%llu,\"drain_bytes_per_s\":",
                    (unsigned long long)l->step, (unsigned long long)l->tokens, (unsigned long long)l->tokens_applied,
                    (unsigned long long)l->pushes, (unsigned long long)l->merged, (unsigned long long)l->dropped,
                    (unsigned long long)l->rejected, (unsigned long long)l->last_staleness,
                    (unsigned long long)l->bytes_in, (unsigned long long)l->bytes_out,
                    (unsigned long long)l->ctl_ahead_max);
        json_num(out, l->drain_bps);
        dl_prom_raw(out, "}");
    }
    dl_prom_raw(out, "],\"fragments\":[");
    for (int p = 0; p < st->P; p++) {
        dl_prom_raw(out, "%s{\"p\":%d,\"version\":%llu,\"last_merge_age_s\":", p ? "," : "", p,
                    (unsigned long long)st->versions[p]);
        if (m->frag_merge_wall[p]) json_num(out, (double)(now - m->frag_merge_wall[p]) * 1e-9);
        else dl_prom_raw(out, "null");
        dl_prom_raw(out, ",\"contributors\":%u}", m->frag_contributors[p]);
    }
    const dl_ledger_totals *t = &st->ledger;
    dl_prom_raw(out,
                "],\"ledger\":{\"unit\":\"fragment_tokens\",\"applied\":%llu,\"dropped_stale\":%llu,\"rejected\":%llu,"
                "\"lost\":%llu,\"discarded\":%llu,\"outstanding\":%llu,\"pooled\":%llu,\"carried\":%llu,"
                "\"processed\":%llu},\"eval\":",
                (unsigned long long)t->state[DL_LEDGER_APPLIED], (unsigned long long)t->state[DL_LEDGER_DROPPED_STALE],
                (unsigned long long)t->state[DL_LEDGER_REJECTED], (unsigned long long)t->state[DL_LEDGER_LOST],
                (unsigned long long)t->state[DL_LEDGER_DISCARDED], (unsigned long long)t->state[DL_LEDGER_OUTSTANDING],
                (unsigned long long)t->pooled, (unsigned long long)t->carried, (unsigned long long)t->processed);
    if (m->has_eval) {
        dl_prom_raw(out, "{\"version\":%llu,\"loss\":", (unsigned long long)m->eval_version);
        json_num(out, m->eval_loss);
        dl_prom_raw(out, ",\"seqs\":%d,\"age_s\":", m->eval_seqs);
        json_num(out, (double)(now - m->eval_wall) * 1e-9);
        dl_prom_raw(out, ",\"data\":");
        dl_prom_json_str(out, c->eval_data ? c->eval_data : "");
        dl_prom_raw(out, "}");
    } else {
        dl_prom_raw(out, "null");
    }
    dl_prom_raw(out, "}\n");
}
