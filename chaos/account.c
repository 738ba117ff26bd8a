/* The accounting of one chaos run (chaos/account.h): the readers
 * (account_read.c) take a run directory's event logs and timeline.tsv in,
 * then this file sweeps each slot's time into buckets and totals it. */
#include "chaos/account_int.h"

#include "core/err.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int dl_acct_state_of(const char *name)
{
    for (int s = 0; s < DL_ACCT_UNKNOWN; s++)
        if (!strcmp(name, state_names[s])) return s;
    return DL_ACCT_UNKNOWN;
}


void dl_acct_note(ctx *c, const char *fmt, ...)
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

void dl_acct_cpy(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src ? src : ""); }

double dl_acct_rel(const ctx *c, int64_t ts) { return (double)(ts - c->ts0) * 1e-9; }

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
            dl_acct_note(c, "slot %d (%s): goodput + dropped_stale exceed its compute by %.3f s (clock skew?): both scaled down",
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
        if (!begun && skipped) dl_acct_cpy(f->why, sizeof f->why, "skipped by the harness");
        else if (!begun) dl_acct_cpy(f->why, sizeof f->why, "no begin event");
        else if (end_due && !ended) dl_acct_cpy(f->why, sizeof f->why, "no end event");
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
    if (a->faults_unplanned) dl_acct_note(c, "%d fault event(s) of no timeline.tsv row", a->faults_unplanned);
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
        dl_acct_cpy(a->ledger_mismatch, sizeof a->ledger_mismatch,
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
            dl_acct_note(c, "synchronizer incarnation %d (pid %lld) was SIGKILLed at %.3f s: its ledger is not recoverable",
                 s->incarnation, (long long)s->pid, s->exit);
        else if (isnan(s->exit))
            dl_acct_note(c, "synchronizer incarnation %d (pid %lld): no proc_exit and no ledger event", s->incarnation,
                 (long long)s->pid);
        else
            dl_acct_note(c, "synchronizer incarnation %d (pid %lld) exited (code %lld, signal %lld) without a ledger event",
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
        dl_acct_note(c, "no run_end event: the run ends at the last harness event (%.3f s)", a->end_s);
    }
    for (int i = 0; i < a->n_slots; i++) {
        dl_account_slot *s = &a->slots[i];
        sort_states(s);
        if (isnan(s->end_s)) {
            s->end_s = a->end_s < s->begin_s ? s->begin_s : a->end_s;
            dl_acct_cpy(s->end_reason, sizeof s->end_reason, "none");
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
        dl_acct_note(c,
             "%d merges but no merge_contrib event (a synchronizer older than the accounting): goodput cannot be "
             "attributed to learners and counts as wasted (%.3f learner-s were merged)",
             a->merges, merged / (double)a->fragments);
    }
    if (a->unattributed_s > 0)
        dl_acct_note(c, "%.3f s of merged or dropped compute from ids of no slot: in no bucket", a->unattributed_s);
    if (a->events_unmatched)
        dl_acct_note(c, "%lld learner event(s) of pids of no proc_start ignored", (long long)a->events_unmatched);
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
    int rc = dl_acct_read_chaos(&c);
    if (rc == 0) {
        c.goodput_raw = dl_xcalloc((size_t)(a->n_slots ? a->n_slots : 1), sizeof *c.goodput_raw);
        c.dropped_raw = dl_xcalloc((size_t)(a->n_slots ? a->n_slots : 1), sizeof *c.dropped_raw);
        dl_acct_read_timeline(&c);
        rc = dl_acct_read_sync(&c);
    }
    if (rc == 0) rc = dl_acct_read_learners(&c);
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
