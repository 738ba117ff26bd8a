/* The sync timing of a networked dloco-learner (learner/timing.h, learner/pressure.h, docs/SYNC_TIMING.md):
 * its rows across options, the --pressure source, the trace files in and out, and the node's due callback. */
#include "gpt/pushtiming.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/err.h"
#include "core/event.h"
#include "core/plan.h"

/* Read a --timing_trace_out file: "dloco-timing-trace 1", "fragments P", then "p STEP PRESSURE" for steps 1, 2,
 * ... in order (PRESSURE a finite value >= 0, or "unknown"), "d STEP FRAGMENT" (FRAGMENT in [0, P), STEP
 * not above the last p line), and last "end STEPS" (= the last p line). Everything else is refused. */
static int read_timing_trace(const char *path, int P, int64_t steps, int **counts, double **pr, int64_t *n)
{
    FILE *f = fopen(path, "r");
    if (!f) return dl_err(DL_EIO, "option timing_trace_in: cannot open %s", path);
    char line[256];
    long long s = 0, end = -1, lineno = 0;
    size_t cap = 1024;
    int *c = dl_xcalloc((size_t)P, sizeof *c);
    double *t = dl_xcalloc(cap, sizeof *t);
    int rc = 0, hp = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        char tag[24], val[64], extra;
        long long a;
        int fr;
        if (end >= 0) rc = dl_err(DL_EINVAL, "line %lld after the end line", lineno);
        else if (lineno == 1) {
            if (strcmp(line, "dloco-timing-trace 1\n")) rc = dl_err(DL_EINVAL, "line 1 is not 'dloco-timing-trace 1'");
        } else if (lineno == 2) {
            if (sscanf(line, "fragments %d %c", &fr, &extra) != 1 || fr != P)
                rc = dl_err(DL_EINVAL, "line 2: not 'fragments %d' (this learner's fragments)", P);
        } else if (sscanf(line, "%23s %lld %63s %c", tag, &a, val, &extra) == 3 && !strcmp(tag, "p")) {
            char *e = NULL;
            double v = strcmp(val, "unknown") ? strtod(val, &e) : 0.0;
            if (a != s + 1) rc = dl_err(DL_EINVAL, "line %lld: step %lld, expected %lld", lineno, a, (long long)(s + 1));
            else if (e && (*e || !isfinite(v) || v < 0))
                rc = dl_err(DL_EINVAL, "line %lld: pressure '%s' is not a finite value >= 0 or unknown", lineno, val);
            else if (a > 100000000) rc = dl_err(DL_EINVAL, "line %lld: more than 1e8 steps", lineno);
            else {
                if ((size_t)a > cap) t = dl_xrealloc(t, (cap *= 2) * sizeof *t);
                t[a - 1] = v;
                s = a;
                hp = 1;
            }
        } else if (sscanf(line, "%23s %lld %d %c", tag, &a, &fr, &extra) == 3 && !strcmp(tag, "d")) {
            if (a < 1 || a > s || fr < 0 || fr >= P)
                rc = dl_err(DL_EINVAL, "line %lld: decision at step %lld of fragment %d outside steps 1..%lld, "
                                       "fragments 0..%d", lineno, a, fr, (long long)s, P - 1);
            else c[fr]++;
        } else if (sscanf(line, "%23s %lld %c", tag, &a, &extra) == 2 && !strcmp(tag, "end")) {
            if (a != s) rc = dl_err(DL_EINVAL, "line %lld: end %lld, but the last step is %lld", lineno, a, (long long)s);
            end = a;
        } else rc = dl_err(DL_EINVAL, "line %lld: not a p, d or end line", lineno);
    }
    fclose(f);
    if (!rc && (end < 0 || !hp)) rc = dl_err(DL_EINVAL, "no end line (a trace of a run that did not finish?)");
    if (!rc && end != steps)
        rc = dl_err(DL_EINVAL, "the trace has %lld steps, this run --steps %lld", (long long)end, (long long)steps);
    if (rc) {
        free(c);
        free(t);
        return dl_err(rc, "option timing_trace_in: %s: %s", path, dl_errmsg());
    }
    *counts = c;
    *pr = t;
    *n = end;
    return 0;
}

int dl_pushtiming_prepare(const learner_cfg *cfg, int P, dl_pushtiming *tc)
{
    memset(tc, 0, sizeof *tc);
    tc->cfg = cfg;
    tc->P = P;
    DL_TRY(dl_timing_parse(cfg->sync_timing, &tc->kind));
    tc->on = tc->kind != DL_TIMING_FIXED || cfg->timing_trace_out[0] || cfg->pressure[0];
    int planned = tc->kind == DL_TIMING_MATCHED_RANDOM || tc->kind == DL_TIMING_ORACLE;
    if (planned && !cfg->timing_trace_in[0])
        return dl_err(DL_EINVAL, "option sync_timing %s needs --timing_trace_in (a trace of the policy under test)",
                      cfg->sync_timing);
    if (!planned && cfg->timing_trace_in[0])
        return dl_err(DL_EINVAL, "option timing_trace_in is for sync_timing matched_random or oracle");
    if (cfg->h_min && cfg->h_max && cfg->h_min > cfg->h_max)
        return dl_err(DL_EINVAL, "option h_min %lld is above h_max %lld", (long long)cfg->h_min, (long long)cfg->h_max);
    if (cfg->pressure[0]) {
        int rc = dl_pressure_open(cfg->pressure, (int)cfg->pressure_poll_ms, (int)cfg->pressure_timeout_ms,
                                  (int)cfg->pressure_stale_ms, &tc->src);
        if (rc) return dl_err(rc, "option pressure: %s", dl_errmsg());
    }
    if (planned) DL_TRY(read_timing_trace(cfg->timing_trace_in, P, cfg->steps, &tc->counts, &tc->ptrace, &tc->tsteps));
    if (cfg->timing_trace_out[0]) {
        if (!(tc->trace = fopen(cfg->timing_trace_out, "w")))
            return dl_err(DL_EIO, "option timing_trace_out: cannot write %s", cfg->timing_trace_out);
        fprintf(tc->trace, "dloco-timing-trace 1\nfragments %d\n", P);
    }
    return 0;
}

int dl_pushtiming_start(dl_pushtiming *tc, int P, int H)
{
    const learner_cfg *cfg = tc->cfg;
    dl_timing_cfg c;
    dl_timing_defaults(&c, tc->kind, P, H);
    if (cfg->h_min) c.h_min = (int)cfg->h_min;
    if (cfg->h_max) c.h_max = (int)cfg->h_max;
    c.w_stale = cfg->wa_w_stale, c.w_loss = cfg->wa_w_loss, c.w_rate = cfg->wa_w_rate, c.w_link = cfg->wa_w_link;
    c.w_ckpt = cfg->wa_w_ckpt, c.rate_ref = cfg->wa_rate_ref, c.fc_alpha = cfg->wa_fc_alpha, c.fc_beta = cfg->wa_fc_beta;
    c.w_queue = cfg->wa_w_queue, c.queue_ref = cfg->wa_queue_ref;
    c.seed = (uint64_t)cfg->timing_seed;
    c.steps = cfg->steps;
    c.counts = tc->counts;
    c.trace = tc->ptrace;
    c.trace_len = tc->tsteps;
    c.window = (int)cfg->oracle_window;
    c.max_per_step = (int)cfg->wa_max_per_step;
    int rc = dl_timing_open(&c, &tc->t);
    if (rc) return dl_err(rc, "option sync_timing %s at H=%d: %s", cfg->sync_timing, H, dl_errmsg());
    char ev_src[DL_CFG_STRLEN + 8];
    dl_event("timing_start", "id=%s policy=%s h=%d h_min=%d h_max=%d fragments=%d pressure=%s seed=%llu", cfg->id,
             cfg->sync_timing, H, c.h_min, c.h_max, P, dl_event_str(cfg->pressure, ev_src, sizeof ev_src),
             (unsigned long long)c.seed);
    return 0;
}

void dl_pushtiming_step(dl_pushtiming *tc, int64_t step, double loss)
{
    if (!tc->t) return;
    dl_pressure_sample s = {.known = 0};
    if (tc->src) {
        const char *why = NULL;
        if (dl_pressure_get(tc->src, dl_clock_ns(), &s, &why))
            dl_event("pressure_refused", "id=%s step=%lld reason=%s kept=%d", tc->cfg->id, (long long)step,
                     why ? why : "unknown", s.known);
    }
    tc->last = s;
    dl_timing_observe(tc->t, step, &s, loss);
    if (tc->trace) {
        double pr = dl_timing_pressure(tc->t);
        if (isnan(pr)) fprintf(tc->trace, "p %lld unknown\n", (long long)step);
        else fprintf(tc->trace, "p %lld %.17g\n", (long long)step, pr);
    }
}

int dl_pushtiming_due(void *ctx, int64_t step, int p, int H)
{
    dl_pushtiming *tc = ctx;
    if (!tc->t) return dl_plan_due(step, p, H, tc->P);
    dl_timing_decision d;
    int due = dl_timing_due(tc->t, step, p, H, &d);
    if (!due) return 0;
    if (tc->trace) fprintf(tc->trace, "d %lld %d\n", (long long)step, p);
    dl_event("sync_timing",
             "id=%s step=%lld fragment=%d policy=%s elapsed=%lld forced=%d score=%.6g pressure=%.6g rate=%.6g "
             "link=%.6g ckpt=%.6g queue=%.6g known=%d",
             tc->cfg->id, (long long)step, p, tc->cfg->sync_timing, (long long)d.elapsed, d.forced, d.score,
             d.pressure, tc->last.rate, tc->last.link, tc->last.ckpt, tc->last.queue, tc->last.known);
    return 1;
}

void dl_pushtiming_finish(dl_pushtiming *tc, int64_t step)
{
    if (tc->trace) {
        fprintf(tc->trace, "end %lld\n", (long long)step);
        fclose(tc->trace);
        tc->trace = NULL;
    }
    if (tc->src) {
        dl_pressure_stats st;
        dl_pressure_get_stats(tc->src, &st);
        dl_event("pressure_summary", "id=%s polls=%llu good=%llu refused=%llu", tc->cfg->id,
                 (unsigned long long)st.polls, (unsigned long long)st.good, (unsigned long long)st.refused);
    }
    dl_timing_close(&tc->t);
    dl_pressure_close(&tc->src);
    free(tc->counts);
    free(tc->ptrace);
}
