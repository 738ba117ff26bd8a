/* The chaos report (chaos/report.h): report.md for people, report.json for
 * tools, and gnuplot scripts + data for the plots, run into SVGs. */
#include "chaos/report.h"

#include "core/err.h"
#include "core/json.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define JSON_SCHEMA "dloco-chaos-report/1"

/* One run as the report shows it. */
typedef struct {
    const dl_account *a;
    char label[64];
    char file[80];    /* label made safe for a file name, unique among the runs */
    int is_baseline;  /* the label ends in -baseline */
    int twin;         /* for a policy run: the index of its baseline twin; -1 none */
    double loss_cost; /* final val loss / the twin's - 1; NaN without a twin or a loss */
} run_info;

typedef struct {
    const char *dir;
    const char *scenario;
    run_info *r;
    int n;
    int rc;        /* the first failure */
    char msg[512]; /* its detail (later dl_err calls would overwrite it) */
} rep;

/* bytes/s -> Mbit/s (10^6 bits/s, the unit of a link's configured bandwidth) */
#define MBIT (8.0 / 1e6)

static void keep(rep *R, int rc)
{
    if (!rc || R->rc) return;
    R->rc = rc;
    snprintf(R->msg, sizeof R->msg, "%s", dl_errmsg());
}

static const char *const state_colors[DL_ACCT_NSTATES] = {"#2ca02c", "#bcbd22", "#ff7f0e", "#9467bd",
                                                          "#d62728", "#7f7f7f", "#c7c7c7"};

static int fail_io(rep *R, const char *what)
{
    int rc = dl_err(DL_EIO, "%s: %s", what, strerror(errno));
    keep(R, rc);
    return rc;
}

static FILE *open_out(rep *R, const char *sub, const char *name, char *path, size_t cap)
{
    if (sub) snprintf(path, cap, "%s/%s/%s", R->dir, sub, name);
    else snprintf(path, cap, "%s/%s", R->dir, name);
    FILE *f = fopen(path, "w");
    if (!f) fail_io(R, path);
    return f;
}

static void close_out(rep *R, FILE *f, const char *path)
{
    int bad = ferror(f);
    if (fclose(f) || bad) fail_io(R, path);
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}


/* ---- formatting helpers (each returns its own buffer, one per call site use) */

static const char *pct(char *b, size_t cap, double x)
{
    if (!isfinite(x)) snprintf(b, cap, "n/a");
    else snprintf(b, cap, "%.1f%%", 100.0 * x);
    return b;
}

static const char *num(char *b, size_t cap, double x, int prec)
{
    if (!isfinite(x)) snprintf(b, cap, "n/a");
    else snprintf(b, cap, "%.*f", prec, x);
    return b;
}

static const char *tri(int v) { return v == 1 ? "yes" : v == 0 ? "**NO**" : "n/a"; }

/* A markdown table cell: no newline, | escaped. */
static void md_cell(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '|') fputs("\\|", f);
        else if (*s == '\n' || *s == '\r' || *s == '\t') fputc(' ', f);
        else fputc(*s, f);
    }
}

/* ---- JSON (core/json.h writes it) */

static void json_time(dl_json_w *w, const char *key, const dl_account_time *t)
{
    dl_json_w_open(w, key, '{', 0);
    dl_json_w_num(w, "provisioned_s", t->provisioned_s);
    dl_json_w_num(w, "compute_s", t->compute_s);
    dl_json_w_num(w, "skew_s", t->skew_s);
    dl_json_w_num(w, "hang_credit_s", t->hang_credit_s);
    dl_json_w_open(w, "seconds", '{', 1);
    for (int b = 0; b < DL_ACCT_NBUCKETS; b++) dl_json_w_num(w, dl_account_bucket_name(b), t->bucket_s[b]);
    dl_json_w_close(w, '}');
    dl_json_w_open(w, "fractions", '{', 1);
    for (int b = 0; b < DL_ACCT_NBUCKETS; b++) dl_json_w_num(w, dl_account_bucket_name(b), t->frac[b]);
    dl_json_w_close(w, '}');
    dl_json_w_num(w, "goodput", t->frac[DL_ACCT_GOODPUT]);
    dl_json_w_num(w, "availability_bound", t->availability_bound);
    dl_json_w_num(w, "goodput_over_bound", t->goodput_over_bound);
    dl_json_w_close(w, '}');
}

/* The wasted bucket by cause, seconds. */
static void json_waste(dl_json_w *w, const double *wasted_s)
{
    dl_json_w_open(w, "wasted_s", '{', 1);
    for (int k = 0; k < DL_ACCT_NWASTE; k++) dl_json_w_num(w, dl_account_waste_name(k), wasted_s[k]);
    dl_json_w_close(w, '}');
}

static void json_run(dl_json_w *w, const rep *R, int i)
{
    const run_info *ri = &R->r[i];
    const dl_account *a = ri->a;
    dl_json_w_open(w, NULL, '{', 0);
    dl_json_w_str(w, "label", ri->label);
    dl_json_w_str(w, "run_label", a->label);
    dl_json_w_str(w, "policy", a->policy);
    dl_json_w_bool(w, "baseline", ri->is_baseline);
    dl_json_w_key(w, "twin");
    if (ri->twin >= 0) dl_json_w_string(w, R->r[ri->twin].label);
    else dl_json_w_raw(w, "null");
    dl_json_w_str(w, "scenario", a->scenario);
    dl_json_w_str(w, "seed", a->seed);
    dl_json_w_str(w, "mode", a->netns ? "netns" : "loopback");
    dl_json_w_num(w, "duration_s", a->duration_s);
    dl_json_w_num(w, "end_s", a->end_s);
    dl_json_w_num(w, "wall_s", a->wall_s);
    dl_json_w_int(w, "fragments", a->fragments);
    dl_json_w_int(w, "slots_at_start", a->slots_at_start);
    dl_json_w_int(w, "dcs", a->dcs);
    dl_json_w_num(w, "eval_every_s", a->eval_every_s);

    /* the headline, flat, as the table shows it */
    dl_json_w_num(w, "goodput", a->fleet.frac[DL_ACCT_GOODPUT]);
    dl_json_w_num(w, "availability_bound", a->fleet.availability_bound);
    dl_json_w_num(w, "goodput_over_bound", a->fleet.goodput_over_bound);
    dl_json_w_num(w, "final_val_loss", a->final_val_loss);
    dl_json_w_num(w, "loss_cost", ri->loss_cost);
    dl_json_w_int(w, "merges", a->merges);
    dl_json_w_num(w, "token_goodput", a->token_goodput);
    dl_json_w_tri(w, "ledger_balanced", a->ledger_balanced);
    dl_json_w_int(w, "faults_planned", a->faults_planned);
    dl_json_w_int(w, "faults_applied", a->faults_applied);
    dl_json_w_tri(w, "check_ok", a->check_ok);
    dl_json_w_key(w, "unplanned_exits");
    if (a->unplanned_exits >= 0) dl_json_w_raw(w, "%lld", (long long)a->unplanned_exits);
    else dl_json_w_raw(w, "null");

    json_time(w, "time", &a->fleet);
    json_waste(w, a->wasted_s);
    dl_json_w_num(w, "median_goodput", a->median_goodput);
    dl_json_w_int(w, "low_goodput_learners", a->low_goodput_slots);
    dl_json_w_num(w, "unattributed_s", a->unattributed_s);
    dl_json_w_open(w, "learners", '[', 0);
    for (int s = 0; s < a->n_slots; s++) {
        const dl_account_slot *sl = &a->slots[s];
        dl_json_w_open(w, NULL, '{', 0);
        dl_json_w_int(w, "slot", sl->slot);
        dl_json_w_str(w, "id", sl->id);
        dl_json_w_str(w, "dc", sl->dc);
        dl_json_w_num(w, "speed", sl->speed);
        dl_json_w_int(w, "batch", (long long)sl->batch);
        dl_json_w_num(w, "begin_s", sl->begin_s);
        dl_json_w_num(w, "end_s", sl->end_s);
        dl_json_w_str(w, "end_reason", sl->end_reason);
        dl_json_w_int(w, "incarnations", sl->incarnations);
        dl_json_w_int(w, "killed", sl->killed);
        json_time(w, "time", &sl->time);
        json_waste(w, sl->wasted_s);
        dl_json_w_num(w, "tokens", sl->tokens);
        dl_json_w_bool(w, "low_goodput", sl->low_goodput);
        dl_json_w_open(w, "sync_view", '{', 1);
        dl_json_w_int(w, "deaths", sl->deaths);
        dl_json_w_int(w, "joins", sl->joins);
        dl_json_w_int(w, "rejoins", sl->rejoins);
        dl_json_w_int(w, "refetches", sl->refetches);
        dl_json_w_open(w, "refused", '{', 1);
        for (int k = 0; k < DL_ACCT_NREFUSALS; k++)
            dl_json_w_int(w, dl_account_refusal_name(k), (long long)sl->refused[k]);
        dl_json_w_close(w, '}');
        dl_json_w_close(w, '}');
        dl_json_w_open(w, "states", '[', 1);
        for (int k = 0; k < sl->n_states; k++) {
            dl_json_w_open(w, NULL, '[', 1);
            dl_json_w_num(w, NULL, sl->states[k].t_s);
            dl_json_w_str(w, NULL, dl_account_state_name(sl->states[k].state));
            dl_json_w_close(w, ']');
        }
        dl_json_w_close(w, ']');
        dl_json_w_close(w, '}');
    }
    dl_json_w_close(w, ']');

    dl_json_w_open(w, "tokens", '{', 0);
    dl_json_w_u64(w, "applied", a->applied);
    dl_json_w_u64(w, "dropped_stale", a->dropped_stale);
    dl_json_w_u64(w, "rejected", a->rejected);
    dl_json_w_u64(w, "lost", a->lost);
    dl_json_w_u64(w, "discarded", a->discarded);
    dl_json_w_u64(w, "outstanding", a->outstanding);
    dl_json_w_u64(w, "processed", a->processed);
    dl_json_w_u64(w, "carried_in", a->carried_in);
    dl_json_w_u64(w, "overclaim", a->overclaim);
    dl_json_w_num(w, "token_goodput", a->token_goodput);
    dl_json_w_tri(w, "ledger_balanced", a->ledger_balanced);
    if (a->store_ledger) { /* check.out's ledger: every synchronizer incarnation */
        static const char *const st[6] = {"applied", "dropped_stale", "rejected", "lost", "discarded", "outstanding"};
        dl_json_w_open(w, "store", '{', 1);
        for (int k = 0; k < 6; k++) dl_json_w_u64(w, st[k], a->store_tokens[k]);
        dl_json_w_num(w, "token_goodput", a->store_token_goodput);
        dl_json_w_close(w, '}');
    } else {
        dl_json_w_key(w, "store");
        dl_json_w_raw(w, "null");
    }
    dl_json_w_key(w, "mismatch");
    if (a->ledger_balanced == 1) dl_json_w_raw(w, "null");
    else dl_json_w_string(w, a->ledger_mismatch);
    dl_json_w_int(w, "sync_incarnations", a->sync_incarnations);
    dl_json_w_int(w, "sync_crashes", a->sync_crashes);
    dl_json_w_open(w, "ledgers", '[', 0);
    for (int k = 0; k < a->n_ledgers; k++) {
        const dl_account_ledger *g = &a->ledgers[k];
        dl_json_w_open(w, NULL, '{', 1);
        dl_json_w_num(w, "t_s", g->t_s);
        dl_json_w_int(w, "pid", (long long)g->pid);
        dl_json_w_int(w, "incarnation", g->incarnation);
        dl_json_w_u64(w, "applied", g->applied);
        dl_json_w_u64(w, "dropped_stale", g->dropped_stale);
        dl_json_w_u64(w, "rejected", g->rejected);
        dl_json_w_u64(w, "lost", g->lost);
        dl_json_w_u64(w, "discarded", g->discarded);
        dl_json_w_u64(w, "outstanding", g->outstanding);
        dl_json_w_u64(w, "pooled", g->pooled);
        dl_json_w_u64(w, "carried", g->carried);
        dl_json_w_u64(w, "processed", g->processed);
        dl_json_w_u64(w, "overclaim", g->overclaim);
        dl_json_w_u64(w, "carried_in", g->carried_in);
        dl_json_w_bool(w, "balanced", g->balanced);
        dl_json_w_close(w, '}');
    }
    dl_json_w_close(w, ']');
    dl_json_w_close(w, '}');

    dl_json_w_open(w, "eval", '[', 0);
    for (int k = 0; k < a->n_evals; k++) {
        dl_json_w_open(w, NULL, '[', 1);
        dl_json_w_num(w, NULL, a->evals[k].elapsed_s);
        dl_json_w_int(w, NULL, (long long)a->evals[k].merges);
        dl_json_w_num(w, NULL, a->evals[k].val_loss);
        dl_json_w_close(w, ']');
    }
    dl_json_w_close(w, ']');

    /* the synchronizer's own periodic evaluation (dloco-sync --eval_every_s) */
    dl_json_w_num(w, "final_sync_val_loss", a->final_sync_val_loss);
    dl_json_w_open(w, "sync_eval", '[', 0);
    for (int k = 0; k < a->n_sync_evals; k++) {
        dl_json_w_open(w, NULL, '[', 1);
        dl_json_w_num(w, NULL, a->sync_evals[k].t_s);
        dl_json_w_int(w, NULL, (long long)a->sync_evals[k].version);
        dl_json_w_num(w, NULL, a->sync_evals[k].val_loss);
        dl_json_w_int(w, NULL, (long long)a->sync_evals[k].seqs);
        dl_json_w_close(w, ']');
    }
    dl_json_w_close(w, ']');

    dl_json_w_open(w, "merge_series", '[', 0);
    for (int k = 0; k < a->merges; k++) {
        const dl_account_merge *m = &a->merge[k];
        dl_json_w_open(w, NULL, '[', 1);
        dl_json_w_num(w, NULL, m->t_s);
        dl_json_w_int(w, NULL, m->frag);
        dl_json_w_int(w, NULL, (long long)m->version);
        dl_json_w_int(w, NULL, m->n);
        dl_json_w_int(w, NULL, m->alive);
        dl_json_w_bool(w, NULL, m->in_run);
        dl_json_w_num(w, NULL, m->compute_s);
        dl_json_w_num(w, NULL, m->goodput);
        dl_json_w_close(w, ']');
    }
    dl_json_w_close(w, ']');

    dl_json_w_open(w, "staleness", '{', 0);
    dl_json_w_int(w, "contributions", (long long)a->contributions);
    dl_json_w_num(w, "mean", a->staleness_mean);
    dl_json_w_open(w, "histogram", '[', 1);
    for (int b = 0; b < DL_ACCT_STALE_BINS; b++) dl_json_w_int(w, NULL, (long long)a->staleness_hist[b]);
    dl_json_w_close(w, ']');
    dl_json_w_close(w, '}');

    dl_json_w_open(w, "liveness", '{', 0);
    dl_json_w_num(w, "mean_alive", a->mean_alive);
    dl_json_w_num(w, "mean_participation", a->mean_participation);
    dl_json_w_close(w, '}');

    dl_json_w_open(w, "links", '[', 0);
    for (int k = 0; k < a->n_links; k++) {
        const dl_account_link *l = &a->links[k];
        dl_json_w_open(w, NULL, '{', 0);
        dl_json_w_str(w, "dc", l->name);
        dl_json_w_str(w, "mode", l->mode);
        dl_json_w_num(w, "bandwidth_mbit", l->bandwidth_mbit);
        dl_json_w_num(w, "rtt_ms", l->rtt_ms);
        dl_json_w_int(w, "learners", (long long)l->learners);
        dl_json_w_num(w, "up_bytes", l->up_bytes);
        dl_json_w_num(w, "down_bytes", l->down_bytes);
        dl_json_w_num(w, "mean_up_Bps", l->mean_up_Bps);
        dl_json_w_num(w, "mean_down_Bps", l->mean_down_Bps);
        dl_json_w_num(w, "peak_up_Bps", l->peak_up_Bps);
        dl_json_w_num(w, "peak_down_Bps", l->peak_down_Bps);
        dl_json_w_num(w, "mean_up_mbit_s", l->mean_up_Bps * MBIT);
        dl_json_w_num(w, "mean_down_mbit_s", l->mean_down_Bps * MBIT);
        dl_json_w_num(w, "peak_up_mbit_s", l->peak_up_Bps * MBIT);
        dl_json_w_num(w, "peak_down_mbit_s", l->peak_down_Bps * MBIT);
        dl_json_w_open(w, "samples", '[', 1);
        for (int j = 0; j < l->n_samples; j++) {
            dl_json_w_open(w, NULL, '[', 1);
            dl_json_w_num(w, NULL, l->samples[j].t_s);
            dl_json_w_num(w, NULL, l->samples[j].up_bytes);
            dl_json_w_num(w, NULL, l->samples[j].down_bytes);
            dl_json_w_close(w, ']');
        }
        dl_json_w_close(w, ']');
        dl_json_w_close(w, '}');
    }
    dl_json_w_close(w, ']');

    dl_json_w_open(w, "faults", '{', 0);
    dl_json_w_int(w, "planned", a->faults_planned);
    dl_json_w_int(w, "applied", a->faults_applied);
    dl_json_w_int(w, "unplanned_events", a->faults_unplanned);
    dl_json_w_open(w, "missing", '[', 0);
    for (int k = 0; k < a->n_missing; k++) {
        const dl_account_fault *f = &a->faults[a->missing[k]];
        dl_json_w_open(w, NULL, '{', 1);
        dl_json_w_int(w, "n", f->n);
        dl_json_w_str(w, "kind", f->kind);
        dl_json_w_str(w, "target", f->target);
        dl_json_w_str(w, "why", f->why);
        dl_json_w_close(w, '}');
    }
    dl_json_w_close(w, ']');
    dl_json_w_open(w, "timeline", '[', 0);
    for (int k = 0; k < a->n_faults; k++) {
        const dl_account_fault *f = &a->faults[k];
        dl_json_w_open(w, NULL, '{', 1);
        dl_json_w_int(w, "n", f->n);
        dl_json_w_num(w, "at_s", f->at_s);
        dl_json_w_str(w, "kind", f->kind);
        dl_json_w_str(w, "target", f->target);
        dl_json_w_num(w, "duration_s", f->duration_s);
        dl_json_w_num(w, "value", f->value);
        dl_json_w_str(w, "source", f->source);
        dl_json_w_bool(w, "planned", f->planned);
        dl_json_w_bool(w, "applied", f->applied);
        dl_json_w_close(w, '}');
    }
    dl_json_w_close(w, ']');
    dl_json_w_open(w, "events", '[', 0);
    for (int k = 0; k < a->n_fault_events; k++) {
        const dl_account_fault_event *e = &a->fault_events[k];
        dl_json_w_open(w, NULL, '{', 1);
        dl_json_w_int(w, "n", e->n);
        dl_json_w_num(w, "t_s", e->t_s);
        dl_json_w_str(w, "kind", e->kind);
        dl_json_w_str(w, "target", e->target);
        dl_json_w_str(w, "phase", e->phase);
        dl_json_w_num(w, "value", e->value);
        dl_json_w_str(w, "detail", e->detail);
        dl_json_w_close(w, '}');
    }
    dl_json_w_close(w, ']');
    dl_json_w_close(w, '}');

    dl_json_w_str(w, "check_detail", a->check_detail);
    dl_json_w_open(w, "lines", '{', 1);
    dl_json_w_int(w, "garbage", (long long)a->lines_garbage);
    dl_json_w_int(w, "too_long", (long long)a->lines_too_long);
    dl_json_w_int(w, "torn", (long long)a->lines_torn);
    dl_json_w_int(w, "cut", (long long)a->lines_cut);
    dl_json_w_int(w, "unmatched", (long long)a->events_unmatched);
    dl_json_w_close(w, '}');
    dl_json_w_open(w, "notes", '[', 0);
    for (int k = 0; k < a->n_notes; k++) dl_json_w_str(w, NULL, a->notes[k]);
    dl_json_w_close(w, ']');
    dl_json_w_close(w, '}');
}

static void write_json(rep *R)
{
    char path[4096];
    FILE *f = open_out(R, NULL, "report.json", path, sizeof path);
    if (!f) return;
    dl_json_w w = {.f = f};
    dl_json_w_open(&w, NULL, '{', 0);
    dl_json_w_str(&w, "schema", JSON_SCHEMA);
    dl_json_w_str(&w, "scenario", R->scenario);
    dl_json_w_open(&w, "buckets", '[', 1);
    for (int b = 0; b < DL_ACCT_NBUCKETS; b++) dl_json_w_str(&w, NULL, dl_account_bucket_name(b));
    dl_json_w_close(&w, ']');
    dl_json_w_open(&w, "runs", '[', 0);
    for (int i = 0; i < R->n; i++) json_run(&w, R, i);
    dl_json_w_close(&w, ']');
    dl_json_w_close(&w, '}');
    fputc('\n', f);
    close_out(R, f, path);
}

/* ---- report.md */

static void md_headline(FILE *f, const rep *R)
{
    char b[10][48];
    fputs("## Headline\n\n", f);
    fputs("| run | goodput | availability bound | goodput / bound | final val loss | loss cost vs twin | merges | "
          "token goodput | ledger balanced | faults applied | check ok | unplanned exits |\n",
          f);
    fputs("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|\n", f);
    for (int i = 0; i < R->n; i++) {
        const run_info *ri = &R->r[i];
        const dl_account *a = ri->a;
        fputs("| ", f);
        md_cell(f, ri->label);
        fprintf(f, " | %s | %s | %s | %s | ", pct(b[0], 48, a->fleet.frac[DL_ACCT_GOODPUT]),
                pct(b[1], 48, a->fleet.availability_bound), pct(b[2], 48, a->fleet.goodput_over_bound),
                num(b[3], 48, a->final_val_loss, 4));
        if (ri->twin >= 0 && isfinite(ri->loss_cost)) {
            fprintf(f, "%+.2f%% (vs ", 100.0 * ri->loss_cost);
            md_cell(f, R->r[ri->twin].label);
            fputs(")", f);
        } else fputs(ri->is_baseline ? "(the twin)" : "n/a", f);
        fprintf(f, " | %d | %s | %s | %d/%d | %s | ", a->merges, pct(b[4], 48, a->token_goodput),
                tri(a->ledger_balanced), a->faults_applied, a->faults_planned, tri(a->check_ok));
        if (a->unplanned_exits >= 0) fprintf(f, "%lld |\n", (long long)a->unplanned_exits);
        else fputs("n/a |\n", f);
    }
    fputc('\n', f);
}

static void md_badput(FILE *f, const rep *R)
{
    char b[48];
    fputs("## Badput: where the provisioned learner time went\n\n"
          "Every provisioned learner-second is in exactly one bucket (see \"How to read this\"); each column sums "
          "to 100%.\n\n| bucket |",
          f);
    for (int i = 0; i < R->n; i++) {
        fputc(' ', f);
        md_cell(f, R->r[i].label);
        fputs(" |", f);
    }
    fputs("\n|---|", f);
    for (int i = 0; i < R->n; i++) fputs("---:|", f);
    fputc('\n', f);
    for (int k = 0; k < DL_ACCT_NBUCKETS; k++) {
        fprintf(f, "| %s |", dl_account_bucket_name(k));
        for (int i = 0; i < R->n; i++) fprintf(f, " %s |", pct(b, sizeof b, R->r[i].a->fleet.frac[k]));
        fputc('\n', f);
    }
    fputs("| **sum** |", f);
    for (int i = 0; i < R->n; i++) {
        double s = 0;
        for (int k = 0; k < DL_ACCT_NBUCKETS; k++) s += R->r[i].a->fleet.frac[k];
        fprintf(f, " %s |", pct(b, sizeof b, s));
    }
    fputs("\n| provisioned learner-s |", f);
    for (int i = 0; i < R->n; i++) fprintf(f, " %s |", num(b, sizeof b, R->r[i].a->fleet.provisioned_s, 1));
    fputs("\n| clock skew scaled away (s) |", f);
    for (int i = 0; i < R->n; i++) fprintf(f, " %s |", num(b, sizeof b, R->r[i].a->fleet.skew_s, 3));
    fputs("\n| merged compute taken off for hangs (s) |", f);
    for (int i = 0; i < R->n; i++) fprintf(f, " %s |", num(b, sizeof b, R->r[i].a->fleet.hang_credit_s, 3));
    for (int k = 0; k < DL_ACCT_NWASTE; k++) {
        fprintf(f, "\n| wasted: %s (s) |", dl_account_waste_name(k));
        for (int i = 0; i < R->n; i++) fprintf(f, " %s |", num(b, sizeof b, R->r[i].a->wasted_s[k], 1));
    }
    fputs("\n\nWasted by cause (estimates from the learners' events, see \"How to read this\"): killed = trained "
          "after a fragment's last push by an incarnation that was killed; discarded = thrown away by adopts; "
          "unpushed = trained after a fragment's last push at the end; other = pushed, never merged.\n\n",
          f);
}

/* Per learner: what the synchronizer saw (deaths it declared, rejoins,
 * refetches, refusals), the wasted time by cause, the tokens of every
 * incarnation, and a flag for goodput far below the fleet's. */
static void md_sync_view(FILE *f, const dl_account *a)
{
    char b[8][48];
    fprintf(f,
            "The synchronizer's view (events-sync.log) and wasted seconds by cause; **LOW** marks goodput below "
            "%g x the fleet's median (%s).\n\n"
            "| slot | id | declared dead | rejoins | refetches | refused | wasted: killed | discarded | unpushed | "
            "other | tokens (every incarnation) | goodput %% | |\n"
            "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|\n",
            DL_ACCT_LOW_GOODPUT, pct(b[0], 48, a->median_goodput));
    for (int s = 0; s < a->n_slots; s++) {
        const dl_account_slot *sl = &a->slots[s];
        fprintf(f, "| %d | ", sl->slot);
        md_cell(f, sl->id);
        fprintf(f, " | %d | %d | %d | ", sl->deaths, sl->rejoins, sl->refetches);
        int any = 0;
        for (int k = 0; k < DL_ACCT_NREFUSALS; k++)
            if (sl->refused[k]) fprintf(f, "%s%s %lld", any++ ? ", " : "", dl_account_refusal_name(k), (long long)sl->refused[k]);
        if (!any) fputs("-", f);
        for (int k = 0; k < DL_ACCT_NWASTE; k++) fprintf(f, " | %s", num(b[1 + k], 48, sl->wasted_s[k], 1));
        fprintf(f, " | %s | %s | %s |\n", num(b[5], 48, sl->tokens, 0), pct(b[6], 48, sl->time.frac[DL_ACCT_GOODPUT]),
                sl->low_goodput ? "**LOW**" : "");
    }
    fputc('\n', f);
}

static void md_learners(FILE *f, const rep *R)
{
    char b[12][48];
    fputs("## Per learner\n\nSeconds per bucket; goodput as a share of the slot's provisioned time.\n\n", f);
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        fputs("### ", f);
        md_cell(f, R->r[i].label);
        fputs("\n\n| slot | id | dc | provisioned s | down | startup | recovery | idle barrier | goodput | "
              "dropped stale | wasted | goodput % | incarnations | killed | skew s | end |\n"
              "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
              f);
        for (int s = 0; s < a->n_slots; s++) {
            const dl_account_slot *sl = &a->slots[s];
            const dl_account_time *t = &sl->time;
            fprintf(f, "| %d | ", sl->slot);
            md_cell(f, sl->id);
            fputs(" | ", f);
            md_cell(f, sl->dc);
            fprintf(f, " | %s", num(b[0], 48, t->provisioned_s, 1));
            for (int k = 0; k < DL_ACCT_NBUCKETS; k++) fprintf(f, " | %s", num(b[1 + k], 48, t->bucket_s[k], 1));
            fprintf(f, " | %s | %d | %d | %s | ", pct(b[9], 48, t->frac[DL_ACCT_GOODPUT]), sl->incarnations, sl->killed,
                    num(b[10], 48, t->skew_s, 3));
            md_cell(f, sl->end_reason);
            fputs(" |\n", f);
        }
        if (!a->n_slots) fputs("| | (no slots) | | | | | | | | | | | | | | |\n", f);
        fputc('\n', f);
        md_sync_view(f, a);
    }
}

static void md_faults(FILE *f, const rep *R)
{
    fputs("## Faults\n\nThe timeline of the first run with one (every run of a scenario and seed applies the same; "
          "baselines none). A fault is applied when its `begin` or `instant` event is in events-chaos.log and, "
          "when its end is due before the run's end, its `end` too.\n\n",
          f);
    const dl_account *t = NULL;
    for (int i = 0; i < R->n && !t; i++)
        if (R->r[i].a->n_faults) t = R->r[i].a;
    if (!t) {
        fputs("No faults planned (no timeline.tsv rows).\n\n", f);
        return;
    }
    fputs("| n | at (s) | kind | target | duration (s) | value | source |", f);
    for (int i = 0; i < R->n; i++) {
        fputc(' ', f);
        md_cell(f, R->r[i].label);
        fputs(" |", f);
    }
    fputs("\n|---:|---:|---|---|---:|---:|---|", f);
    for (int i = 0; i < R->n; i++) fputs("---|", f);
    fputc('\n', f);
    for (int k = 0; k < t->n_faults; k++) {
        const dl_account_fault *ft = &t->faults[k];
        fprintf(f, "| %d | %.3f | ", ft->n, ft->at_s);
        md_cell(f, ft->kind);
        fputs(" | ", f);
        md_cell(f, ft->target);
        fprintf(f, " | %.3f | %g | ", ft->duration_s, ft->value);
        md_cell(f, ft->source);
        fputs(" |", f);
        for (int i = 0; i < R->n; i++) {
            const dl_account *a = R->r[i].a;
            const dl_account_fault *m = NULL;
            for (int j = 0; j < a->n_faults && !m; j++)
                if (a->faults[j].n == ft->n) m = &a->faults[j];
            if (!m) fputs(" - |", f);
            else if (!m->planned) fputs(" not planned (after the end) |", f);
            else if (m->applied) fputs(" applied |", f);
            else {
                fputs(" **MISSING**: ", f);
                md_cell(f, m->why);
                fputs(" |", f);
            }
        }
        fputc('\n', f);
    }
    fputc('\n', f);
}

static void md_tokens(FILE *f, const rep *R)
{
    char b[48];
    fputs("## Tokens: the push ledger\n\nFragment-tokens from the synchronizer's `ledger` events (one per "
          "incarnation that exited cleanly; a SIGKILLed incarnation writes none, and its ledger is not "
          "recoverable from them). The `store:` rows are the store's ledger as `dloco check` printed it after the "
          "run (check.out): every incarnation, a SIGKILLed one up to its last commit.\n\n| | ",
          f);
    for (int i = 0; i < R->n; i++) {
        md_cell(f, R->r[i].label);
        fputs(" | ", f);
    }
    fputs("\n|---|", f);
    for (int i = 0; i < R->n; i++) fputs("---:|", f);
    fputc('\n', f);
#define ROW_U64(name, field)                                                                                      \
    do {                                                                                                          \
        fputs("| " name " |", f);                                                                                 \
        for (int i = 0; i < R->n; i++) fprintf(f, " %llu |", (unsigned long long)R->r[i].a->field);               \
        fputc('\n', f);                                                                                           \
    } while (0)
    ROW_U64("applied", applied);
    ROW_U64("dropped_stale", dropped_stale);
    ROW_U64("rejected", rejected);
    ROW_U64("lost", lost);
    ROW_U64("discarded", discarded);
    ROW_U64("outstanding", outstanding);
    ROW_U64("processed", processed);
    ROW_U64("carried_in", carried_in);
    ROW_U64("overclaim", overclaim);
#undef ROW_U64
    fputs("| token goodput |", f);
    for (int i = 0; i < R->n; i++) fprintf(f, " %s |", pct(b, sizeof b, R->r[i].a->token_goodput));
    static const char *const st[6] = {"applied", "dropped_stale", "rejected", "lost", "discarded", "outstanding"};
    for (int k = 0; k < 6; k++) {
        fprintf(f, "\n| store: %s |", st[k]);
        for (int i = 0; i < R->n; i++) {
            const dl_account *a = R->r[i].a;
            if (a->store_ledger) fprintf(f, " %llu |", (unsigned long long)a->store_tokens[k]);
            else fputs(" n/a |", f);
        }
    }
    fputs("\n| store: token goodput |", f);
    for (int i = 0; i < R->n; i++) fprintf(f, " %s |", pct(b, sizeof b, R->r[i].a->store_token_goodput));
    fputs("\n| ledger events |", f);
    for (int i = 0; i < R->n; i++) fprintf(f, " %d |", R->r[i].a->n_ledgers);
    fputs("\n| synchronizer incarnations |", f);
    for (int i = 0; i < R->n; i++) fprintf(f, " %d |", R->r[i].a->sync_incarnations);
    fputs("\n| synchronizer crashes (SIGKILL) |", f);
    for (int i = 0; i < R->n; i++) fprintf(f, " %d |", R->r[i].a->sync_crashes);
    fputs("\n| balanced |", f);
    for (int i = 0; i < R->n; i++) fprintf(f, " %s |", tri(R->r[i].a->ledger_balanced));
    fputs("\n\n", f);
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        if (a->ledger_balanced == 1) continue;
        fputs("- ", f);
        md_cell(f, R->r[i].label);
        fputs(": ", f);
        md_cell(f, a->ledger_mismatch);
        fputc('\n', f);
    }
    fputc('\n', f);
}

static void md_liveness(FILE *f, const rep *R)
{
    char b[4][48];
    fputs("## Liveness vs participation\n\nAt each merge inside the run: the learners alive (provisioned and "
          "`up`, `slow` or `partitioned`) against the contributions the merge took (`n`). Staleness from "
          "`merge_contrib`.\n\n| run | merges | mean alive | mean contributions | contributions / alive | "
          "contributions | staleness mean | staleness max |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
          f);
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        int mx = -1;
        for (int k = 0; k < DL_ACCT_STALE_BINS; k++)
            if (a->staleness_hist[k]) mx = k;
        fputs("| ", f);
        md_cell(f, R->r[i].label);
        fprintf(f, " | %d | %s | %s | %s | %lld | %s | ", a->merges, num(b[0], 48, a->mean_alive, 2),
                num(b[1], 48, a->mean_participation, 2),
                pct(b[2], 48, a->mean_alive > 0 ? a->mean_participation / a->mean_alive : NAN),
                (long long)a->contributions, num(b[3], 48, a->staleness_mean, 2));
        if (mx < 0) fputs("n/a |\n", f);
        else fprintf(f, "%s%d |\n", mx == DL_ACCT_STALE_BINS - 1 ? ">= " : "", mx);
    }
    fputc('\n', f);
}

static void md_links(FILE *f, const rep *R)
{
    char b[6][48];
    fputs("## Links\n\nBytes through each datacenter's relay (up: learners to the synchronizer), rates in Mbit/s "
          "(10^6 bits/s) like the configured bandwidth.\n\n"
          "| run | dc | mode | bandwidth Mbit/s | RTT ms | up bytes | down bytes | mean up Mbit/s | mean down Mbit/s | "
          "peak up Mbit/s | peak down Mbit/s |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
          f);
    int any = 0;
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        for (int k = 0; k < a->n_links; k++, any++) {
            const dl_account_link *l = &a->links[k];
            fputs("| ", f);
            md_cell(f, R->r[i].label);
            fputs(" | ", f);
            md_cell(f, l->name);
            fputs(" | ", f);
            md_cell(f, l->mode);
            fprintf(f, " | %g | %g | %s | %s | %s | %s | %s | %s |\n", l->bandwidth_mbit, l->rtt_ms,
                    num(b[0], 48, l->up_bytes, 0), num(b[1], 48, l->down_bytes, 0),
                    num(b[2], 48, l->mean_up_Bps * MBIT, 3), num(b[3], 48, l->mean_down_Bps * MBIT, 3),
                    num(b[4], 48, l->peak_up_Bps * MBIT, 3), num(b[5], 48, l->peak_down_Bps * MBIT, 3));
        }
    }
    if (!any) fputs("| (no link samples) | | | | | | | | | | |\n", f);
    fputc('\n', f);
}

static void md_plots(FILE *f, const rep *R)
{
    fputs("## Plots\n\n![validation loss of the global model](plots/loss.svg)\n\n"
          "![goodput over time](plots/goodput.svg)\n\n![staleness of merged contributions](plots/staleness.svg)\n\n",
          f);
    for (int i = 0; i < R->n; i++) {
        fputs("![learner states: ", f);
        md_cell(f, R->r[i].label);
        fprintf(f, "](plots/timeline-%s.svg)\n\n", R->r[i].file);
    }
    for (int i = 0; i < R->n; i++) {
        fputs("![links: ", f);
        md_cell(f, R->r[i].label);
        fprintf(f, "](plots/links-%s.svg)\n\n", R->r[i].file);
    }
}

static void md_notes(FILE *f, const rep *R)
{
    int any = 0;
    for (int i = 0; i < R->n; i++) any += R->r[i].a->n_notes;
    if (!any) return;
    fputs("## Notes\n\nWhat the accounting met on its way (crashed synchronizers, skipped lines, skew).\n\n", f);
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        for (int k = 0; k < a->n_notes; k++) {
            fputs("- ", f);
            md_cell(f, R->r[i].label);
            fputs(": ", f);
            md_cell(f, a->notes[k]);
            fputc('\n', f);
        }
    }
    fputc('\n', f);
}

static const char how_to_read[] =
    "## How to read this\n\n"
    "Definitions in full: docs/CHAOS.md \"Goodput, badput and the ledger\".\n\n"
    "- **Provisioned** learner-seconds: every slot from its `slot_begin` to its `slot_end` (a graceful leave or "
    "the run's end), summed over the slots.\n"
    "- Each provisioned second is in one bucket, the first that applies: **down** (no process of the slot runs, "
    "or it is hung by SIGSTOP), **startup** / **recovery** (from a process's start to its `ready`: the slot's "
    "first process / a later one), **idle_barrier** (waiting at a barrier policy's round), else **compute**, "
    "which splits into **goodput** (merged: the synchronizer's `merge_contrib` compute_s / P), "
    "**dropped_stale** (pushed, dropped as too stale) and **wasted** (computed but never merged: killed before "
    "pushing, discarded by an adopt, lost with a crashed synchronizer, unpushed at the end).\n"
    "- **wasted by cause** (estimates from the learners' own events, scaled together to the wasted bucket): "
    "**killed** (for each fragment, the time from its last push to a kill of the process, / P), **discarded** "
    "(the fragment-tokens adopts threw away, at the learner's seconds per fragment-token), **unpushed** (the same "
    "tail for a process that ended cleanly: not pushed at the end), **other** (the rest: pushed, never merged).\n"
    "- **Per learner, the synchronizer's view**: the deaths it declared (`learner_dead`), rejoins (Welcomes "
    "after the first), refetches (rejoins with `must_fetch`: the whole model again), its pushes not pooled by "
    "kind (dropped_stale, busy, duplicate, and rejected: norm, counters, replay, chunk_order, rejected_other); "
    "**LOW** flags "
    "a learner whose goodput share is below half the fleet's median.\n"
    "- **goodput** = goodput seconds / provisioned seconds. **availability bound** = the share of provisioned "
    "time learners were running and not hung: no policy can beat it. **goodput / bound** is how much of what "
    "was available a policy turned into merged progress.\n"
    "- **loss cost vs twin**: final validation loss / the failure-free twin's (`<policy>-baseline`) - 1; what the "
    "faults cost in model quality.\n"
    "- **token goodput**: fragment-tokens applied / all fragment-tokens in the persisted ledger states. "
    "**ledger balanced**: every synchronizer ledger satisfies applied + dropped_stale + rejected + lost + "
    "discarded + outstanding = processed + carried_in with nothing pooled, carried or overclaimed at exit.\n"
    "- **faults applied**: planned faults (timeline.tsv rows before the run's end) whose events the harness "
    "wrote; a missing one means the run did not test what the scenario says.\n"
    "- **goodput over time** (plot): at each merge, merged compute so far / P over the provisioned learner-"
    "seconds so far.\n";

static void write_md(rep *R)
{
    char path[4096];
    FILE *f = open_out(R, NULL, "report.md", path, sizeof path);
    if (!f) return;
    fputs("# Chaos report: ", f);
    md_cell(f, R->scenario);
    fputs("\n\n", f);
    if (!R->n) {
        fputs("No runs could be accounted.\n", f);
        close_out(R, f, path);
        return;
    }
    int netns = R->r[0].a->netns, same = 1;
    for (int i = 1; i < R->n; i++) same &= R->r[i].a->netns == netns;
    if (same)
        fprintf(f, "Mode: %s.\n\n",
                netns ? "**netns** (datacenters are network namespaces with tc tbf links, plus the relay)"
                      : "**loopback** (one network namespace; the relay shapes every datacenter link)");
    else {
        fputs("Mode per run:", f);
        for (int i = 0; i < R->n; i++) {
            fputs(i ? ", " : " ", f);
            md_cell(f, R->r[i].label);
            fprintf(f, " %s", R->r[i].a->netns ? "netns" : "loopback");
        }
        fputs(".\n\n", f);
    }
    char b[48];
    fputs("| run | policy | seed | duration (s) | fragments (P) | slots at start | datacenters |\n"
          "|---|---|---|---:|---:|---:|---:|\n",
          f);
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        fputs("| ", f);
        md_cell(f, R->r[i].label);
        fputs(" | ", f);
        md_cell(f, a->policy);
        fputs(" | ", f);
        md_cell(f, a->seed);
        fprintf(f, " | %s | %d | %d | %d |\n", num(b, sizeof b, a->duration_s, 1), a->fragments, a->slots_at_start,
                a->dcs);
    }
    fputc('\n', f);
    md_headline(f, R);
    md_badput(f, R);
    md_learners(f, R);
    md_faults(f, R);
    md_tokens(f, R);
    md_liveness(f, R);
    md_links(f, R);
    md_plots(f, R);
    md_notes(f, R);
    fputs(how_to_read, f);
    close_out(R, f, path);
}

/* ---- plots: .dat + .gp per plot, then gnuplot */

/* A gnuplot single-quoted string: no escapes inside but '' for a quote. */
static void gp_str(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputs("''", f);
        else if (*s == '\n' || *s == '\r') fputc(' ', f);
        else fputc(*s, f);
    }
    fputc('\'', f);
}

static void gp_head(FILE *f, const char *svg, const char *title)
{
    fputs("# written by dloco-chaos (chaos/report.c); run: gnuplot THIS_FILE in this directory\n"
          "set terminal svg size 900,500 dynamic\nset termoption noenhanced\nset output ",
          f);
    gp_str(f, svg);
    fputs("\nset title ", f);
    gp_str(f, title);
    fputs("\nset grid\nset key outside right top\n", f);
}

/* A plot with nothing to draw still gets an SVG that says so (gnuplot
 * fails on a plot without points). */
static void gp_nodata(FILE *f)
{
    fputs("unset key\nunset border\nunset tics\nunset grid\nset xrange [0:1]\nset yrange [0:1]\n"
          "set label 'no data' at 0.5,0.5 center\nplot 2 notitle\n",
          f);
}

static void gp_plot_sep(FILE *f, int *first) { fputs(*first ? "plot " : ", \\\n     ", f), *first = 0; }

static void plot_loss(rep *R)
{
    char path[4096], name[160];
    int any = 0;
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        int pts = 0;
        for (int k = 0; k < a->n_evals; k++) pts += isfinite(a->evals[k].val_loss);
        if (!pts) continue;
        snprintf(name, sizeof name, "loss-%s.dat", R->r[i].file);
        FILE *f = open_out(R, "plots", name, path, sizeof path);
        if (!f) return;
        fputs("# elapsed_s val_loss (harness eval events)\n", f);
        for (int k = 0; k < a->n_evals; k++)
            if (isfinite(a->evals[k].val_loss)) fprintf(f, "%.3f %.9g\n", a->evals[k].elapsed_s, a->evals[k].val_loss);
        close_out(R, f, path);
        any++;
    }
    /* the synchronizer's own evaluations (dloco-sync --eval_every_s), same sequences */
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        int pts = 0;
        for (int k = 0; k < a->n_sync_evals; k++) pts += isfinite(a->sync_evals[k].val_loss);
        if (!pts) continue;
        snprintf(name, sizeof name, "loss-sync-%s.dat", R->r[i].file);
        FILE *f = open_out(R, "plots", name, path, sizeof path);
        if (!f) return;
        fputs("# t_s val_loss (the synchronizer's eval events)\n", f);
        for (int k = 0; k < a->n_sync_evals; k++)
            if (isfinite(a->sync_evals[k].val_loss))
                fprintf(f, "%.3f %.9g\n", a->sync_evals[k].t_s, a->sync_evals[k].val_loss);
        close_out(R, f, path);
        any++;
    }
    FILE *f = open_out(R, "plots", "loss.gp", path, sizeof path);
    if (!f) return;
    gp_head(f, "loss.svg", "validation loss of the global model");
    if (!any) gp_nodata(f);
    else {
        fputs("set xlabel 'seconds since the run start'\nset xrange [0:*]\nset ylabel 'val loss'\n", f);
        int first = 1;
        for (int i = 0; i < R->n; i++) {
            const dl_account *a = R->r[i].a;
            int pts = 0;
            for (int k = 0; k < a->n_evals; k++) pts += isfinite(a->evals[k].val_loss);
            if (!pts) continue;
            gp_plot_sep(f, &first);
            snprintf(name, sizeof name, "loss-%s.dat", R->r[i].file);
            gp_str(f, name);
            fputs(" using 1:2 with linespoints title ", f);
            gp_str(f, R->r[i].label);
        }
        for (int i = 0; i < R->n; i++) {
            const dl_account *a = R->r[i].a;
            int pts = 0;
            for (int k = 0; k < a->n_sync_evals; k++) pts += isfinite(a->sync_evals[k].val_loss);
            if (!pts) continue;
            gp_plot_sep(f, &first);
            snprintf(name, sizeof name, "loss-sync-%s.dat", R->r[i].file);
            gp_str(f, name);
            fputs(" using 1:2 with points title ", f);
            char title[200];
            snprintf(title, sizeof title, "%s (synchronizer)", R->r[i].label);
            gp_str(f, title);
        }
        fputc('\n', f);
    }
    close_out(R, f, path);
}

static void plot_goodput(rep *R)
{
    char path[4096], name[160];
    int any = 0;
    int *pts = dl_xcalloc((size_t)(R->n ? R->n : 1), sizeof *pts);
    for (int i = 0; i < R->n; i++) {
        const dl_account *a = R->r[i].a;
        for (int k = 0; k < a->merges; k++) pts[i] += isfinite(a->merge[k].goodput);
        if (!pts[i]) continue;
        snprintf(name, sizeof name, "goodput-%s.dat", R->r[i].file);
        FILE *f = open_out(R, "plots", name, path, sizeof path);
        if (!f) goto out;
        fputs("# t_s goodput (at each merge: merged compute so far / P / provisioned learner-s so far)\n", f);
        for (int k = 0; k < a->merges; k++)
            if (isfinite(a->merge[k].goodput)) fprintf(f, "%.3f %.9g\n", a->merge[k].t_s, a->merge[k].goodput);
        close_out(R, f, path);
        any++;
    }
    FILE *f = open_out(R, "plots", "goodput.gp", path, sizeof path);
    if (!f) goto out;
    gp_head(f, "goodput.svg", "goodput over time");
    if (!any) gp_nodata(f);
    else {
        fputs("set xlabel 'seconds since the run start'\nset xrange [0:*]\nset ylabel 'goodput (fraction of provisioned)'\n"
              "set yrange [0:*]\n",
              f);
        int first = 1;
        for (int i = 0; i < R->n; i++) {
            if (!pts[i]) continue;
            gp_plot_sep(f, &first);
            snprintf(name, sizeof name, "goodput-%s.dat", R->r[i].file);
            gp_str(f, name);
            /* points only where they can be told apart */
            fprintf(f, " using 1:2 with %s lw 2 title ", pts[i] > 50 ? "lines" : "linespoints");
            gp_str(f, R->r[i].label);
        }
        fputc('\n', f);
    }
    close_out(R, f, path);
out:
    free(pts);
}

static void plot_staleness(rep *R)
{
    char path[4096];
    int hi = -1;
    for (int i = 0; i < R->n; i++)
        for (int k = 0; k < DL_ACCT_STALE_BINS; k++)
            if (R->r[i].a->staleness_hist[k] && k > hi) hi = k;
    if (hi >= 0) {
        FILE *f = open_out(R, "plots", "staleness.dat", path, sizeof path);
        if (!f) return;
        fputs("# staleness, then per run the share of its merged contributions (merge_contrib)\n", f);
        for (int k = 0; k <= hi; k++) {
            if (k == DL_ACCT_STALE_BINS - 1) fprintf(f, ">=%d", k);
            else fprintf(f, "%d", k);
            for (int i = 0; i < R->n; i++) {
                const dl_account *a = R->r[i].a;
                fprintf(f, " %.9g", a->contributions ? (double)a->staleness_hist[k] / (double)a->contributions : 0.0);
            }
            fputc('\n', f);
        }
        close_out(R, f, path);
    }
    FILE *f = open_out(R, "plots", "staleness.gp", path, sizeof path);
    if (!f) return;
    gp_head(f, "staleness.svg", "staleness of merged contributions");
    if (hi < 0) gp_nodata(f);
    else {
        fputs("set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
              "set xlabel 'staleness (versions)'\nset ylabel 'share of contributions'\nset yrange [0:*]\n",
              f);
        for (int i = 0; i < R->n; i++) {
            fputs(i ? ", \\\n     '' " : "plot 'staleness.dat' ", f);
            fprintf(f, "using %d%s title ", i + 2, i ? "" : ":xtic(1)");
            gp_str(f, R->r[i].label);
        }
        fputc('\n', f);
    }
    close_out(R, f, path);
}

static void plot_timeline(rep *R, int i)
{
    const dl_account *a = R->r[i].a;
    char path[4096], dat[160], gp[160], svg[160], title[160];
    snprintf(dat, sizeof dat, "timeline-%s.dat", R->r[i].file);
    snprintf(gp, sizeof gp, "timeline-%s.gp", R->r[i].file);
    snprintf(svg, sizeof svg, "timeline-%s.svg", R->r[i].file);
    snprintf(title, sizeof title, "%s: learner states (dashed: a fault begins, dotted: it ends)", R->r[i].label);
    double xmax = a->end_s > 0 ? a->end_s : 1.0;
    int segs = 0;
    FILE *f = open_out(R, "plots", dat, path, sizeof path);
    if (!f) return;
    fputs("# t0 t1 row color(0xRRGGBB) state (one segment per state change)\n", f);
    for (int s = 0; s < a->n_slots; s++) {
        const dl_account_slot *sl = &a->slots[s];
        for (int k = 0; k < sl->n_states; k++) {
            int st = sl->states[k].state;
            double t0 = sl->states[k].t_s;
            double t1 = k + 1 < sl->n_states ? sl->states[k + 1].t_s : st == DL_ACCT_LEFT ? xmax : sl->end_s;
            if (t1 < t0) t1 = t0;
            fprintf(f, "%.3f %.3f %d %ld %s\n", t0, t1, s, strtol(state_colors[st] + 1, NULL, 16),
                    dl_account_state_name(st));
            segs++;
        }
    }
    close_out(R, f, path);
    f = open_out(R, "plots", gp, path, sizeof path);
    if (!f) return;
    gp_head(f, svg, title);
    if (!segs) gp_nodata(f);
    else {
        fprintf(f, "set xlabel 'seconds since the run start'\nset xrange [0:%.3f]\nset yrange [-0.6:%d.4]\n"
                   "unset grid\nset style fill solid 1.0 noborder\nset ytics (",
                xmax, a->n_slots - 1);
        for (int s = 0; s < a->n_slots; s++) {
            if (s) fputs(", ", f);
            gp_str(f, a->slots[s].id);
            fprintf(f, " %d", s);
        }
        fputs(")\n", f);
        for (int k = 0; k < a->n_fault_events; k++) {
            const dl_account_fault_event *e = &a->fault_events[k];
            int end = !strcmp(e->phase, "end");
            fprintf(f, "set arrow from %.3f, graph 0 to %.3f, graph 1 nohead lc rgb '%s' dt %d\n", e->t_s, e->t_s,
                    end ? "#999999" : "#000000", end ? 3 : 2);
            if (!end && a->n_fault_events <= 60) {
                char lab[96];
                snprintf(lab, sizeof lab, "%d %s", e->n, e->kind);
                fputs("set label ", f);
                gp_str(f, lab);
                fprintf(f, " at %.3f, graph 1.01 left rotate by 45 font ',7'\n", e->t_s);
            }
        }
        /* room above the plot for the rotated fault labels, the title above them */
        fputs("set tmargin 9\nset title offset 0,4\nplot ", f);
        gp_str(f, dat);
        fputs(" using (($1+$2)/2):3:1:2:($3-0.35):($3+0.35):4 with boxxy lc rgb variable notitle", f);
        for (int st = 0; st < DL_ACCT_NSTATES; st++)
            fprintf(f, ", \\\n     NaN with boxes lc rgb '%s' title '%s'", state_colors[st], dl_account_state_name(st));
        fputc('\n', f);
    }
    close_out(R, f, path);
}

static void plot_links(rep *R, int i)
{
    const dl_account *a = R->r[i].a;
    char path[4096], dat[160], gp[160], svg[160], title[160];
    snprintf(dat, sizeof dat, "links-%s.dat", R->r[i].file);
    snprintf(gp, sizeof gp, "links-%s.gp", R->r[i].file);
    snprintf(svg, sizeof svg, "links-%s.svg", R->r[i].file);
    snprintf(title, sizeof title, "%s: Mbit/s per datacenter link", R->r[i].label);
    FILE *f = open_out(R, "plots", dat, path, sizeof path);
    if (!f) return;
    /* one block per datacenter (gnuplot `index`), rates between samples */
    fputs("# t_s up_Mbit_s down_Mbit_s; one block per datacenter, in the order of the .gp's plot\n", f);
    int blocks = 0, *has = dl_xcalloc((size_t)(a->n_links ? a->n_links : 1), sizeof *has);
    for (int k = 0; k < a->n_links; k++) {
        const dl_account_link *l = &a->links[k];
        int rows = 0;
        for (int j = 1; j < l->n_samples; j++) {
            double dt = l->samples[j].t_s - l->samples[j - 1].t_s;
            if (dt <= 0) continue;
            if (!rows) fprintf(f, "%s# %s\n", blocks ? "\n\n" : "", l->name);
            fprintf(f, "%.3f %.9g %.9g\n", l->samples[j].t_s,
                    (l->samples[j].up_bytes - l->samples[j - 1].up_bytes) / dt * MBIT,
                    (l->samples[j].down_bytes - l->samples[j - 1].down_bytes) / dt * MBIT);
            rows++;
        }
        if (rows) has[k] = 1 + blocks++;
    }
    close_out(R, f, path);
    f = open_out(R, "plots", gp, path, sizeof path);
    if (!f) {
        free(has);
        return;
    }
    gp_head(f, svg, title);
    if (!blocks) gp_nodata(f);
    else {
        fputs("set xlabel 'seconds since the run start'\nset xrange [0:*]\nset ylabel 'Mbit/s'\nset yrange [0:*]\n", f);
        int first = 1;
        for (int k = 0; k < a->n_links; k++) {
            if (!has[k]) continue;
            for (int dir = 0; dir < 2; dir++) {
                char t[96];
                snprintf(t, sizeof t, "%s %s", a->links[k].name, dir ? "down" : "up");
                gp_plot_sep(f, &first);
                gp_str(f, dat);
                fprintf(f, " index %d using 1:%d with lines lw %d dt %d title ", has[k] - 1, 2 + dir, 2, dir ? 2 : 1);
                gp_str(f, t);
            }
            if (a->links[k].bandwidth_mbit > 0) { /* the shaped rate, for scale */
                char t[96];
                snprintf(t, sizeof t, "%s limit", a->links[k].name);
                gp_plot_sep(f, &first);
                fprintf(f, "%.9g with lines lw 1 dt 3 title ", a->links[k].bandwidth_mbit);
                gp_str(f, t);
            }
        }
        fputc('\n', f);
    }
    close_out(R, f, path);
    free(has);
}

/* gnuplot in PATH, into buf; NULL when there is none. */
static const char *find_gnuplot(char *buf, size_t cap)
{
    const char *p = getenv("PATH");
    if (!p) p = "/usr/local/bin:/usr/bin:/bin";
    while (*p) {
        size_t n = strcspn(p, ":");
        snprintf(buf, cap, "%.*s/gnuplot", (int)(n ? n : 1), n ? p : ".");
        if (access(buf, X_OK) == 0) return buf;
        p += n;
        if (*p == ':') p++;
    }
    return NULL;
}

/* `gnuplot script` in dir, as a child (no shell), its stdout and stderr
 * into script.log there: kept when it fails (the error names it), removed
 * when it succeeds, so gnuplot's warnings (a flat line's "empty y range")
 * do not clutter the harness's output. */
static int run_gnuplot(const char *exe, const char *dir, const char *script)
{
    char arg0[] = "gnuplot", arg1[256], log[300], logpath[4400];
    snprintf(arg1, sizeof arg1, "%s", script);
    snprintf(log, sizeof log, "%s.log", script);
    snprintf(logpath, sizeof logpath, "%s/%s", dir, log);
    char *const argv[] = {arg0, arg1, NULL};
    pid_t pid = fork();
    if (pid < 0) return dl_err(DL_EIO, "fork for gnuplot: %s", strerror(errno));
    if (pid == 0) {
        /* only async-signal-safe calls between fork and exec */
        if (chdir(dir) != 0) _exit(126);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execv(exe, argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return dl_err(DL_EIO, "waiting for gnuplot %s: %s", script, strerror(errno));
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        unlink(logpath);
        return 0;
    }
    if (WIFEXITED(st))
        return dl_err(DL_EIO, "gnuplot %s: exit status %d (see %s)", script, WEXITSTATUS(st), logpath);
    return dl_err(DL_EIO, "gnuplot %s: signal %d (see %s)", script, WIFSIGNALED(st) ? WTERMSIG(st) : 0, logpath);
}

static void write_plots(rep *R)
{
    plot_loss(R);
    plot_goodput(R);
    plot_staleness(R);
    for (int i = 0; i < R->n; i++) {
        plot_timeline(R, i);
        plot_links(R, i);
    }
    if (R->rc) return; /* a script may be half-written */
    char exe[4096];
    if (!find_gnuplot(exe, sizeof exe)) {
        fprintf(stderr, "dloco-chaos: warning: gnuplot not found in PATH: wrote %s/plots/*.gp and *.dat but no SVGs "
                        "(install gnuplot-nox, then run `gnuplot X.gp` in plots/)\n",
                R->dir);
        return;
    }
    char plots[4096];
    snprintf(plots, sizeof plots, "%s/plots", R->dir);
    const char *fixed[] = {"loss.gp", "goodput.gp", "staleness.gp"};
    for (int k = 0; k < 3; k++) {
        keep(R, run_gnuplot(exe, plots, fixed[k]));
    }
    for (int i = 0; i < R->n; i++)
        for (int k = 0; k < 2; k++) {
            char gp[160];
            snprintf(gp, sizeof gp, "%s-%s.gp", k ? "links" : "timeline", R->r[i].file);
            keep(R, run_gnuplot(exe, plots, gp));
        }
}

/* ---- the runs side by side */

static void safe_name(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    for (; *s && n + 1 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                 c == '-';
        char ch = ok && !(n == 0 && c == '.') ? (char)c : '_'; /* no hidden file */
        out[n++] = ch;
    }
    if (!n) out[n++] = '_';
    out[n] = 0;
}

static void pair_twins(rep *R)
{
    static const char suffix[] = "-baseline";
    for (int i = 0; i < R->n; i++) {
        R->r[i].twin = -1;
        R->r[i].loss_cost = NAN;
        R->r[i].is_baseline = ends_with(R->r[i].label, suffix);
    }
    for (int j = 0; j < R->n; j++) {
        if (!R->r[j].is_baseline) continue;
        size_t plen = strlen(R->r[j].label) - (sizeof suffix - 1);
        int p = -1;
        for (int i = 0; i < R->n && p < 0; i++)
            if (!R->r[i].is_baseline && strlen(R->r[i].label) == plen && !strncmp(R->r[i].label, R->r[j].label, plen))
                p = i;
        /* "the policy before it" when the names do not pair */
        if (p < 0 && j > 0 && !R->r[j - 1].is_baseline && R->r[j - 1].twin < 0) p = j - 1;
        if (p < 0 || R->r[p].twin >= 0) continue;
        R->r[p].twin = j;
        double mine = R->r[p].a->final_val_loss, base = R->r[j].a->final_val_loss;
        if (isfinite(mine) && isfinite(base) && base > 0) R->r[p].loss_cost = mine / base - 1.0;
    }
}

int dl_report_write(const char *out_dir, const char *scenario_name, const char *const *labels,
                    dl_account *const *runs, int n)
{
    assert(out_dir && n >= 0 && (n == 0 || runs));
    char plots[4096];
    snprintf(plots, sizeof plots, "%s/plots", out_dir);
    if (mkdir(out_dir, 0755) && errno != EEXIST) return dl_err(DL_EIO, "mkdir %s: %s", out_dir, strerror(errno));
    if (mkdir(plots, 0755) && errno != EEXIST) return dl_err(DL_EIO, "mkdir %s: %s", plots, strerror(errno));
    rep R = {.dir = out_dir, .scenario = scenario_name && scenario_name[0] ? scenario_name : "(unnamed)", .n = n};
    R.r = dl_xcalloc((size_t)(n ? n : 1), sizeof *R.r);
    for (int i = 0; i < n; i++) {
        assert(runs[i]);
        run_info *ri = &R.r[i];
        ri->a = runs[i];
        const char *l = labels && labels[i] && labels[i][0] ? labels[i] : runs[i]->label;
        if (l[0]) snprintf(ri->label, sizeof ri->label, "%s", l);
        else snprintf(ri->label, sizeof ri->label, "run%d", i);
        char base[64];
        safe_name(base, sizeof base, ri->label);
        snprintf(ri->file, sizeof ri->file, "%s", base);
        for (int j = 0; j < i; j++)
            if (!strcmp(R.r[j].file, ri->file)) snprintf(ri->file, sizeof ri->file, "%s-%d", base, i);
    }
    pair_twins(&R);
    write_md(&R);
    write_json(&R);
    write_plots(&R);
    free(R.r);
    return R.rc ? dl_err(R.rc, "%s", R.msg) : 0;
}
