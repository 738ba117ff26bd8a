/* The learner's metrics endpoint (see metrics.h). */
#include "learner/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/httpd.h"
#include "core/log.h"
#include "core/prom.h"

struct dl_lmet {
    char id[80];
    dl_httpd *httpd;
    dl_httpd_pages *pages;
    dl_prom_hist step_s; /* wall seconds per training step (throttle included) */
    double loss;         /* latest step's training loss */
    uint64_t step, tokens;
    double last_pub;     /* dl_clock_s of the last render */
};

static const double step_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

int dl_lmet_open(const char *addr, const char *id, dl_lmet **out)
{
    *out = NULL;
    if (!addr[0] || !strcmp(addr, "off")) return 0;
    int fallback = !strcmp(addr, "auto");
    if (fallback) addr = "127.0.0.1:0";
    dl_lmet *m = dl_try_calloc(1, sizeof *m);
    if (!m) return dl_err(DL_ENOMEM, "option metrics: out of memory");
    snprintf(m->id, sizeof m->id, "%s", id);
    dl_prom_hist_init(&m->step_s, step_le, (int)(sizeof step_le / sizeof step_le[0]));
    m->loss = NAN;
    m->pages = dl_httpd_pages_new();
    int rc = m->pages ? dl_httpd_open(addr, dl_httpd_pages_handler, m->pages, &m->httpd)
                      : dl_err(DL_ENOMEM, "out of memory");
    if (rc) {
        dl_httpd_pages_free(&m->pages);
        free(m);
        if (fallback) {
            /* the default must never keep a learner from training */
            DL_WARN("metrics off: %s", dl_errmsg());
            return 0;
        }
        return dl_err(rc, "option metrics: %s", dl_errmsg());
    }
    DL_INFO("metrics: http://%s/metrics", dl_httpd_addr(m->httpd));
    dl_event("metrics_listen", "id=%s addr=%s", m->id, dl_httpd_addr(m->httpd));
    *out = m;
    dl_lmet_publish(m, &(dl_comms_stats){0}, &(dl_node_stats){0}, 0);
    return 0;
}

void dl_lmet_step(dl_lmet *m, double step_s, double loss, uint64_t step, uint64_t tokens)
{
    if (!m) return;
    dl_prom_hist_observe(&m->step_s, step_s);
    m->loss = loss;
    m->step = step;
    m->tokens = tokens;
}

int dl_lmet_due(const dl_lmet *m) { return m && dl_clock_s() - m->last_pub >= 1.0; }

void dl_lmet_publish(dl_lmet *m, const dl_comms_stats *cs, const dl_node_stats *ns, double tokens_per_s)
{
    if (!m) return;
    m->last_pub = dl_clock_s();
    dl_prom o;
    dl_prom_init(&o);
    char lb[256] = "";
    dl_prom_label(lb, sizeof lb, "learner", m->id);
#define ONE(name, type, help, v)                                      \
    do {                                                              \
        dl_prom_family(&o, "dloco_learner_" name, type, help);        \
        dl_prom_sample(&o, "dloco_learner_" name, lb, (double)(v));   \
    } while (0)
    ONE("info", "gauge", "constant 1, label learner: this learner's id", 1);
    dl_prom_family(&o, "dloco_learner_step_seconds", "histogram",
                   "wall seconds of one training step (throttle included)");
    dl_prom_histogram(&o, "dloco_learner_step_seconds", lb, &m->step_s);
    ONE("steps_total", "counter", "training steps done (the step counter)", m->step);
    ONE("tokens_total", "counter", "tokens processed since start", m->tokens);
    ONE("tokens_per_second", "gauge", "tokens per second over the latest log window", tokens_per_s);
    ONE("train_loss", "gauge", "training loss of the latest step", m->loss);
    dl_prom_family(&o, "dloco_learner_pushes_total", "counter",
                   "pushes by outcome: sent (Push messages), and the synchronizer's decisions accepted (merged), "
                   "dropped_stale, rejected (busy included), busy; coalesced: replaced before leaving");
    const struct {
        const char *n;
        uint64_t v;
    } po[] = {{"sent", cs->pushes},           {"accepted", cs->accepted}, {"dropped_stale", cs->dropped_stale},
              {"rejected", cs->rejected},     {"busy", cs->busy},         {"coalesced", cs->coalesced},
              {"stopped", cs->pushes_stopped}};
    for (size_t i = 0; i < sizeof po / sizeof po[0]; i++) {
        char l2[300];
        snprintf(l2, sizeof l2, "%s", lb);
        dl_prom_label(l2, sizeof l2, "outcome", po[i].n);
        dl_prom_sample(&o, "dloco_learner_pushes_total", l2, (double)po[i].v);
    }
    uint64_t decided = cs->accepted + cs->dropped_stale + cs->rejected;
    ONE("pushes_pending", "gauge",
        "pushes sent without a final decision yet (accepted, dropped_stale or rejected)",
        cs->pushes > decided ? cs->pushes - decided : 0);
    ONE("merge_staleness_versions", "gauge",
        "mean over accepted pushes of the versions the global fragment had moved on from the push's base when it "
        "was merged (the adopt lag, in versions)",
        cs->staleness_n ? (double)cs->staleness_sum / (double)cs->staleness_n : 0.0);
    ONE("steps_behind_max", "gauge",
        "the most inner steps any fragment has trained since its adopted base (the adopt lag in steps)",
        ns->steps_behind_max);
    ONE("updates_adopted_total", "counter", "global updates adopted (rebases included)", ns->adopted);
    ONE("updates_rebased_total", "counter", "of those, forced rebases (theta overwritten)", ns->rebased);
    ONE("updates_refused_total", "counter", "updates refused (non-finite, version jump, beyond update_max_ratio)",
        ns->refused + cs->updates_refused);
    ONE("discarded_fragment_tokens_total", "counter", "fragment-tokens thrown away by adopts (reported to the ledger)",
        ns->discarded_tokens);
    ONE("sent_bytes_total", "counter", "bytes sent to the synchronizer(s): frames, headers included", cs->bytes_sent);
    ONE("received_bytes_total", "counter", "bytes received from the synchronizer(s)", cs->bytes_recv);
    ONE("socket_rebuilds_total", "counter", "sockets closed and opened again", cs->rebuilds);
    ONE("epoch", "gauge", "epoch of the last Welcome (the largest over shards)", cs->epoch);
    ONE("barrier_wait_seconds_total", "counter", "seconds waited at the barrier (sync / sync-elastic)",
        ns->barrier_wait_s);
#undef ONE
    if (!o.failed) /* out of memory: the last page stays up */
        dl_httpd_pages_set(m->pages, "/metrics", "text/plain; version=0.0.4; charset=utf-8", o.buf, o.len);
    dl_prom_free(&o);
}

void dl_lmet_close(dl_lmet **mp)
{
    if (!mp || !*mp) return;
    dl_httpd_close(&(*mp)->httpd);
    dl_httpd_pages_free(&(*mp)->pages);
    free(*mp);
    *mp = NULL;
}
