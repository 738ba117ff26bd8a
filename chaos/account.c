/* The accounting of one chaos run (chaos/account.h): reads a run directory's
 * event logs and timeline.tsv, then sweeps each slot's time into buckets. */
#include "chaos/account.h"

#include "chaos/logfmt.h"
#include "core/err.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Learner events are matched to the incarnation whose [proc_start,
 * proc_exit] holds them, widened by this much: the harness stamps
 * proc_start before the exec and proc_exit after the reap, and a pid is
 * never reused that fast. */
#define MATCH_SLACK_S 0.5

static const char *const bucket_names[DL_ACCT_NBUCKETS] = {"down",         "startup", "recovery",     "idle_barrier",
                                                           "goodput",      "dropped_stale", "wasted"};
static const char *const state_names[DL_ACCT_NSTATES] = {"up", "slow", "partitioned", "hung", "dead", "left", "unknown"};

static const char *const waste_names[DL_ACCT_NWASTE] = {"killed", "discarded", "unpushed", "other"};
static const char *const refusal_names[DL_ACCT_NREFUSALS] = {"dropped_stale", "busy",   "duplicate",   "norm",
                                                             "counters",      "replay", "chunk_order", "rejected_other"};

const char *dl_account_waste_name(int w) { return w >= 0 && w < DL_ACCT_NWASTE ? waste_names[w] : "?"; }
const char *dl_account_refusal_name(int k) { return k >= 0 && k < DL_ACCT_NREFUSALS ? refusal_names[k] : "?"; }

const char *dl_account_bucket_name(int b)
{
    assert(b >= 0 && b < DL_ACCT_NBUCKETS);
    return bucket_names[b];
}

const char *dl_account_state_name(int s)
{
    assert(s >= 0 && s < DL_ACCT_NSTATES);
    return state_names[s];
}

static int state_of(const char *name)
{
    for (int s = 0; s < DL_ACCT_UNKNOWN; s++)
        if (!strcmp(name, state_names[s])) return s;
    return DL_ACCT_UNKNOWN;
}

/* Grow arr (n used, cap allocated) so one more element fits. */
/* Runs of more fragments than this do not track each fragment's latest push
 * (killed and unpushed then count as other). */
#define DL_ACCT_MAX_TRACKED_P 65536

#define GROW(arr, n, cap)                                                                                         \
    do {                                                                                                          \
        if ((n) >= (cap)) {                                                                                       \
            (cap) = (cap) ? 2 * (cap) : 16;                                                                       \
            (arr) = dl_xrealloc((arr), (size_t)(cap) * sizeof *(arr));                                            \
        }                                                                                                         \
    } while (0)

/* A learner process, from the harness's proc_start / proc_exit. */
typedef struct {
    int slot;     /* index into a->slots */
    int64_t pid;
    int first;    /* the slot's first incarnation: its start-up is `startup`, later ones `recovery` */
    int killed;   /* it exited by a signal */
    double start, exit, ready; /* exit, ready: NaN when none */
    double *lastpush;          /* [P] time of each fragment's latest push (NaN: none); NULL before its first */
    double tokens;             /* its latest reported token total (step, learner_summary) */
    double disc_summary;       /* learner_summary discarded_tokens (fragment-tokens); NaN without a summary */
    double disc_returned;      /* sum of push_returned discarded_tokens */
} incarn;

/* A barrier wait of an incarnation. */
typedef struct {
    int inc;
    double t0, t1;
} span;

typedef struct {
    int64_t pid;
    int incarnation;
    double start, exit;
    int64_t code, signal;
    int ledgers; /* ledger events of this pid */
} sync_inc;

typedef struct {
    dl_account *a;
    const char *dir;
    int64_t ts0;
    int have_run_end;
    double last_t; /* the latest harness event */
    incarn *inc;
    int n_inc, cap_inc;
    span *bar;
    int n_bar, cap_bar;
    sync_inc *sinc;
    int n_sinc, cap_sinc;
    double *goodput_raw, *dropped_raw; /* per slot, learner-s (already / P) */
    int cap_sync_evals;
    int cap_slots, cap_ledgers, cap_merges, cap_evals, cap_links, cap_faults, cap_fev, cap_notes;
    int *cap_states;  /* per slot */
    int *cap_samples; /* per link */
} ctx;

static void note(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(ctx *c, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    dl_account *a = c->a;
    GROW(a->notes, a->n_notes, c->cap_notes);
    size_t n = strlen(buf) + 1;
    a->notes[a->n_notes] = dl_xmalloc(n);
    memcpy(a->notes[a->n_notes], buf, n);
    a->n_notes++;
}

static void cpy(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src ? src : ""); }

static double rel(const ctx *c, int64_t ts) { return (double)(ts - c->ts0) * 1e-9; }

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
    cpy(l->name, sizeof l->name, name);
    l->mean_up_Bps = l->mean_down_Bps = NAN;
    c->cap_samples[a->n_links] = 0;
    return a->n_links++;
}

/* ---- events-chaos.log */

static void on_run_start(ctx *c, const dl_logfmt_line *l)
{
    dl_account *a = c->a;
    cpy(a->label, sizeof a->label, dl_logfmt_str_or(l, "label", ""));
    cpy(a->policy, sizeof a->policy, dl_logfmt_str_or(l, "policy", ""));
    cpy(a->scenario, sizeof a->scenario, dl_logfmt_str_or(l, "scenario", ""));
    cpy(a->seed, sizeof a->seed, dl_logfmt_str_or(l, "seed", ""));
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
    cpy(s->id, sizeof s->id, dl_logfmt_str_or(l, "id", ""));
    cpy(s->dc, sizeof s->dc, dl_logfmt_str_or(l, "dc", ""));
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
        cpy(s->end_reason, sizeof s->end_reason, dl_logfmt_str_or(l, "reason", "run_end"));
        return;
    }
    note(c, "slot_end of slot %lld at %.3f s with no open slot: ignored", (long long)no, t);
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
        note(c, "proc_start of learner slot %lld (pid %lld) at %.3f s before any slot_begin: ignored", (long long)no,
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
    note(c, "proc_exit of learner pid %lld at %.3f s without its proc_start: ignored", (long long)pid, t);
}

static void on_state(ctx *c, const dl_logfmt_line *l, double t)
{
    int64_t no = dl_logfmt_i64_or(l, "slot", -1);
    int si = slot_by_no(c, no, t);
    const char *name = dl_logfmt_str_or(l, "state", "");
    if (si < 0) {
        note(c, "state %s of slot %lld at %.3f s before any slot_begin: ignored", name, (long long)no, t);
        return;
    }
    dl_account_slot *s = &c->a->slots[si];
    int st = state_of(name);
    if (st == DL_ACCT_UNKNOWN) note(c, "slot %d (%s): unknown state \"%s\" at %.3f s", s->slot, s->id, name, t);
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
    cpy(f->kind, sizeof f->kind, dl_logfmt_str_or(l, "kind", ""));
    cpy(f->target, sizeof f->target, dl_logfmt_str_or(l, "target", ""));
    cpy(f->phase, sizeof f->phase, dl_logfmt_str_or(l, "phase", ""));
    cpy(f->detail, sizeof f->detail, dl_logfmt_str_or(l, "detail", ""));
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
    cpy(k->mode, sizeof k->mode, dl_logfmt_str_or(l, "mode", ""));
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
        note(c, "%s: skipped %lld garbage, %lld over-long and %lld torn line(s)", name, (long long)st->garbage,
             (long long)st->too_long, (long long)st->torn);
    if (st->cut) note(c, "%s: %lld event(s) cut by the writer (fields missing)", name, (long long)st->cut);
}

static int read_chaos(ctx *c)
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
        double t = rel(c, l->ts);
        if (t > c->last_t) c->last_t = t;
        const char *ev = l->event;
        dl_account *a = c->a;
        if (!strcmp(ev, "run_start")) {
            if (starts++) note(c, "events-chaos.log: another run_start at %.3f s ignored", t);
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
            cpy(a->check_detail, sizeof a->check_detail, dl_logfmt_str_or(l, "detail", ""));
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

static void read_timeline(ctx *c)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/timeline.tsv", c->dir);
    FILE *fp = fopen(path, "r");
    if (!fp) {
        note(c, "no timeline.tsv (%s): no planned faults to check", strerror(errno));
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
            note(c, "timeline.tsv:%d: line too long, skipped", lineno);
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
            note(c, "timeline.tsv:%d: not a fault row, skipped", lineno);
            continue;
        }
        GROW(a->faults, a->n_faults, c->cap_faults);
        dl_account_fault *f = &a->faults[a->n_faults++];
        memset(f, 0, sizeof *f);
        f->n = (int)n;
        f->at_s = at;
        f->duration_s = dur;
        f->value = val;
        cpy(f->kind, sizeof f->kind, fld[2]);
        cpy(f->target, sizeof f->target, fld[3]);
        cpy(f->source, sizeof f->source, nf >= 7 ? fld[6] : "");
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

static int read_sync(ctx *c)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/events-sync.log", c->dir);
    dl_logfmt_file *f = NULL;
    int rc = dl_logfmt_open(path, &f);
    if (rc == DL_ENOTFOUND) {
        note(c, "no events-sync.log: no merges, pushes or ledger to account");
        return 0;
    }
    DL_TRY(rc);
    dl_account *a = c->a;
    double P = (double)a->fragments, stale_sum = 0.0;
    dl_logfmt_line *l = dl_xmalloc(sizeof *l);
    while ((rc = dl_logfmt_next(f, l)) == 1) {
        double t = rel(c, l->ts);
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
                note(c, "events-sync.log:%lld: merge with compute_s %g: ignored", (long long)dl_logfmt_lineno(f), mc);
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
                note(c, "events-sync.log:%lld: merge_contrib with staleness %g compute_s %g: ignored",
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
                note(c, "events-sync.log:%lld: push with compute_s %g: ignored", (long long)dl_logfmt_lineno(f), s * P);
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
        double t = rel(c, l->ts);
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

static int read_learners(ctx *c)
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
            note(c, "no events-%s.log: slot %d counts no ready or barrier_wait", c->a->slots[s].id,
                 c->a->slots[s].slot);
    }
    return rc;
}

/* ---- the sweep of one slot's time */

enum { K_RUN, K_HUNG, K_FIRST, K_LATER, K_BAR, K_N };

typedef struct {
    double t;
    int kind, d;
} edge;

static int cmp_edge(const void *x, const void *y)
{
    double a = ((const edge *)x)->t, b = ((const edge *)y)->t;
    return a < b ? -1 : a > b;
}

static int classify(const int *k)
{
    if (k[K_RUN] <= 0 || k[K_HUNG] > 0) return DL_ACCT_DOWN;
    if (k[K_FIRST] > 0) return DL_ACCT_STARTUP;
    if (k[K_LATER] > 0) return DL_ACCT_RECOVERY;
    if (k[K_BAR] > 0) return DL_ACCT_IDLE_BARRIER;
    return -1; /* compute */
}

static void finish_time(dl_account_time *t)
{
    double sum = 0.0;
    for (int b = 0; b < DL_ACCT_NBUCKETS; b++) {
        t->frac[b] = t->provisioned_s > 0 ? t->bucket_s[b] / t->provisioned_s : NAN;
        sum += t->frac[b];
    }
    if (t->provisioned_s > 0 && !(fabs(sum - 1.0) <= 1e-9)) /* unreachable with finite inputs (they are checked on reading) */
        DL_PANIC("account: buckets sum to %.17g of provisioned, not 1", sum);
    t->availability_bound = t->provisioned_s > 0 ? 1.0 - t->frac[DL_ACCT_DOWN] : NAN;
    t->goodput_over_bound = t->availability_bound > 0 ? t->frac[DL_ACCT_GOODPUT] / t->availability_bound : NAN;
}

static void sweep_slot(ctx *c, int si)
{
    dl_account_slot *s = &c->a->slots[si];
    double b = s->begin_s, e = s->end_s;
    edge *ed = NULL;
    int n = 0, cap = 0;
#define EDGE(tt, kk, dd)                                                                                           \
    do {                                                                                                           \
        GROW(ed, n, cap);                                                                                          \
        double t_ = (tt);                                                                                          \
        ed[n++] = (edge){.t = t_ < b ? b : t_ > e ? e : t_, .kind = (kk), .d = (dd)};                              \
    } while (0)
    for (int i = 0; i < c->n_inc; i++) {
        incarn *in = &c->inc[i];
        if (in->slot != si) continue;
        double ex = isnan(in->exit) ? e : in->exit;
        double rd = isnan(in->ready) ? ex : in->ready < in->start ? in->start : in->ready > ex ? ex : in->ready;
        EDGE(in->start, K_RUN, 1);
        EDGE(ex, K_RUN, -1);
        EDGE(in->start, in->first ? K_FIRST : K_LATER, 1);
        EDGE(rd, in->first ? K_FIRST : K_LATER, -1);
    }
    for (int i = 0; i < c->n_bar; i++) {
        incarn *in = &c->inc[c->bar[i].inc];
        if (in->slot != si) continue;
        double ex = isnan(in->exit) ? e : in->exit;
        double t0 = c->bar[i].t0 < in->start ? in->start : c->bar[i].t0, t1 = c->bar[i].t1 > ex ? ex : c->bar[i].t1;
        if (t1 <= t0) continue;
        EDGE(t0, K_BAR, 1);
        EDGE(t1, K_BAR, -1);
    }
    for (int i = 0; i < s->n_states; i++) {
        if (s->states[i].state != DL_ACCT_HUNG) continue;
        EDGE(s->states[i].t_s, K_HUNG, 1);
        EDGE(i + 1 < s->n_states ? s->states[i + 1].t_s : e, K_HUNG, -1);
    }
#undef EDGE
    if (n) qsort(ed, (size_t)n, sizeof *ed, cmp_edge);
    int k[K_N] = {0};
    double acc[DL_ACCT_NBUCKETS] = {0}, compute = 0.0, prev = b, hung_running = 0.0;
    for (int i = 0; i <= n; i++) {
        double t = i < n ? ed[i].t : e;
        if (t > prev) {
            int cls = classify(k);
            if (cls < 0) compute += t - prev;
            else acc[cls] += t - prev;
            if (k[K_HUNG] > 0 && k[K_RUN] > 0) hung_running += t - prev;
            prev = t;
        }
        if (i < n) k[ed[i].kind] += ed[i].d;
    }
    free(ed);

    dl_account_time *tm = &s->time;
    memset(tm, 0, sizeof *tm);
    tm->provisioned_s = e - b;
    for (int j = 0; j <= DL_ACCT_IDLE_BARRIER; j++) tm->bucket_s[j] = acc[j];
    tm->compute_s = compute;
    double g = c->goodput_raw[si], d = c->dropped_raw[si];
    if (hung_running > 0) {
        /* A SIGSTOP lands inside a training step almost always (the step and
         * its throttle are nearly all of a learner's loop), so that step's
         * measured time, and every push that carries it, includes the stop.
         * The hung seconds (already in `down`) come off the merged compute:
         * an upper bound on what the stop added to it. */
        double cut = hung_running < g ? hung_running : g;
        g -= cut;
        tm->hang_credit_s = cut;
    }
    if (g + d > compute) {
        /* More credited than computed: the clocks of the learner, the
         * synchronizer and the harness disagree, or a push reported training
         * from outside the window. Scaled so the buckets still sum to the
         * provisioned time; the excess is reported, not hidden. */
        tm->skew_s = g + d - compute;
        double f = g + d > 0 ? compute / (g + d) : 0.0;
        g *= f;
        d *= f;
        tm->bucket_s[DL_ACCT_WASTED] = 0.0;
        if (tm->skew_s > 1e-6)
            note(c, "slot %d (%s): goodput + dropped_stale exceed its compute by %.3f s (clock skew?): both scaled down",
                 s->slot, s->id, tm->skew_s);
    } else {
        tm->bucket_s[DL_ACCT_WASTED] = compute - g - d;
    }
    tm->bucket_s[DL_ACCT_GOODPUT] = g;
    tm->bucket_s[DL_ACCT_DROPPED_STALE] = d;
    finish_time(tm);
}

/* ---- after reading */

static int state_at(const dl_account_slot *s, double t)
{
    int st = -1;
    for (int i = 0; i < s->n_states && s->states[i].t_s <= t; i++) st = s->states[i].state;
    return st;
}

static void sort_states(dl_account_slot *s)
{
    /* insertion sort: stable, and the harness writes them in order already */
    for (int i = 1; i < s->n_states; i++) {
        dl_account_state_change x = s->states[i];
        int j = i;
        while (j > 0 && s->states[j - 1].t_s > x.t_s) s->states[j] = s->states[j - 1], j--;
        s->states[j] = x;
    }
}

static void sort_merges(dl_account *a)
{
    for (int i = 1; i < a->merges; i++) {
        dl_account_merge x = a->merge[i];
        int j = i;
        while (j > 0 && a->merge[j - 1].t_s > x.t_s) a->merge[j] = a->merge[j - 1], j--;
        a->merge[j] = x;
    }
}

static void sort_samples(dl_account_link *k)
{
    for (int i = 1; i < k->n_samples; i++) {
        dl_account_link_sample x = k->samples[i];
        int j = i;
        while (j > 0 && k->samples[j - 1].t_s > x.t_s) k->samples[j] = k->samples[j - 1], j--;
        k->samples[j] = x;
    }
}

static void account_merges(ctx *c)
{
    dl_account *a = c->a;
    sort_merges(a);
    double cum = 0.0, alive_sum = 0.0, n_sum = 0.0;
    int in_run = 0;
    for (int m = 0; m < a->merges; m++) {
        dl_account_merge *g = &a->merge[m];
        double t = g->t_s, prov = 0.0;
        cum += g->compute_s / (double)a->fragments;
        for (int i = 0; i < a->n_slots; i++) {
            const dl_account_slot *s = &a->slots[i];
            double hi = t < s->end_s ? t : s->end_s;
            if (hi > s->begin_s) prov += hi - s->begin_s;
            if (t < s->begin_s || t >= s->end_s) continue;
            g->in_run = 1;
            int st = state_at(s, t);
            g->alive += st == DL_ACCT_UP || st == DL_ACCT_SLOW || st == DL_ACCT_PARTITIONED;
        }
        g->goodput = prov > 0 ? cum / prov : NAN;
        if (g->in_run) {
            in_run++;
            alive_sum += g->alive;
            n_sum += g->n;
        }
    }
    a->mean_alive = in_run ? alive_sum / in_run : NAN;
    a->mean_participation = in_run ? n_sum / in_run : NAN;
}

static void account_links(dl_account *a)
{
    for (int i = 0; i < a->n_links; i++) {
        dl_account_link *k = &a->links[i];
        sort_samples(k);
        k->mean_up_Bps = k->mean_down_Bps = NAN;
        k->peak_up_Bps = k->peak_down_Bps = 0.0;
        if (!k->n_samples) continue;
        const dl_account_link_sample *f = &k->samples[0], *l = &k->samples[k->n_samples - 1];
        k->up_bytes = l->up_bytes;
        k->down_bytes = l->down_bytes;
        if (l->t_s > f->t_s) {
            k->mean_up_Bps = (l->up_bytes - f->up_bytes) / (l->t_s - f->t_s);
            k->mean_down_Bps = (l->down_bytes - f->down_bytes) / (l->t_s - f->t_s);
        }
        for (int j = 1; j < k->n_samples; j++) {
            double dt = k->samples[j].t_s - k->samples[j - 1].t_s;
            if (dt <= 0) continue;
            double up = (k->samples[j].up_bytes - k->samples[j - 1].up_bytes) / dt;
            double dn = (k->samples[j].down_bytes - k->samples[j - 1].down_bytes) / dt;
            if (up > k->peak_up_Bps) k->peak_up_Bps = up;
            if (dn > k->peak_down_Bps) k->peak_down_Bps = dn;
        }
    }
}

static void account_faults(ctx *c)
{
    dl_account *a = c->a;
    int cap = 0;
    for (int i = 0; i < a->n_faults; i++) {
        dl_account_fault *f = &a->faults[i];
        f->planned = !(f->at_s >= a->duration_s); /* a NaN duration plans everything */
        if (!f->planned) continue;
        a->faults_planned++;
        int begun = 0, ended = 0, skipped = 0;
        for (int j = 0; j < a->n_fault_events; j++) {
            const dl_account_fault_event *e = &a->fault_events[j];
            if (e->n != f->n) continue;
            /* a fault the harness could not apply (its target not provisioned) */
            if (!strcmp(e->phase, "skipped")) skipped = 1;
            else if (!strcmp(e->phase, "begin") || !strcmp(e->phase, "instant")) begun = 1;
            else if (!strcmp(e->phase, "end")) ended = 1;
        }
        int end_due = f->duration_s > 0 && f->at_s + f->duration_s < a->duration_s;
        if (!begun && skipped) cpy(f->why, sizeof f->why, "skipped by the harness");
        else if (!begun) cpy(f->why, sizeof f->why, "no begin event");
        else if (end_due && !ended) cpy(f->why, sizeof f->why, "no end event");
        else f->applied = 1;
        if (f->applied) {
            a->faults_applied++;
        } else {
            GROW(a->missing, a->n_missing, cap);
            a->missing[a->n_missing++] = i;
        }
    }
    for (int j = 0; j < a->n_fault_events; j++) {
        int known = 0;
        for (int i = 0; i < a->n_faults && !known; i++) known = a->faults[i].n == a->fault_events[j].n;
        if (!known) a->faults_unplanned++;
    }
    if (a->faults_unplanned) note(c, "%d fault event(s) of no timeline.tsv row", a->faults_unplanned);
}

/* The store's ledger from check.out (storage/store_check.c's report line),
 * which covers every synchronizer incarnation: 1 with store_tokens[] set,
 * or 0 (no check.out, or no such line). */
static int store_ledger(ctx *c)
{
    char path[4096], line[1024];
    snprintf(path, sizeof path, "%s/check.out", c->dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    unsigned long long v[6];
    int got = 0;
    while (!got && fgets(line, sizeof line, f)) {
        const char *k = strstr(line, "ledger fragment-tokens: ");
        got = k && sscanf(k, "ledger fragment-tokens: applied %llu, dropped_stale %llu, rejected %llu, lost %llu, "
                             "discarded %llu, outstanding %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 6;
    }
    fclose(f);
    if (!got) return 0;
    for (int i = 0; i < 6; i++) c->a->store_tokens[i] = v[i];
    return 1;
}

static void account_tokens(ctx *c)
{
    dl_account *a = c->a;
    a->ledger_balanced = a->n_ledgers ? 1 : -1;
    if (!a->n_ledgers)
        cpy(a->ledger_mismatch, sizeof a->ledger_mismatch,
            "no ledger event: no synchronizer incarnation exited cleanly");
    for (int i = 0; i < a->n_ledgers; i++) {
        dl_account_ledger *g = &a->ledgers[i];
        a->applied += g->applied;
        a->dropped_stale += g->dropped_stale;
        a->rejected += g->rejected;
        a->lost += g->lost;
        a->discarded += g->discarded;
        a->outstanding += g->outstanding;
        a->processed += g->processed;
        a->carried_in += g->carried_in;
        a->overclaim += g->overclaim;
        uint64_t states = g->applied + g->dropped_stale + g->rejected + g->lost + g->discarded + g->outstanding;
        char why[160] = "";
        if (states != g->processed + g->carried_in)
            snprintf(why, sizeof why, "states sum to %llu, processed + carried_in to %llu", (unsigned long long)states,
                     (unsigned long long)(g->processed + g->carried_in));
        else if (g->pooled || g->carried)
            snprintf(why, sizeof why, "pooled %llu and carried %llu at exit (must be 0)",
                     (unsigned long long)g->pooled, (unsigned long long)g->carried);
        else if (g->overclaim)
            snprintf(why, sizeof why, "overclaim %llu (must be 0)", (unsigned long long)g->overclaim);
        g->balanced = !why[0];
        if (!g->balanced && a->ledger_balanced == 1) {
            a->ledger_balanced = 0;
            snprintf(a->ledger_mismatch, sizeof a->ledger_mismatch,
                     "ledger %d of %d (synchronizer pid %lld, incarnation %d, at %.3f s): %s", i + 1, a->n_ledgers,
                     (long long)g->pid, g->incarnation, g->t_s, why);
        }
    }
    uint64_t all = a->applied + a->dropped_stale + a->rejected + a->lost + a->discarded + a->outstanding;
    a->token_goodput = all ? (double)a->applied / (double)all : NAN;
    a->store_ledger = store_ledger(c);
    uint64_t st = 0;
    for (int i = 0; i < 6; i++) st += a->store_tokens[i];
    a->store_token_goodput = a->store_ledger && st ? (double)a->store_tokens[0] / (double)st : NAN;
    a->sync_incarnations = c->n_sinc;
    for (int i = 0; i < c->n_sinc; i++) {
        const sync_inc *s = &c->sinc[i];
        if (s->ledgers) continue;
        if (s->signal == 9)
            note(c, "synchronizer incarnation %d (pid %lld) was SIGKILLed at %.3f s: its ledger is not recoverable",
                 s->incarnation, (long long)s->pid, s->exit);
        else if (isnan(s->exit))
            note(c, "synchronizer incarnation %d (pid %lld): no proc_exit and no ledger event", s->incarnation,
                 (long long)s->pid);
        else
            note(c, "synchronizer incarnation %d (pid %lld) exited (code %lld, signal %lld) without a ledger event",
                 s->incarnation, (long long)s->pid, (long long)s->code, (long long)s->signal);
    }
}

/* The wasted bucket of each slot by cause (account.h). */
static int cmp_double(const void *x, const void *y)
{
    double p = *(const double *)x, q = *(const double *)y;
    return (p > q) - (p < q);
}

static void split_waste(ctx *c)
{
    dl_account *a = c->a;
    double P = (double)a->fragments;
    for (int si = 0; si < a->n_slots; si++) {
        dl_account_slot *s = &a->slots[si];
        double est[DL_ACCT_NWASTE] = {0}, disc_ft = 0.0;
        s->tokens = 0.0;
        for (int i = 0; i < c->n_inc; i++) {
            incarn *in = &c->inc[i];
            if (in->slot != si) continue;
            s->tokens += in->tokens;
            disc_ft += isnan(in->disc_summary) ? in->disc_returned : in->disc_summary;
            if (!in->lastpush && a->fragments > DL_ACCT_MAX_TRACKED_P) continue;
            /* the tail of each fragment: trained after its latest push, within the slot */
            double ex = isnan(in->exit) ? s->end_s : in->exit > s->end_s ? s->end_s : in->exit;
            double from = isnan(in->ready) ? ex : in->ready;
            double tail = 0.0;
            for (int p = 0; p < a->fragments; p++) {
                double lp = in->lastpush && !isnan(in->lastpush[p]) ? in->lastpush[p] : from;
                if (lp < from) lp = from;
                if (ex > lp) tail += ex - lp;
            }
            est[in->killed ? DL_ACCT_WASTE_KILLED : DL_ACCT_WASTE_UNPUSHED] += tail / P;
        }
        double compute = s->time.compute_s;
        if (disc_ft > 0 && s->tokens > 0 && compute > 0) est[DL_ACCT_WASTE_DISCARDED] = disc_ft * compute / (P * s->tokens);
        double w = s->time.bucket_s[DL_ACCT_WASTED], sum = 0.0;
        for (int k = 0; k < DL_ACCT_WASTE_OTHER; k++) sum += est[k];
        double f = sum > w && sum > 0 ? w / sum : 1.0;
        double other = w;
        for (int k = 0; k < DL_ACCT_WASTE_OTHER; k++) {
            s->wasted_s[k] = est[k] * f;
            other -= s->wasted_s[k];
        }
        s->wasted_s[DL_ACCT_WASTE_OTHER] = other > 0 ? other : 0.0;
        for (int k = 0; k < DL_ACCT_NWASTE; k++) a->wasted_s[k] += s->wasted_s[k];
    }
}

/* Slots whose goodput share is far below the fleet's median (account.h). */
static void flag_low_goodput(dl_account *a)
{
    double *v = dl_xmalloc((size_t)(a->n_slots ? a->n_slots : 1) * sizeof *v);
    int n = 0;
    for (int si = 0; si < a->n_slots; si++)
        if (a->slots[si].time.provisioned_s > 0 && !isnan(a->slots[si].time.frac[DL_ACCT_GOODPUT]))
            v[n++] = a->slots[si].time.frac[DL_ACCT_GOODPUT];
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    a->median_goodput = n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    free(v);
    for (int si = 0; si < a->n_slots; si++) {
        dl_account_slot *s = &a->slots[si];
        double g = s->time.frac[DL_ACCT_GOODPUT];
        s->low_goodput = n > 1 && s->time.provisioned_s > 0 && g < DL_ACCT_LOW_GOODPUT * a->median_goodput;
        a->low_goodput_slots += s->low_goodput;
    }
}

static void compute(ctx *c)
{
    dl_account *a = c->a;
    if (!c->have_run_end) {
        a->end_s = c->last_t;
        note(c, "no run_end event: the run ends at the last harness event (%.3f s)", a->end_s);
    }
    for (int i = 0; i < a->n_slots; i++) {
        dl_account_slot *s = &a->slots[i];
        sort_states(s);
        if (isnan(s->end_s)) {
            s->end_s = a->end_s < s->begin_s ? s->begin_s : a->end_s;
            cpy(s->end_reason, sizeof s->end_reason, "none");
        }
        sweep_slot(c, i);
        dl_account_time *f = &a->fleet;
        f->provisioned_s += s->time.provisioned_s;
        f->compute_s += s->time.compute_s;
        f->skew_s += s->time.skew_s;
        f->hang_credit_s += s->time.hang_credit_s;
        for (int b = 0; b < DL_ACCT_NBUCKETS; b++) f->bucket_s[b] += s->time.bucket_s[b];
    }
    finish_time(&a->fleet);
    split_waste(c);
    flag_low_goodput(a);
    if (!a->contributions && a->merges) {
        double merged = 0.0;
        for (int m = 0; m < a->merges; m++) merged += a->merge[m].compute_s;
        note(c,
             "%d merges but no merge_contrib event (a synchronizer older than the accounting): goodput cannot be "
             "attributed to learners and counts as wasted (%.3f learner-s were merged)",
             a->merges, merged / (double)a->fragments);
    }
    if (a->unattributed_s > 0)
        note(c, "%.3f s of merged or dropped compute from ids of no slot: in no bucket", a->unattributed_s);
    if (a->events_unmatched)
        note(c, "%lld learner event(s) of pids of no proc_start ignored", (long long)a->events_unmatched);
    account_merges(c);
    account_links(a);
    account_faults(c);
    account_tokens(c);
    a->final_val_loss = a->n_evals ? a->evals[a->n_evals - 1].val_loss : NAN;
    a->final_sync_val_loss = a->n_sync_evals ? a->sync_evals[a->n_sync_evals - 1].val_loss : NAN;
}

int dl_account_run(const char *run_dir, dl_account **out)
{
    assert(run_dir && out);
    *out = NULL;
    dl_account *a = dl_xcalloc(1, sizeof *a);
    a->duration_s = a->eval_every_s = a->wall_s = NAN;
    a->check_ok = -1;
    a->unplanned_exits = -1;
    ctx c = {.a = a, .dir = run_dir};
    int rc = read_chaos(&c);
    if (rc == 0) {
        c.goodput_raw = dl_xcalloc((size_t)(a->n_slots ? a->n_slots : 1), sizeof *c.goodput_raw);
        c.dropped_raw = dl_xcalloc((size_t)(a->n_slots ? a->n_slots : 1), sizeof *c.dropped_raw);
        read_timeline(&c);
        rc = read_sync(&c);
    }
    if (rc == 0) rc = read_learners(&c);
    if (rc == 0) compute(&c);
    for (int i = 0; i < c.n_inc; i++) free(c.inc[i].lastpush);
    free(c.inc);
    free(c.bar);
    free(c.sinc);
    free(c.goodput_raw);
    free(c.dropped_raw);
    free(c.cap_states);
    free(c.cap_samples);
    if (rc < 0) {
        dl_account_close(&a);
        return rc;
    }
    *out = a;
    return 0;
}

void dl_account_close(dl_account **ap)
{
    if (!ap || !*ap) return;
    dl_account *a = *ap;
    for (int i = 0; i < a->n_slots; i++) free(a->slots[i].states);
    free(a->slots);
    free(a->ledgers);
    free(a->merge);
    free(a->evals);
    free(a->sync_evals);
    for (int i = 0; i < a->n_links; i++) free(a->links[i].samples);
    free(a->links);
    free(a->faults);
    free(a->fault_events);
    free(a->missing);
    for (int i = 0; i < a->n_notes; i++) free(a->notes[i]);
    free(a->notes);
    free(a);
    *ap = NULL;
}
