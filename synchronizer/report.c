/* Status line, shutdown summary and reload diff of the synchronizer, from
 * the statistics snapshot. */
#include "synchronizer/report.h"

#include <stdarg.h>
#include <string.h>

#include "core/event.h"
#include "storage/store.h"

static double mean_staleness(const dl_sync_stats *st)
{
    return st->merged_contribs ? (double)st->stale_sum / (double)st->merged_contribs : 0.0;
}

void dl_report_status(const dl_sync_stats *st, char *buf, size_t cap)
{
    char vers[256];
    size_t o = 0;
    vers[0] = 0;
    for (int p = 0; p < st->P && o < sizeof vers - 24; p++)
        o += (size_t)snprintf(vers + o, sizeof vers - o, "%s%llu", p ? "," : "", (unsigned long long)st->versions[p]);
    snprintf(buf, cap,
             "epoch %llu | learners %d live / %d dead / %d left (%llu known) | merges %llu | mean staleness %.2f | versions [%s] | "
             "dropped %llu rejected %llu (busy %llu) | pool %.1f / %.1f MiB | outbound %.1f MiB | store file %.1f MiB "
             "live %.1f MiB | jobs in flight %d",
             (unsigned long long)st->epoch, st->live, st->dead, st->left, (unsigned long long)st->known_learners,
             (unsigned long long)st->merges,
             mean_staleness(st), vers, (unsigned long long)st->dropped_stale, (unsigned long long)st->rejected,
             (unsigned long long)st->busy_refused, (double)st->pool_bytes / 1048576.0,
             (double)st->pool_max / 1048576.0, (double)st->outbound_attached / 1048576.0,
             (double)st->store_file_bytes / 1048576.0, (double)st->store_live_bytes / 1048576.0, st->jobs_inflight);
}

static const char *member_name(int state)
{
    switch (state) {
    case DL_POLICY_MEMBER_LIVE: return "live";
    case DL_POLICY_MEMBER_DEAD: return "dead";
    case DL_POLICY_MEMBER_LEFT: return "left";
    default: return "none";
    }
}

/* The fields of the summary line and of one learner's line: the text
 * summary and the events print the same strings. */
static void summary_fields(const dl_sync_stats *st, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "epoch=%llu merges=%llu contributions=%llu mean_staleness=%.3f dropped_stale=%llu rejected=%llu "
             "fetches=%llu wall_s=%.1f refused_msgs=%llu clipped=%llu reclaimed=%llu dropped_readers=%llu "
             "deferred_updates=%llu outbound_peak_bytes=%llu outbound_max_bytes=%llu outbound_detached_bytes=%llu "
             "pool_peak_bytes=%llu pool_max_bytes=%llu busy_refused=%llu update_restarts=%llu chunks_in=%llu "
             "chunks_out=%llu chunks_shared=%llu drain_yields=%llu abandoned_pushes=%llu store_file_bytes=%llu store_live_bytes=%llu "
             "updates_full=%llu updates_delta=%llu loop_stalls=%llu loop_stall_ms=%llu",
             (unsigned long long)st->epoch, (unsigned long long)st->merges, (unsigned long long)st->merged_contribs,
             mean_staleness(st), (unsigned long long)st->dropped_stale, (unsigned long long)st->rejected,
             (unsigned long long)st->fetches, st->wall_s, (unsigned long long)st->refused_msgs,
             (unsigned long long)st->clipped, (unsigned long long)st->reclaimed,
             (unsigned long long)st->dropped_readers, (unsigned long long)st->deferred_updates,
             (unsigned long long)st->outbound_peak, (unsigned long long)st->outbound_max,
             (unsigned long long)(st->outbound_bytes - st->outbound_attached), (unsigned long long)st->pool_peak,
             (unsigned long long)st->pool_max, (unsigned long long)st->busy_refused,
             (unsigned long long)st->update_restarts, (unsigned long long)st->chunks_in,
             (unsigned long long)st->chunks_out, (unsigned long long)st->chunks_shared,
             (unsigned long long)st->drain_yields,
             (unsigned long long)st->abandoned_pushes, (unsigned long long)st->store_file_bytes,
             (unsigned long long)st->store_live_bytes, (unsigned long long)st->updates_full,
             (unsigned long long)st->updates_delta, (unsigned long long)st->loop_stalls,
             (unsigned long long)st->loop_stall_ms);
}

static void learner_fields(const dl_sync_learner_stats *l, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "id=%s state=%s pushes=%llu merged=%llu dropped=%llu rejected=%llu tokens_applied=%llu tokens=%llu "
             "bytes_in=%llu bytes_out=%llu control_behind_max_bytes=%llu drain_bytes_per_s=%.0f "
             "path_inflight_max_bytes=%llu path_bytes_per_s=%.0f path_deep=%d path_inflight_deep_max_bytes=%llu",
             l->id, member_name(l->state), (unsigned long long)l->pushes, (unsigned long long)l->merged,
             (unsigned long long)l->dropped, (unsigned long long)l->rejected, (unsigned long long)l->tokens_applied,
             (unsigned long long)l->tokens, (unsigned long long)l->bytes_in, (unsigned long long)l->bytes_out,
             (unsigned long long)l->ctl_ahead_max, l->drain_bps,
             (unsigned long long)l->path_inflight_max, l->path_bps, l->path_deep,
             (unsigned long long)l->path_inflight_deep_max);
}

void dl_report_summary(const dl_sync_stats *st, FILE *f)
{
    char line[1024];
    summary_fields(st, line, sizeof line);
    fprintf(f, "sync-summary: %s\n", line);
    for (int i = 0; i < st->n_learners; i++) {
        learner_fields(&st->learners[i], line, sizeof line);
        fprintf(f, "sync-learner: %s\n", line);
    }
}

void dl_report_summary_events(const dl_sync_stats *st)
{
    char line[1024];
    summary_fields(st, line, sizeof line);
    dl_event("sync_summary", "%s", line);
    for (int i = 0; i < st->n_learners; i++) {
        learner_fields(&st->learners[i], line, sizeof line);
        dl_event("sync_learner", "%s", line);
    }
    const dl_ledger_totals *t = &st->ledger;
    dl_event("ledger",
             "applied=%llu dropped_stale=%llu rejected=%llu lost=%llu discarded=%llu outstanding=%llu pooled=%llu "
             "carried=%llu processed=%llu overclaim=%llu carried_in=%llu",
             (unsigned long long)t->state[DL_LEDGER_APPLIED], (unsigned long long)t->state[DL_LEDGER_DROPPED_STALE],
             (unsigned long long)t->state[DL_LEDGER_REJECTED], (unsigned long long)t->state[DL_LEDGER_LOST],
             (unsigned long long)t->state[DL_LEDGER_DISCARDED], (unsigned long long)t->state[DL_LEDGER_OUTSTANDING],
             (unsigned long long)t->pooled, (unsigned long long)t->carried, (unsigned long long)t->processed,
             (unsigned long long)t->overclaim, (unsigned long long)t->carried_in);
}

typedef struct {
    char *buf;
    size_t cap, o;
    int n;
} diff_buf;

static void add(diff_buf *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(diff_buf *d, const char *fmt, ...)
{
    d->n++;
    if (d->o >= d->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(d->buf + d->o, d->cap - d->o, fmt, ap);
    va_end(ap);
    d->o += k > 0 ? (size_t)k : 0;
}

int dl_report_tunables_diff(const dl_sync_tunables *a, const dl_sync_tunables *b, char *buf, size_t cap)
{
    diff_buf d = {buf, cap, 0, 0};
    buf[0] = 0;
    const dl_policy_cfg *x = &a->policy, *y = &b->policy;
    const dl_merge_opts *m = &a->merge, *n = &b->merge;
#define CHANGED(name, fmt, u, v) \
    if ((u) != (v)) add(&d, "%s" name " " fmt " -> " fmt, d.n ? ", " : " ", u, v)
    CHANGED("quorum", "%d", x->quorum, y->quorum);
    CHANGED("grace_cap_ms", "%lld", (long long)(x->grace_cap_ns / 1000000), (long long)(y->grace_cap_ns / 1000000));
    CHANGED("gamma", "%g", x->gamma, y->gamma);
    CHANGED("mad_k", "%g", x->mad_k, y->mad_k);
    CHANGED("grace_steps", "%g", x->tau_steps, y->tau_steps);
    CHANGED("max_staleness", "%lld", (long long)x->max_staleness, (long long)y->max_staleness);
    if (x->sfn != y->sfn)
        add(&d, "%sstaleness %s -> %s", d.n ? ", " : " ", dl_policy_sfn_name(x->sfn), dl_policy_sfn_name(y->sfn));
    CHANGED("staleness_a", "%g", x->sfn_a, y->sfn_a);
    CHANGED("staleness_b", "%g", x->sfn_b, y->sfn_b);
    CHANGED("outer_lr", "%g", (double)m->outer_lr, (double)n->outer_lr);
    CHANGED("outer_momentum", "%g", (double)m->outer_momentum, (double)n->outer_momentum);
    CHANGED("clip_norm", "%g", m->clip_norm, n->clip_norm);
    CHANGED("share_scaling", "%d", m->share_scaling, n->share_scaling);
    if (m->aggregate != n->aggregate)
        add(&d, "%saggregate %s -> %s", d.n ? ", " : " ", dl_merge_aggregate_name(m->aggregate),
            dl_merge_aggregate_name(n->aggregate));
    CHANGED("trim", "%g", m->trim, n->trim);
    const dl_guard_cfg *g = &a->guard, *h = &b->guard;
    CHANGED("norm_k", "%g", g->norm_k, h->norm_k);
    CHANGED("norm_window", "%d", g->norm_window, h->norm_window);
    CHANGED("norm_min_history", "%d", g->norm_min_history, h->norm_min_history);
    CHANGED("norm_param_ratio", "%g", g->norm_param_ratio, h->norm_param_ratio);
    if (g->norm_action != h->norm_action)
        add(&d, "%snorm_action %s -> %s", d.n ? ", " : " ", dl_guard_action_name(g->norm_action),
            dl_guard_action_name(h->norm_action));
    CHANGED("param_abs_max", "%g", g->param_abs_max, h->param_abs_max);
    CHANGED("max_step_rate", "%g", g->max_step_rate, h->max_step_rate);
    CHANGED("step_slack", "%llu", (unsigned long long)g->step_slack, (unsigned long long)h->step_slack);
    CHANGED("max_batch", "%u", g->max_batch, h->max_batch);
    CHANGED("max_tokens_per_step", "%llu", (unsigned long long)g->max_tokens_per_step,
            (unsigned long long)h->max_tokens_per_step);
#undef CHANGED
    return d.n;
}
