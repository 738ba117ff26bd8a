/* The chaos report for people: report.md (headline, badput, the synchronizer's view, learners,
 * faults, tokens, liveness, links, plots, notes). */
#include "chaos/report_int.h"

#include "core/err.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void dl_rep_write_md(rep *R)
{
    char path[4096];
    FILE *f = dl_rep_open(R, NULL, "report.md", path, sizeof path);
    if (!f) return;
    fputs("# Chaos report: ", f);
    md_cell(f, R->scenario);
    fputs("\n\n", f);
    if (!R->n) {
        fputs("No runs could be accounted.\n", f);
        dl_rep_close(R, f, path);
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
    dl_rep_close(R, f, path);
}
