/* The chaos accounting's readers: a run directory's events-chaos.log,
 * timeline.tsv, events-sync.log and the learners' events-<id>.log, into
 * the account's facts (chaos/account_int.h). */
#include "chaos/account_int.h"

#include "chaos/logfmt.h"
#include "core/err.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Learner events are matched to the incarnation whose [proc_start,
 * proc_exit] holds them, widened by this much: the harness stamps
 * proc_start before the exec and proc_exit after the reap, and a pid is
 * never reused that fast. */
#define MATCH_SLACK_S 0.5

/* ---- lookups */

/* The slot record with harness slot number `no` that was provisioned at t
 * (the latest slot_begin at or before t); else the first with that number. */
static int slot_by_no(const ctx *c, int64_t no, double t)
{
    int best = -1, any = -1;
    for (int i = 0; i < c->a->n_slots; i++) {
        if (c->a->slots[i].slot != no) continue;
        if (any < 0) any = i;
        if (c->a->slots[i].begin_s <= t + 1e-9) best = i;
    }
    return best >= 0 ? best : any;
}

static int slot_by_id(const ctx *c, const char *id, double t)
{
    int best = -1, any = -1;
    for (int i = 0; i < c->a->n_slots; i++) {
        if (strcmp(c->a->slots[i].id, id)) continue;
        if (any < 0) any = i;
        if (c->a->slots[i].begin_s <= t + 1e-9) best = i;
    }
    return best >= 0 ? best : any;
}

static int link_by_name(ctx *c, const char *name)
{
    dl_account *a = c->a;
    for (int i = 0; i < a->n_links; i++)
        if (!strcmp(a->links[i].name, name)) return i;
    int old = c->cap_links;
    GROW(a->links, a->n_links, c->cap_links);
    if (c->cap_links != old) {
        c->cap_samples = dl_xrealloc(c->cap_samples, (size_t)c->cap_links * sizeof *c->cap_samples);
    }
    dl_account_link *l = &a->links[a->n_links];
    memset(l, 0, sizeof *l);
    dl_acct_cpy(l->name, sizeof l->name, name);
    l->mean_up_Bps = l->mean_down_Bps = NAN;
    c->cap_samples[a->n_links] = 0;
    return a->n_links++;
}

/* ---- events-chaos.log */

static void on_run_start(ctx *c, const dl_logfmt_line *l)
{
    dl_account *a = c->a;
    dl_acct_cpy(a->label, sizeof a->label, dl_logfmt_str_or(l, "label", ""));
    dl_acct_cpy(a->policy, sizeof a->policy, dl_logfmt_str_or(l, "policy", ""));
    dl_acct_cpy(a->scenario, sizeof a->scenario, dl_logfmt_str_or(l, "scenario", ""));
    dl_acct_cpy(a->seed, sizeof a->seed, dl_logfmt_str_or(l, "seed", ""));
    a->baseline = (int)dl_logfmt_i64_or(l, "baseline", 0);
    a->netns = (int)dl_logfmt_i64_or(l, "netns", 0);
    a->duration_s = dl_logfmt_f64_or(l, "duration_s", NAN);
    a->eval_every_s = dl_logfmt_f64_or(l, "eval_every_s", NAN);
    a->fragments = (int)dl_logfmt_i64_or(l, "fragments", 0);
    a->slots_at_start = (int)dl_logfmt_i64_or(l, "slots", 0);
    a->dcs = (int)dl_logfmt_i64_or(l, "dcs", 0);
}

static void on_slot_begin(ctx *c, const dl_logfmt_line *l, double t)
{
    dl_account *a = c->a;
    int old = c->cap_slots;
    GROW(a->slots, a->n_slots, c->cap_slots);
    if (c->cap_slots != old) c->cap_states = dl_xrealloc(c->cap_states, (size_t)c->cap_slots * sizeof *c->cap_states);
    dl_account_slot *s = &a->slots[a->n_slots];
    memset(s, 0, sizeof *s);
    s->slot = (int)dl_logfmt_i64_or(l, "slot", -1);
    dl_acct_cpy(s->id, sizeof s->id, dl_logfmt_str_or(l, "id", ""));
    dl_acct_cpy(s->dc, sizeof s->dc, dl_logfmt_str_or(l, "dc", ""));
    s->speed = dl_logfmt_f64_or(l, "speed", 1.0);
    s->batch = dl_logfmt_i64_or(l, "batch", 0);
    s->begin_s = t;
    s->end_s = NAN;
    c->cap_states[a->n_slots] = 0;
    a->n_slots++;
}

static void on_slot_end(ctx *c, const dl_logfmt_line *l, double t)
{
    dl_account *a = c->a;
    int64_t no = dl_logfmt_i64_or(l, "slot", -1);
    for (int i = a->n_slots - 1; i >= 0; i--) {
        dl_account_slot *s = &a->slots[i];
        if (s->slot != no || !isnan(s->end_s)) continue;
        s->end_s = t < s->begin_s ? s->begin_s : t;
        dl_acct_cpy(s->end_reason, sizeof s->end_reason, dl_logfmt_str_or(l, "reason", "run_end"));
        return;
    }
    dl_acct_note(c, "slot_end of slot %lld at %.3f s with no open slot: ignored", (long long)no, t);
}

static void on_proc_start(ctx *c, const dl_logfmt_line *l, double t)
{
    int64_t pid = dl_logfmt_i64_or(l, "child_pid", -1); /* pid= is the harness's own */
    const char *role = dl_logfmt_str_or(l, "role", "");
    if (!strcmp(role, "sync")) {
        GROW(c->sinc, c->n_sinc, c->cap_sinc);
        sync_inc *s = &c->sinc[c->n_sinc++];
        memset(s, 0, sizeof *s);
        s->pid = pid;
        s->incarnation = (int)dl_logfmt_i64_or(l, "incarnation", c->n_sinc - 1);
        s->start = t;
        s->exit = NAN;
        return;
    }
    int64_t no = dl_logfmt_i64_or(l, "slot", -1);
    int si = slot_by_no(c, no, t);
    if (si < 0) {
        dl_acct_note(c, "proc_start of learner slot %lld (pid %lld) at %.3f s before any slot_begin: ignored", (long long)no,
             (long long)pid, t);
        return;
    }
    GROW(c->inc, c->n_inc, c->cap_inc);
    incarn *in = &c->inc[c->n_inc++];
    in->slot = si;
    in->pid = pid;
    in->first = c->a->slots[si].incarnations == 0;
    in->start = t;
    in->exit = NAN;
    in->ready = NAN;
    in->killed = 0;
    in->lastpush = NULL;
    in->tokens = 0.0;
    in->disc_summary = NAN;
    in->disc_returned = 0.0;
    c->a->slots[si].incarnations++;
}

static void on_proc_exit(ctx *c, const dl_logfmt_line *l, double t)
{
    int64_t pid = dl_logfmt_i64_or(l, "child_pid", -1);
    int64_t sig = dl_logfmt_i64_or(l, "signal", 0);
    if (!strcmp(dl_logfmt_str_or(l, "role", ""), "sync")) {
        for (int i = c->n_sinc - 1; i >= 0; i--) {
            if (c->sinc[i].pid != pid || !isnan(c->sinc[i].exit)) continue;
            c->sinc[i].exit = t;
            c->sinc[i].code = dl_logfmt_i64_or(l, "code", 0);
            c->sinc[i].signal = sig;
            break;
        }
        if (sig == 9) c->a->sync_crashes++;
        return;
    }
    for (int i = c->n_inc - 1; i >= 0; i--) {
        incarn *in = &c->inc[i];
        if (in->pid != pid || !isnan(in->exit)) continue;
        in->exit = t < in->start ? in->start : t;
        if (sig != 0) c->a->slots[in->slot].killed++, in->killed = 1;
        return;
    }
    dl_acct_note(c, "proc_exit of learner pid %lld at %.3f s without its proc_start: ignored", (long long)pid, t);
}

static void on_state(ctx *c, const dl_logfmt_line *l, double t)
{
    int64_t no = dl_logfmt_i64_or(l, "slot", -1);
    int si = slot_by_no(c, no, t);
    const char *name = dl_logfmt_str_or(l, "state", "");
    if (si < 0) {
        dl_acct_note(c, "state %s of slot %lld at %.3f s before any slot_begin: ignored", name, (long long)no, t);
        return;
    }
    dl_account_slot *s = &c->a->slots[si];
    int st = dl_acct_state_of(name);
    if (st == DL_ACCT_UNKNOWN) dl_acct_note(c, "slot %d (%s): unknown state \"%s\" at %.3f s", s->slot, s->id, name, t);
    GROW(s->states, s->n_states, c->cap_states[si]);
    s->states[s->n_states++] = (dl_account_state_change){.t_s = t, .state = st};
}

static void on_fault(ctx *c, const dl_logfmt_line *l, double t)
{
    dl_account *a = c->a;
    GROW(a->fault_events, a->n_fault_events, c->cap_fev);
    dl_account_fault_event *f = &a->fault_events[a->n_fault_events++];
    memset(f, 0, sizeof *f);
    f->n = (int)dl_logfmt_i64_or(l, "n", -1);
    f->t_s = t;
    f->value = dl_logfmt_f64_or(l, "value", 0.0);
    dl_acct_cpy(f->kind, sizeof f->kind, dl_logfmt_str_or(l, "kind", ""));
    dl_acct_cpy(f->target, sizeof f->target, dl_logfmt_str_or(l, "target", ""));
    dl_acct_cpy(f->phase, sizeof f->phase, dl_logfmt_str_or(l, "phase", ""));
    dl_acct_cpy(f->detail, sizeof f->detail, dl_logfmt_str_or(l, "detail", ""));
}

static void on_link(ctx *c, const dl_logfmt_line *l, double t)
{
    int i = link_by_name(c, dl_logfmt_str_or(l, "dc", ""));
    dl_account_link *k = &c->a->links[i];
    GROW(k->samples, k->n_samples, c->cap_samples[i]);
    k->samples[k->n_samples++] = (dl_account_link_sample){
        .t_s = t, .up_bytes = dl_logfmt_f64_or(l, "up_bytes", 0.0), .down_bytes = dl_logfmt_f64_or(l, "down_bytes", 0.0)};
}

static void on_dc(ctx *c, const dl_logfmt_line *l)
{
    int i = link_by_name(c, dl_logfmt_str_or(l, "name", ""));
    dl_account_link *k = &c->a->links[i];
    dl_acct_cpy(k->mode, sizeof k->mode, dl_logfmt_str_or(l, "mode", ""));
    k->bandwidth_mbit = dl_logfmt_f64_or(l, "bandwidth_mbit", 0.0);
    k->rtt_ms = dl_logfmt_f64_or(l, "rtt_ms", 0.0);
    k->learners = dl_logfmt_i64_or(l, "learners", 0);
}

static void count_lines(ctx *c, const char *name, const dl_logfmt_file *f)
{
    const dl_logfmt_stats *st = dl_logfmt_file_stats(f);
    dl_account *a = c->a;
    a->lines_garbage += st->garbage;
    a->lines_too_long += st->too_long;
    a->lines_torn += st->torn;
    a->lines_cut += st->cut;
    if (st->garbage || st->too_long || st->torn)
        dl_acct_note(c, "%s: skipped %lld garbage, %lld over-long and %lld torn line(s)", name, (long long)st->garbage,
             (long long)st->too_long, (long long)st->torn);
    if (st->cut) dl_acct_note(c, "%s: %lld event(s) cut by the writer (fields missing)", name, (long long)st->cut);
}

int dl_acct_read_chaos(ctx *c)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/events-chaos.log", c->dir);
    dl_logfmt_file *f = NULL;
    DL_TRY(dl_logfmt_open(path, &f));
    /* Time 0 is run_start's ts, so find it before reading anything else. */
    dl_logfmt_line *l = dl_xmalloc(sizeof *l);
    int rc, found = 0;
    while ((rc = dl_logfmt_next(f, l)) == 1) {
        if (strcmp(l->event, "run_start")) continue;
        c->ts0 = l->ts;
        on_run_start(c, l);
        found = 1;
        break;
    }
    dl_logfmt_close(&f);
    if (rc < 0) {
        free(l);
        return rc;
    }
    if (!found) {
        free(l);
        return dl_err(DL_EFORMAT, "%s: no run_start event", path);
    }
    if (c->a->fragments < 1) {
        free(l);
        return dl_err(DL_EFORMAT, "%s: run_start without fragments >= 1", path);
    }
    rc = dl_logfmt_open(path, &f);
    if (rc < 0) {
        free(l);
        return rc;
    }
    int starts = 0;
    c->last_t = 0.0;
    while ((rc = dl_logfmt_next(f, l)) == 1) {
        double t = dl_acct_rel(c, l->ts);
        if (t > c->last_t) c->last_t = t;
        const char *ev = l->event;
        dl_account *a = c->a;
        if (!strcmp(ev, "run_start")) {
            if (starts++) dl_acct_note(c, "events-chaos.log: another run_start at %.3f s ignored", t);
        } else if (!strcmp(ev, "slot_begin")) on_slot_begin(c, l, t);
        else if (!strcmp(ev, "slot_end")) on_slot_end(c, l, t);
        else if (!strcmp(ev, "proc_start")) on_proc_start(c, l, t);
        else if (!strcmp(ev, "proc_exit")) on_proc_exit(c, l, t);
        else if (!strcmp(ev, "state")) on_state(c, l, t);
        else if (!strcmp(ev, "fault")) on_fault(c, l, t);
        else if (!strcmp(ev, "link")) on_link(c, l, t);
        else if (!strcmp(ev, "dc")) on_dc(c, l);
        else if (!strcmp(ev, "eval")) {
            GROW(a->evals, a->n_evals, c->cap_evals);
            a->evals[a->n_evals++] = (dl_account_eval){.elapsed_s = dl_logfmt_f64_or(l, "elapsed_s", t),
                                                       .merges = dl_logfmt_i64_or(l, "merges", 0),
                                                       .val_loss = dl_logfmt_f64_or(l, "val_loss", NAN)};
        } else if (!strcmp(ev, "check")) {
            a->check_ok = (int)dl_logfmt_i64_or(l, "ok", -1);
            dl_acct_cpy(a->check_detail, sizeof a->check_detail, dl_logfmt_str_or(l, "detail", ""));
        } else if (!strcmp(ev, "run_end")) {
            c->have_run_end = 1;
            a->end_s = t;
            a->wall_s = dl_logfmt_f64_or(l, "wall_s", NAN);
            a->unplanned_exits = dl_logfmt_i64_or(l, "unplanned_exits", -1);
        }
    }
    count_lines(c, "events-chaos.log", f);
    dl_logfmt_close(&f);
    free(l);
    return rc < 0 ? rc : 0;
}

/* ---- timeline.tsv */

/* Split s at tabs in place; returns the number of fields (at most max). */
static int split_tabs(char *s, char **out, int max)
{
    int n = 0;
    while (n < max) {
        out[n++] = s;
        char *tab = strchr(s, '\t');
        if (!tab) break;
        *tab = 0;
        s = tab + 1;
    }
    return n;
}

void dl_acct_read_timeline(ctx *c)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/timeline.tsv", c->dir);
    FILE *fp = fopen(path, "r");
    if (!fp) {
        dl_acct_note(c, "no timeline.tsv (%s): no planned faults to check", strerror(errno));
        return;
    }
    dl_account *a = c->a;
    char line[1024];
    int lineno = 0;
    while (fgets(line, sizeof line, fp)) {
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n') line[--len] = 0;
        else if (!feof(fp)) {
            dl_acct_note(c, "timeline.tsv:%d: line too long, skipped", lineno);
            int ch;
            while ((ch = fgetc(fp)) != EOF && ch != '\n') {
            }
            continue;
        }
        if (len && line[len - 1] == '\r') line[--len] = 0;
        if (!len) continue;
        if (lineno == 1 && !strncmp(line, "n\t", 2)) continue; /* the header */
        char *fld[8];
        int nf = split_tabs(line, fld, 8);
        char *e1, *e2, *e3, *e4;
        long n = nf >= 6 ? strtol(fld[0], &e1, 10) : 0;
        double at = nf >= 6 ? strtod(fld[1], &e2) : 0, dur = nf >= 6 ? strtod(fld[4], &e3) : 0,
               val = nf >= 6 ? strtod(fld[5], &e4) : 0;
        if (nf < 6 || *e1 || e1 == fld[0] || *e2 || e2 == fld[1] || *e3 || e3 == fld[4] || *e4 || e4 == fld[5]) {
            dl_acct_note(c, "timeline.tsv:%d: not a fault row, skipped", lineno);
            continue;
        }
        GROW(a->faults, a->n_faults, c->cap_faults);
        dl_account_fault *f = &a->faults[a->n_faults++];
        memset(f, 0, sizeof *f);
        f->n = (int)n;
        f->at_s = at;
        f->duration_s = dur;
        f->value = val;
        dl_acct_cpy(f->kind, sizeof f->kind, fld[2]);
        dl_acct_cpy(f->target, sizeof f->target, fld[3]);
        dl_acct_cpy(f->source, sizeof f->source, nf >= 7 ? fld[6] : "");
    }
    fclose(fp);
}

/* ---- events-sync.log */

/* The kind of a push the synchronizer did not pool, from its decision and
 * reason (synchronizer/uplink.c, guard.c); -1 for a pooled one. */
static int refusal_kind(const char *decision, const char *reason)
{
    if (!strcmp(decision, "dropped_stale")) return DL_ACCT_REF_STALE;
    if (!strcmp(decision, "busy")) return DL_ACCT_REF_BUSY;
    if (!strcmp(decision, "duplicate")) return DL_ACCT_REF_DUPLICATE;
    if (strcmp(decision, "rejected")) return -1;
    if (!strncmp(reason, "norm ", 5)) return DL_ACCT_REF_NORM;
    if (!strncmp(reason, "tokens ", 7) || !strncmp(reason, "steps ", 6)) return DL_ACCT_REF_COUNTERS;
    if (!strncmp(reason, "base version ", 13)) return DL_ACCT_REF_REPLAY;
    if (!strncmp(reason, "chunk ", 6)) return DL_ACCT_REF_CHUNK;
    return DL_ACCT_REF_OTHER;
}

int dl_acct_read_sync(ctx *c)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/events-sync.log", c->dir);
    dl_logfmt_file *f = NULL;
    int rc = dl_logfmt_open(path, &f);
    if (rc == DL_ENOTFOUND) {
        dl_acct_note(c, "no events-sync.log: no merges, pushes or ledger to account");
        return 0;
    }
    DL_TRY(rc);
    dl_account *a = c->a;
    double P = (double)a->fragments, stale_sum = 0.0;
    dl_logfmt_line *l = dl_xmalloc(sizeof *l);
    while ((rc = dl_logfmt_next(f, l)) == 1) {
        double t = dl_acct_rel(c, l->ts);
        const char *ev = l->event;
        if (!strcmp(ev, "eval")) {
            dl_account *a = c->a;
            GROW(a->sync_evals, a->n_sync_evals, c->cap_sync_evals);
            a->sync_evals[a->n_sync_evals++] = (dl_account_sync_eval){.t_s = t,
                                                                      .version = dl_logfmt_i64_or(l, "version", 0),
                                                                      .val_loss = dl_logfmt_f64_or(l, "loss", NAN),
                                                                      .seqs = dl_logfmt_i64_or(l, "seqs", 0)};
        } else if (!strcmp(ev, "merge")) {
            double mc = dl_logfmt_f64_or(l, "compute_s", 0.0);
            if (!isfinite(mc) || mc < 0 || mc > 1e12) {
                dl_acct_note(c, "events-sync.log:%lld: merge with compute_s %g: ignored", (long long)dl_logfmt_lineno(f), mc);
                continue;
            }
            GROW(a->merge, a->merges, c->cap_merges);
            a->merge[a->merges++] = (dl_account_merge){.t_s = t,
                                                       .frag = (int)dl_logfmt_i64_or(l, "frag", -1),
                                                       .version = dl_logfmt_i64_or(l, "version", -1),
                                                       .n = (int)dl_logfmt_i64_or(l, "n", 0),
                                                       .compute_s = dl_logfmt_f64_or(l, "compute_s", 0.0),
                                                       .staleness_mean = dl_logfmt_f64_or(l, "staleness_mean", NAN),
                                                       .tokens = dl_logfmt_u64_or(l, "tokens", 0),
                                                       .goodput = NAN};
        } else if (!strcmp(ev, "merge_contrib")) {
            a->contributions++;
            double st = dl_logfmt_f64_or(l, "staleness", 0.0);
            double s = dl_logfmt_f64_or(l, "compute_s", 0.0) / P;
            if (!isfinite(st) || st < 0 || !isfinite(s) || s < 0 || s > 1e9) {
                /* no product writes these (the wire refuses them); a hostile or damaged file might */
                dl_acct_note(c, "events-sync.log:%lld: merge_contrib with staleness %g compute_s %g: ignored",
                     (long long)dl_logfmt_lineno(f), st, s * P);
                a->contributions--;
                continue;
            }
            stale_sum += st;
            int bin = st >= DL_ACCT_STALE_BINS - 1 ? DL_ACCT_STALE_BINS - 1 : (int)floor(st);
            a->staleness_hist[bin]++;
            int si = slot_by_id(c, dl_logfmt_str_or(l, "id", ""), t);
            if (si >= 0) c->goodput_raw[si] += s;
            else a->unattributed_s += s;
        } else if (!strcmp(ev, "learner_dead") || !strcmp(ev, "learner_join")) {
            int si = slot_by_id(c, dl_logfmt_str_or(l, "id", ""), t);
            if (si < 0) continue;
            dl_account_slot *sl = &a->slots[si];
            if (ev[8] == 'd') {
                sl->deaths++;
            } else {
                if (sl->joins++ > 0) {
                    sl->rejoins++;
                    if (dl_logfmt_i64_or(l, "must_fetch", 0) == 1) sl->refetches++;
                }
            }
        } else if (!strcmp(ev, "push")) {
            const char *dec = dl_logfmt_str_or(l, "decision", "");
            int si = slot_by_id(c, dl_logfmt_str_or(l, "id", ""), t);
            if (si >= 0) {
                int k = refusal_kind(dec, dl_logfmt_str_or(l, "reason", ""));
                if (k >= 0) a->slots[si].refused[k]++;
            }
            if (strcmp(dec, "dropped_stale")) continue;
            double s = dl_logfmt_f64_or(l, "compute_s", 0.0) / P;
            if (!isfinite(s) || s < 0 || s > 1e9) {
                dl_acct_note(c, "events-sync.log:%lld: push with compute_s %g: ignored", (long long)dl_logfmt_lineno(f), s * P);
                continue;
            }
            if (si >= 0) c->dropped_raw[si] += s;
            else a->unattributed_s += s;
        } else if (!strcmp(ev, "ledger")) {
            GROW(a->ledgers, a->n_ledgers, c->cap_ledgers);
            dl_account_ledger *g = &a->ledgers[a->n_ledgers++];
            memset(g, 0, sizeof *g);
            g->t_s = t;
            g->pid = dl_logfmt_i64_or(l, "pid", -1);
            g->incarnation = -1;
            for (int i = c->n_sinc - 1; i >= 0; i--)
                if (c->sinc[i].pid == g->pid) {
                    g->incarnation = c->sinc[i].incarnation;
                    c->sinc[i].ledgers++;
                    break;
                }
            g->applied = dl_logfmt_u64_or(l, "applied", 0);
            g->dropped_stale = dl_logfmt_u64_or(l, "dropped_stale", 0);
            g->rejected = dl_logfmt_u64_or(l, "rejected", 0);
            g->lost = dl_logfmt_u64_or(l, "lost", 0);
            g->discarded = dl_logfmt_u64_or(l, "discarded", 0);
            g->outstanding = dl_logfmt_u64_or(l, "outstanding", 0);
            g->pooled = dl_logfmt_u64_or(l, "pooled", 0);
            g->carried = dl_logfmt_u64_or(l, "carried", 0);
            g->processed = dl_logfmt_u64_or(l, "processed", 0);
            g->overclaim = dl_logfmt_u64_or(l, "overclaim", 0);
            g->carried_in = dl_logfmt_u64_or(l, "carried_in", 0);
        }
    }
    a->staleness_mean = a->contributions ? stale_sum / (double)a->contributions : NAN;
    count_lines(c, "events-sync.log", f);
    dl_logfmt_close(&f);
    free(l);
    return rc < 0 ? rc : 0;
}

/* ---- events-<id>.log */

static incarn *incarn_at(ctx *c, int64_t pid, double t)
{
    for (int i = c->n_inc - 1; i >= 0; i--) {
        incarn *in = &c->inc[i];
        if (in->pid != pid) continue;
        double end = isnan(in->exit) ? INFINITY : in->exit + MATCH_SLACK_S;
        if (t >= in->start - MATCH_SLACK_S && t <= end) return in;
    }
    return NULL;
}

/* The events of an incarnation that split its wasted time: pushes (the
 * time of each fragment's latest), discarded tokens, the token total. */
static void learner_fate(ctx *c, incarn *in, const dl_logfmt_line *l, double t)
{
    const char *ev = l->event;
    double v;
    if (!strcmp(ev, "push")) {
        int64_t p = dl_logfmt_i64_or(l, "fragment", -1);
        if (p < 0 || p >= c->a->fragments || c->a->fragments > DL_ACCT_MAX_TRACKED_P) return;
        if (!in->lastpush) {
            in->lastpush = dl_xmalloc((size_t)c->a->fragments * sizeof *in->lastpush);
            for (int i = 0; i < c->a->fragments; i++) in->lastpush[i] = NAN;
        }
        if (!(in->lastpush[p] >= t)) in->lastpush[p] = t;
    } else if (!strcmp(ev, "push_returned")) {
        v = dl_logfmt_f64_or(l, "discarded_tokens", 0.0);
        if (isfinite(v) && v > 0 && v < 1e18) in->disc_returned += v;
    } else {
        v = dl_logfmt_f64_or(l, "tokens", NAN);
        if (isfinite(v) && v >= 0 && v < 1e18) in->tokens = v;
        if (!strcmp(ev, "learner_summary")) {
            v = dl_logfmt_f64_or(l, "discarded_tokens", NAN);
            if (isfinite(v) && v >= 0 && v < 1e18) in->disc_summary = v;
        }
    }
}

static int read_learner_file(ctx *c, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c->dir, name);
    dl_logfmt_file *f = NULL;
    DL_TRY(dl_logfmt_open(path, &f));
    dl_logfmt_line *l = dl_xmalloc(sizeof *l);
    int rc;
    while ((rc = dl_logfmt_next(f, l)) == 1) {
        int ready = !strcmp(l->event, "ready"), barrier = !strcmp(l->event, "barrier_wait");
        int push = !strcmp(l->event, "push"), returned = !strcmp(l->event, "push_returned");
        int summary = !strcmp(l->event, "learner_summary"), step = !strcmp(l->event, "step");
        if (!ready && !barrier && !push && !returned && !summary && !step) continue;
        double t = dl_acct_rel(c, l->ts);
        incarn *in = incarn_at(c, dl_logfmt_i64_or(l, "pid", -1), t);
        if (!in) {
            c->a->events_unmatched++;
            continue;
        }
        if (push || returned || summary || step) {
            learner_fate(c, in, l, t);
            continue;
        }
        if (ready) {
            if (isnan(in->ready)) in->ready = t;
        } else {
            double w = dl_logfmt_f64_or(l, "waited_ms", 0.0) * 1e-3;
            if (!(w > 0)) continue;
            GROW(c->bar, c->n_bar, c->cap_bar);
            c->bar[c->n_bar++] = (span){.inc = (int)(in - c->inc), .t0 = t - w, .t1 = t};
        }
    }
    count_lines(c, name, f);
    dl_logfmt_close(&f);
    free(l);
    return rc < 0 ? rc : 0;
}

static int cmp_str(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

int dl_acct_read_learners(ctx *c)
{
    DIR *d = opendir(c->dir);
    if (!d) return dl_err(DL_EIO, "%s: %s", c->dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len <= 11 || strncmp(e->d_name, "events-", 7) || strcmp(e->d_name + len - 4, ".log")) continue;
        if (!strcmp(e->d_name, "events-chaos.log") || !strcmp(e->d_name, "events-sync.log")) continue;
        GROW(names, n, cap);
        names[n] = dl_xmalloc(len + 1);
        memcpy(names[n++], e->d_name, len + 1);
    }
    closedir(d);
    /* sorted, so the notes come out the same on every file system */
    if (n) qsort(names, (size_t)n, sizeof *names, cmp_str);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (!rc) rc = read_learner_file(c, names[i]);
        free(names[i]);
    }
    free(names);
    /* a slot without any events file cannot show ready or barrier events */
    for (int s = 0; s < c->a->n_slots; s++) {
        char want[128];
        snprintf(want, sizeof want, "%s/events-%s.log", c->dir, c->a->slots[s].id);
        FILE *fp = fopen(want, "rb");
        if (fp) fclose(fp);
        else if (c->a->slots[s].incarnations)
            dl_acct_note(c, "no events-%s.log: slot %d counts no ready or barrier_wait", c->a->slots[s].id,
                 c->a->slots[s].slot);
    }
    return rc;
}
