/* The chaos report as JSON for tools: report.json (schema dloco-chaos-report/1, docs/CHAOS.md). */
#include "chaos/report_int.h"

#include "core/err.h"
#include "core/json.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void dl_rep_write_json(rep *R)
{
    char path[4096];
    FILE *f = dl_rep_open(R, NULL, "report.json", path, sizeof path);
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
    dl_rep_close(R, f, path);
}
