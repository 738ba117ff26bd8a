/* The statistics snapshot (status lines, the summary) and the operator
 * view: /metrics and /status.json served by the HTTP thread. */
#include "synchronizer/sync_int.h"

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"
#include "core/prom.h"
#include "synchronizer/report.h"

#include <stdio.h>
#include <string.h>

/* /metrics and /status.json are re-rendered this often, seconds. */
#define DL_SYNC_PUBLISH_S 1.0

void dl_sync_get_stats(dl_sync *s, dl_sync_stats *out)
{
    memset(out, 0, sizeof *out);
    out->epoch = s->epoch;
    out->wall_s = (double)(dl_clock_ns() - s->started_ns) * 1e-9;
    out->P = s->cfg.P;
    for (int p = 0; p < s->cfg.P; p++) s->versions[p] = dl_policy_version(s->policy, p);
    out->versions = s->versions;
    int n = dl_registry_count(s->reg);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const dl_registry_learner *l = dl_registry_cget(s->reg, i);
        if (!l->used) continue;
        dl_sync_learner_stats *o = &s->lstats[k++];
        snprintf(o->id, sizeof o->id, "%s", l->id);
        o->state = member(s, i);
        o->pushes = l->pushes;
        o->merged = l->merged;
        o->dropped = l->dropped;
        o->rejected = l->rejected;
        o->tokens_applied = l->tokens_applied;
        o->bytes_in = l->bytes_in;
        o->bytes_out = l->bytes_out;
        o->step = l->step;
        o->tokens = l->tokens;
        o->steps_per_s = l->steps_per_s;
        o->train_loss = l->train_loss;
        o->last_staleness = l->last_staleness;
        o->drain_bps = dl_downlink_rate(s, i);
        o->ctl_ahead_max = dl_downlink_ctl_ahead_max(s, i);
        o->path_inflight_max = dl_downlink_path_inflight_max(s, i);
        o->path_bps = dl_downlink_path_rate(s, i, &o->path_deep, &o->path_inflight_deep_max);
        out->live += o->state == DL_POLICY_MEMBER_LIVE;
        out->dead += o->state == DL_POLICY_MEMBER_DEAD;
        out->left += o->state == DL_POLICY_MEMBER_LEFT;
    }
    out->n_learners = k;
    out->learners = s->lstats;
    out->refused_msgs = s->refused_msgs;
    out->clipped = s->clipped;
    out->reclaimed = s->reclaimed;
    out->dropped_readers = s->dropped_readers;
    out->deferred_updates = s->deferred_updates;
    out->outbound_bytes = dl_wire_queue_bytes(s->outq);
    out->outbound_attached = dl_downlink_attached_bytes(s);
    out->outbound_peak = s->outbound_peak;
    out->outbound_max = s->cfg.max_outbound_bytes;
    out->pool_bytes = dl_pool_used(s->pool);
    out->pool_peak = dl_pool_peak(s->pool);
    out->pool_max = dl_uplink_pool_bound(s);
    out->pool_reused = dl_pool_reused(s->pool);
    out->pool_fresh = dl_pool_fresh(s->pool);
    out->pool_spare = dl_pool_spare_bytes(s->pool);
    out->busy_refused = s->busy_refused;
    out->commit_fails = s->commit_fails;
    out->commit_backoff_ms = s->commit_backoff_ms;
    out->update_restarts = s->update_restarts;
    out->chunks_in = s->chunks_in;
    out->chunks_out = s->chunks_out;
    out->chunks_shared = s->chunks_shared;
    out->updates_full = s->updates_full;
    out->updates_delta = s->updates_delta;
    out->drain_yields = s->drain_yields;
    out->loop_stalls = s->loop_stalls;
    out->loop_stall_ms = s->loop_stall_ms;
    out->abandoned_pushes = s->abandoned_in;
    out->merges = s->merges;
    out->merged_contribs = s->merged_contribs;
    out->stale_sum = s->stale_sum;
    out->dropped_stale = s->dropped_stale;
    out->rejected = s->rejected;
    out->fetches = s->fetches;
    out->jobs_inflight = dl_worker_inflight(s->worker);
    out->known_learners = s->known_learners;
    dl_ledger_get_totals(s->ledger, &out->ledger);
    dl_store_stats ss;
    if (dl_store_get_stats(s->store, &ss) == 0) {
        out->store_file_bytes = ss.file_bytes;
        out->store_live_bytes = ss.live_bytes;
        out->store_free_bytes = ss.free_bytes;
    }
}

void dl_sync_summary(dl_sync *s, FILE *f)
{
    dl_sync_stats st;
    dl_sync_get_stats(s, &st);
    dl_report_summary(&st, f);
    dl_report_summary_events(&st);
}

/* ------------------------------------------------------------------------ */
/* the operator view: /metrics and /status.json, rendered on the loop from one
 * statistics snapshot and swapped in for the HTTP thread, which never reads
 * the loop's state */

static void publish_now(dl_sync *s)
{
    if (!s->pages) return;
    dl_sync_stats st;
    dl_sync_get_stats(s, &st);
    dl_policy_stats ps;
    dl_policy_get_stats(s->policy, &ps);
    dl_sync_tunables t = {.policy = *dl_policy_get_cfg(s->policy), .merge = s->cfg.merge, .guard = s->cfg.guard};
    dl_syncmet_ctx c = {.run_id = s->cfg.run_id,
                        .endpoint = s->endpoint,
                        .fingerprint = s->fingerprint,
                        .tun = &t,
                        .policy = &ps,
                        .shard = s->cfg.shard,
                        .shards = s->cfg.shards,
                        .eval_data = s->cfg.eval_data};
    dl_prom doc;
    dl_prom_init(&doc);
    /* out of memory (doc.failed): the last pages stay up */
    dl_syncmet_render_metrics(&s->met, &st, &c, &doc);
    if (!doc.failed)
        dl_httpd_pages_set(s->pages, "/metrics", "text/plain; version=0.0.4; charset=utf-8", doc.buf, doc.len);
    doc.len = 0;
    dl_syncmet_render_status(&s->met, &st, &c, &doc);
    if (!doc.failed) dl_httpd_pages_set(s->pages, "/status.json", "application/json", doc.buf, doc.len);
    dl_prom_free(&doc);
}

static void on_publish(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    publish_now(w->data);
}

/* The metrics server's port, bound with the ZeroMQ endpoint before the store
 * is opened: a busy or malformed --metrics leaves no store behind. An
 * explicit address that cannot be bound is an error naming the option; the
 * default one ("auto") falls back to an ephemeral loopback port, so several
 * synchronizers on one host all start. */
int dl_stats_bind_metrics(dl_sync *s)
{
    if (!s->cfg.metrics[0] || !strcmp(s->cfg.metrics, "off")) return 0;
    int fallback = !strcmp(s->cfg.metrics, "auto");
    const char *addr = fallback ? DL_SYNC_METRICS_DEFAULT : s->cfg.metrics;
    s->pages = dl_httpd_pages_new();
    if (!s->pages) return dl_err(DL_ENOMEM, "option metrics: out of memory");
    int rc = dl_httpd_open(addr, dl_httpd_pages_handler, s->pages, &s->httpd);
    if (rc && fallback) {
        DL_WARN("metrics: %s; serving on an ephemeral loopback port instead", dl_errmsg());
        rc = dl_httpd_open("127.0.0.1:0", dl_httpd_pages_handler, s->pages, &s->httpd);
        if (rc) {
            /* the default must never keep a synchronizer from starting */
            DL_WARN("metrics off: %s", dl_errmsg());
            dl_httpd_pages_free(&s->pages);
            return 0;
        }
    }
    if (rc) return dl_err(rc, "option metrics: %s", dl_errmsg());
    return 0;
}

/* Once the loop and the store are up: the documents it serves, every second. */
void dl_stats_start_metrics(dl_sync *s)
{
    if (!s->httpd) return;
    DL_INFO("metrics: http://%s/metrics and /status.json", dl_httpd_addr(s->httpd));
    dl_event("metrics_listen", "addr=%s", dl_httpd_addr(s->httpd));
    ev_timer_init(&s->publish, on_publish, DL_SYNC_PUBLISH_S, DL_SYNC_PUBLISH_S);
    s->publish.data = s;
    ev_timer_start(s->loop, &s->publish);
    publish_now(s);
}
