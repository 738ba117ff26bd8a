/* dloco-sim: the discrete-event simulator (chaos/sim.h, docs/SIM.md).
 *   dloco-sim run SCENARIO [--json FILE] [--seed N] [--duration_s S]
 *   dloco-sim paper [--horizon_s S] [--calib_horizon_s S] [--seed N] [--repair_s S] [--json FILE]
 *   dloco-sim tune [--horizon_s S] [--calib_horizon_s S] [--seed N] [--repair_s S] [--step_cv X] [--bandwidth_mbit X]
 *   dloco-sim keys */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chaos/scenario.h"
#include "chaos/sim.h"
#include "core/defaults.h"
#include "core/err.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dloco-sim run SCENARIO [--json FILE] [--seed N] [--duration_s S]\n"
            "       dloco-sim paper [--horizon_s S] [--calib_horizon_s S] [--seed N] [--repair_s S] [--json FILE]\n"
            "       dloco-sim tune [--horizon_s S] [--calib_horizon_s S] [--seed N] [--repair_s S] [--step_cv X]\n"
            "                      [--bandwidth_mbit X]\n"
            "       dloco-sim keys\n"
            "  run    simulate a dloco-chaos scenario (its [sim] section adds the sim's keys): learners,\n"
            "         datacenter links, H, fragments, quorum, max_staleness, liveness and the learner_kill\n"
            "         faults carry over; prints the buckets and, with --json, writes the result object\n"
            "  paper  the Decoupled DiLoCo goodput study (5B dense, MTBI 1 year per chip): fits recovery_s on\n"
            "         the data-parallel row and resize_s on the elastic row (repair_s = recovery_s, or\n"
            "         --repair_s), predicts the M = 2..16 rows on the real policy, prints the table beside\n"
            "         the paper's (--json: also as one JSON object); last line sim_vs_paper_max_diff_points: X\n"
            "  tune   at 1.2M chips, M = 8: the quorum / grace_steps / max_staleness that maximise\n"
            "         goodput x quality proxy (docs/SIM.md); last line tune_best_gain_points: X;\n"
            "         --step_cv / --bandwidth_mbit: a harder regime (between-learner spread, per-site link)\n"
            "  keys   every scenario key, [sim] included\n");
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "dloco-sim: %s: %s\n", what, *dl_errmsg() ? dl_errmsg() : dl_strerror(rc));
    return 2;
}

/* A number option: the whole value, finite, inside [lo, hi]. */
static int num_arg(const char *name, const char *v, double lo, double hi, double *out)
{
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "dloco-sim: %s '%s': a number in [%g, %g]\n", name, v ? v : "", lo, hi);
        return 2;
    }
    *out = x;
    return 0;
}

/* ---------------------------------------------------------------- run */
static int from_scenario(const dl_scenario *sc, dl_sim_cfg *c)
{
    dl_sim_cfg_default(c);
    const dl_sc_sim *s = &sc->sim;
    c->mode = !strcmp(s->mode, "dp") ? DL_SIM_DP : !strcmp(s->mode, "elastic") ? DL_SIM_ELASTIC : DL_SIM_DECOUPLED;
    c->seed = (uint64_t)sc->run.seed;
    c->horizon_s = s->horizon_s > 0 ? s->horizon_s : sc->run.duration_s;
    dl_timeline *tl = dl_xcalloc(1, sizeof *tl);
    int rc = dl_timeline_build(sc, 1, tl);
    if (rc) {
        free(tl);
        return rc;
    }
    int slots = tl->n_slot;
    c->chips = s->chips > 0 ? s->chips : slots;
    c->learners = s->learners > 0 ? (int)s->learners : slots;
    c->mtbi_s = s->mtbi_s;
    c->recovery_s = s->recovery_s;
    c->ckpt_s = s->ckpt_s;
    c->slice_chips = s->slice_chips;
    c->resize_s = s->resize_s;
    c->repair_s = s->repair_s;
    c->learner_fail = !strcmp(s->learner_fail, "restart") ? DL_SIM_FAIL_RESTART : DL_SIM_FAIL_RESIZE;
    c->startup_s = s->startup_s;
    c->restart_s = s->restart_s;
    c->step_s = s->step_s;
    c->step_cv = s->step_cv;
    c->H = (int)sc->run.H;
    c->P = (int)sc->run.fragments;
    double C = (double)sc->run.n_embd, Lr = (double)sc->run.n_layer;
    c->params = s->params > 0 ? s->params
                              : 12 * Lr * C * C + (double)(sc->run.vocab + sc->run.seq_len) * C; /* GPT, roughly */
    c->bytes_per_param = s->bytes_per_param;
    c->n_sites = sc->n_dc;
    for (int d = 0; d < sc->n_dc; d++) {
        c->bandwidth_mbit[d] = sc->dc[d].bandwidth_mbit;
        c->rtt_ms[d] = sc->dc[d].rtt_ms;
    }
    c->heartbeat_ms = (double)sc->sync.heartbeat_ms;
    c->liveness = (int)sc->sync.liveness;
    c->merge_s = s->merge_s;
    c->update_s = s->update_s;
    c->step_overhead_s = s->step_overhead_s;
    c->policy.quorum = (int)sc->sync.quorum;
    c->policy.max_staleness = sc->sync.max_staleness;
    c->policy.tau_steps = s->grace_steps;
    c->policy.grace_cap_ns = (int64_t)llround(s->grace_cap_s * 1e9);
    if (strcmp(sc->run.policy, "decoupled"))
        fprintf(stderr, "dloco-sim: [run] policy %s: simulated as decoupled (the sim's learners never wait at a "
                        "barrier; mode = dp / elastic are the synchronous baselines)\n", sc->run.policy);
    /* learners: one per slot when the scenario's slots are the learners; their datacenter and speed */
    if (c->learners == slots)
        for (int i = 0; i < slots; i++) {
            c->site_of[i] = tl->slot[i].dc;
            c->speed[i] = sc->learner[tl->slot[i].section].speed;
            /* overwrite and mix both drop the progress since the push (dloco-learner's node.c) */
            c->adopt_overwrite[i] = strcmp(sc->learner[tl->slot[i].section].adopt, "keep") != 0;
            if (tl->slot[i].join_s > 0 || tl->slot[i].leave_s > 0)
                fprintf(stderr, "dloco-sim: learner %s: join_s / leave_s are not simulated (provisioned throughout)\n",
                        tl->slot[i].id);
        }
    for (int k = 0; k < tl->n_ev; k++) {
        const dl_sc_event *e = &tl->ev[k];
        if (e->kind == DL_FK_LEARNER_JOIN || e->kind == DL_FK_LEARNER_LEAVE) continue;
        int slot = -1;
        for (int i = 0; i < slots; i++)
            if (!strcmp(tl->slot[i].id, e->target)) slot = i;
        if (e->kind != DL_FK_LEARNER_KILL || slot < 0 || c->learners != slots) {
            fprintf(stderr, "dloco-sim: fault %d (%s on %s at %.1f s): not simulated (only learner_kill on the "
                            "scenario's learners)\n", e->n, dl_fault_kind_name(e->kind), e->target, e->at_s);
            continue;
        }
        if (c->n_kill == DL_SIM_MAX_KILLS) {
            free(tl);
            return dl_err(DL_ERANGE, "sim: more than %d learner kills", DL_SIM_MAX_KILLS);
        }
        c->kill[c->n_kill++] = (dl_sim_kill){slot, e->at_s, e->duration_s};
    }
    free(tl);
    return dl_sim_cfg_check(c);
}

static void print_buckets(const dl_sim_cfg *c, const dl_sim_result *r, FILE *f)
{
    double P = r->provisioned;
    fprintf(f, "dloco-sim %s: %lld chips, M=%d, %.0f s simulated, seed %llu, %llu interruptions\n",
            dl_sim_mode_name(c->mode), (long long)c->chips, c->mode == DL_SIM_DECOUPLED ? c->learners : 1, c->horizon_s,
            (unsigned long long)c->seed, (unsigned long long)r->interruptions);
    fprintf(f, "  down %.2f%%  startup %.2f%%  recovery %.2f%%  idle_barrier %.2f%%  goodput %.2f%%  dropped_stale "
               "%.2f%%  wasted %.2f%%\n",
            100 * r->down / P, 100 * r->startup / P, 100 * r->recovery / P, 100 * r->idle_barrier / P,
            100 * r->goodput / P, 100 * r->dropped_stale / P, 100 * r->wasted / P);
    if (c->mode == DL_SIM_DECOUPLED)
        fprintf(f, "  merges %llu, %.2f contributions per merge, staleness %.2f, quality proxy %.4f, deaths %llu, "
                   "dropped pushes %llu\n",
                (unsigned long long)r->merges, r->mean_contrib, r->mean_staleness, r->quality,
                (unsigned long long)r->deaths, (unsigned long long)r->dropped);
}

static int cmd_run(int argc, char **argv)
{
    if (argc < 1) {
        usage(stderr);
        return 2;
    }
    const char *path = argv[0], *json = NULL;
    dl_sc_overrides ov = {-1, -1};
    for (int i = 1; i < argc; i++) {
        double v;
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            if (num_arg("--seed", argv[++i], 0, 9e15, &v)) return 2;
            ov.seed = (int64_t)v;
        } else if (!strcmp(argv[i], "--duration_s") && i + 1 < argc) {
            if (num_arg("--duration_s", argv[++i], 10, 86400, &v)) return 2;
            ov.duration_s = v;
        } else {
            fprintf(stderr, "dloco-sim: run: unknown or incomplete option '%s'\n", argv[i]);
            return 2;
        }
    }
    dl_scenario *sc = dl_xcalloc(1, sizeof *sc);
    int rc = dl_scenario_load(path, &ov, sc);
    if (rc) {
        free(sc);
        return fail(path, rc);
    }
    dl_sim_cfg *c = dl_xcalloc(1, sizeof *c);
    rc = from_scenario(sc, c);
    free(sc);
    if (rc) {
        free(c);
        return fail(path, rc);
    }
    c->progress = c->horizon_s >= 3600;
    dl_sim_result r;
    rc = dl_sim_run(c, &r);
    if (rc) {
        free(c);
        return fail("run", rc);
    }
    print_buckets(c, &r, stdout);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            free(c);
            return fail(json, DL_EIO);
        }
        dl_sim_result_json(c, &r, f);
        fclose(f);
    }
    dl_sim_result_json(c, &r, stdout);
    free(c);
    return 0;
}

/* ---------------------------------------------------------------- paper */
static const int64_t paper_chips[5] = {150000, 300000, 600000, 1200000, 2400000};
static const char *const paper_rows[6] = {"data-parallel", "elastic data-parallel", "M=2", "M=4", "M=8", "M=16"};
static const int paper_M[6] = {0, 0, 2, 4, 8, 16};
static const double paper_gp[6][5] = {{72, 57, 38, 27, 18}, {88, 80, 69, 58, 40}, {94, 88, 80, 70, 54},
                                      {96, 93, 89, 82, 73}, {98, 96, 94, 88, 80}, {99, 98, 96, 93, 86}};

/* The study's fixed assumptions (not fitted; docs/SIM.md). */
static void study_cfg(dl_sim_cfg *c, uint64_t seed, double horizon)
{
    dl_sim_cfg_default(c);
    c->seed = seed;
    c->horizon_s = horizon;
    c->mtbi_s = 365.25 * 86400; /* 1 year per chip */
    c->slice_chips = 256;
    c->step_s = 1.0;
    c->step_cv = 0.05;
    c->H = 100;
    c->P = 16;
    c->params = 5e9;
    c->bytes_per_param = 2;
    c->n_sites = DL_SIM_MAX_SITES; /* a datacenter per learner (16 of them), 100 Gbit/s each way, 50 ms */
    for (int d = 0; d < c->n_sites; d++) {
        c->bandwidth_mbit[d] = 100000;
        c->rtt_ms[d] = 50;
    }
}

typedef struct {
    double R, C;        /* DP recovery_s, ckpt_s (fitted on the data-parallel row) */
    double resize, rep; /* elastic resize_s (fitted on the elastic row), repair_s (not fitted: R, or --repair_s) */
    int rep_given;      /* 1: repair_s came from --repair_s */
} calib;

static double row_err(const double *sim, const double *paper, double *sum)
{
    double mx = 0, s = 0;
    for (int k = 0; k < 5; k++) {
        double d = fabs(100 * sim[k] - paper[k]);
        if (d > mx) mx = d;
        s += d;
    }
    if (sum) *sum = s;
    return mx;
}

static double run_gp(const dl_sim_cfg *c)
{
    dl_sim_result r;
    if (dl_sim_run(c, &r)) return -1;
    return r.goodput_frac;
}

/* Grid search, minimax over the row's five cells (ties: the smaller sum). Two fitted parameters, one per row:
 * recovery_s on the data-parallel row (with ckpt_s from a 4-value grid), resize_s on the elastic row. repair_s
 * is not fitted: a data-parallel job is back on all its chips recovery_s after an interruption, so the fleet
 * already replaces a failed chip from its spares within recovery_s, and an elastic job's dropped slice is
 * replaced from the same spares in the same time (repair_s = recovery_s); repair >= 0 overrides it
 * (--repair_s, the sensitivity study of docs/SIM.md). */
static void calibrate(uint64_t seed, double horizon, double repair, calib *out)
{
    dl_sim_cfg *c = dl_xcalloc(1, sizeof *c);
    study_cfg(c, seed, horizon);
    double best = 1e9, bsum = 1e9;
    static const double Cs[] = {0, 60, 300, 900};
    for (int ci = 0; ci < 4; ci++)
        for (double R = 20; R <= 150; R += 1) {
            double g[5];
            c->mode = DL_SIM_DP;
            c->recovery_s = R;
            c->ckpt_s = Cs[ci];
            for (int k = 0; k < 5; k++) {
                c->chips = paper_chips[k];
                g[k] = run_gp(c);
            }
            double s, e = row_err(g, paper_gp[0], &s);
            if (e < best - 1e-9 || (fabs(e - best) < 1e-9 && s < bsum)) best = e, bsum = s, out->R = R, out->C = Cs[ci];
        }
    fprintf(stderr, "dloco-sim: calibrated dp: recovery_s %.0f, ckpt_s %.0f (max diff %.2f points)\n", out->R, out->C,
            best);
    out->rep_given = repair >= 0;
    out->rep = repair >= 0 ? repair : out->R;
    best = bsum = 1e9;
    /* pass 0: resize_s 1..40 s by 1 s; pass 1: +-1 s around the best by 1/8 s */
    for (int pass = 0; pass < 2; pass++) {
        double lo = pass ? out->resize - 1 : 1, hi = pass ? out->resize + 1 : 40, st = pass ? 0.125 : 1;
        for (double Rs = lo; Rs <= hi + 1e-9; Rs += st) {
            if (Rs <= 0) continue;
            double g[5];
            c->mode = DL_SIM_ELASTIC;
            c->resize_s = Rs;
            c->repair_s = out->rep;
            for (int k = 0; k < 5; k++) {
                c->chips = paper_chips[k];
                g[k] = run_gp(c);
            }
            double s, e = row_err(g, paper_gp[1], &s);
            if (e < best - 1e-9 || (fabs(e - best) < 1e-9 && s < bsum)) best = e, bsum = s, out->resize = Rs;
        }
    }
    fprintf(stderr, "dloco-sim: calibrated elastic: resize_s %.3f (repair_s %.0f%s, slice_chips 256 fixed; max diff "
                    "%.2f points)\n", out->resize, out->rep, out->rep_given ? " from --repair_s" : " = recovery_s", best);
    free(c);
}

static void apply_calib(dl_sim_cfg *c, const calib *k)
{
    c->recovery_s = k->R;
    c->ckpt_s = k->C;
    c->resize_s = k->resize;
    c->repair_s = k->rep;
    c->learner_fail = DL_SIM_FAIL_RESIZE;
}

/* The study as one JSON object (dloco-sim paper --json FILE): the fitted and fixed parameters, both tables, the
 * maxima. 0, or DL_EIO. */
static int paper_json(const char *path, const calib *k, uint64_t seed, double horizon, double calib_horizon,
                      double sim[6][5], double excess, double cal_max, double pred_max, double maxd)
{
    FILE *f = fopen(path, "w");
    if (!f) return dl_err(DL_EIO, "cannot open %s for writing", path);
    fprintf(f, "{\"seed\":\"%llu\",\"horizon_s\":%.17g,\"calib_horizon_s\":%.17g,\"calibration\":{\"recovery_s\":%.17g,"
               "\"ckpt_s\":%.17g,\"resize_s\":%.17g,\"repair_s\":%.17g,\"repair_from\":\"%s\",\"slice_chips\":256},"
               "\"chips\":[", (unsigned long long)seed, horizon, calib_horizon, k->R, k->C, k->resize, k->rep,
            k->rep_given ? "option" : "recovery_s");
    for (int j = 0; j < 5; j++) fprintf(f, "%s%lld", j ? "," : "", (long long)paper_chips[j]);
    fprintf(f, "],\"rows\":[");
    for (int row = 0; row < 6; row++) {
        char M[16] = "null"; /* the data-parallel rows have no learners */
        if (paper_M[row]) snprintf(M, sizeof M, "%d", paper_M[row]);
        fprintf(f, "%s{\"row\":\"%s\",\"learners\":%s,\"calibrated\":%s,\"sim\":[", row ? "," : "", paper_rows[row], M,
                row < 2 ? "true" : "false");
        for (int j = 0; j < 5; j++) fprintf(f, "%s%.17g", j ? "," : "", sim[row][j]);
        fprintf(f, "],\"paper\":[");
        for (int j = 0; j < 5; j++) fprintf(f, "%s%.0f", j ? "," : "", paper_gp[row][j]);
        fprintf(f, "]}");
    }
    fprintf(f, "],\"credit_excess_max\":%.17g,\"calibrated_max_diff_points\":%.17g,\"predicted_max_diff_points\":%.17g,"
               "\"sim_vs_paper_max_diff_points\":%.17g}\n", excess, cal_max, pred_max, maxd);
    return fclose(f) ? dl_err(DL_EIO, "cannot write %s", path) : 0;
}

static int cmd_paper(double horizon, double calib_horizon, uint64_t seed, double repair, const char *json)
{
    calib k = {0};
    calibrate(seed, calib_horizon, repair, &k);
    dl_sim_cfg *c = dl_xcalloc(1, sizeof *c);
    double sim[6][5], maxd = 0, excess = 0;
    int rc;
    for (int row = 0; row < 6; row++)
        for (int j = 0; j < 5; j++) {
            study_cfg(c, seed + (uint64_t)j, row < 2 ? calib_horizon : horizon);
            apply_calib(c, &k);
            c->chips = paper_chips[j];
            c->mode = row == 0 ? DL_SIM_DP : row == 1 ? DL_SIM_ELASTIC : DL_SIM_DECOUPLED;
            c->learners = row >= 2 ? paper_M[row] : 1;
            c->progress = row >= 2 && paper_chips[j] >= 1200000 && paper_M[row] >= 8;
            dl_sim_result r;
            if ((rc = dl_sim_run(c, &r))) {
                free(c);
                return fail("paper", rc);
            }
            sim[row][j] = 100 * r.goodput_frac;
            excess = fmax(excess, r.credit_excess);
            double d = fabs(sim[row][j] - paper_gp[row][j]);
            if (d > maxd) maxd = d;
            if (row >= 2)
                fprintf(stderr, "dloco-sim: %s at %lld chips: goodput %.2f%% (merges %llu, %.2f per merge, staleness "
                                "%.2f, dropped %llu, deaths %llu, credit excess %.2g)\n",
                        paper_rows[row], (long long)paper_chips[j], sim[row][j], (unsigned long long)r.merges,
                        r.mean_contrib, r.mean_staleness, (unsigned long long)r.dropped, (unsigned long long)r.deaths,
                        r.credit_excess);
        }
    printf("Decoupled DiLoCo goodput study, 5B dense, MTBI 1 year per chip: dloco-sim (real dl_policy + dl_round)\n");
    printf("calibrated on the two data-parallel rows only (%.0f s simulated each):\n", calib_horizon);
    printf("  data-parallel:         recovery_s = %.0f, ckpt_s = %.0f (0: no work lost beyond the recovery)\n", k.R,
           k.C);
    printf("  elastic data-parallel: resize_s = %.3f per drop and per return (fitted); repair_s = %.0f (%s); "
           "slice_chips = 256 (fixed)\n", k.resize, k.rep,
           k.rep_given ? "--repair_s, not fitted" : "= recovery_s, not fitted: the spares that bring a data-parallel job back "
                                                     "on all its chips replace a dropped slice");
    printf("predicted (M rows, %.0f s simulated each): learners of chips/M chips, each elastic with the parameters "
           "above; H=100 P=16 step 1 s (cv 0.05), 5e9 params bf16, 100 Gbit/s + 50 ms per learner's site;\n"
           "policy: dloco-sync defaults (quorum 1, grace_steps 4, max_staleness %d, poly 0.5), heartbeat 1 s x 6\n",
           horizon, DL_DEF_MAX_STALENESS);
    printf("%-22s", "goodput % sim/paper(diff)");
    for (int j = 0; j < 5; j++) printf(" | %8.1fk chips   ", paper_chips[j] / 1000.0);
    printf("\n");
    for (int row = 0; row < 6; row++) {
        printf("%-22s", paper_rows[row]);
        for (int j = 0; j < 5; j++)
            printf(" | %5.1f/%3.0f (%+5.1f)", sim[row][j], paper_gp[row][j], sim[row][j] - paper_gp[row][j]);
        printf("%s\n", row < 2 ? "   [calibrated]" : "   [predicted]");
    }
    double pmax = 0, cmax = 0;
    for (int row = 0; row < 6; row++)
        for (int j = 0; j < 5; j++) {
            double d = fabs(sim[row][j] - paper_gp[row][j]);
            if (row < 2) cmax = fmax(cmax, d);
            else pmax = fmax(pmax, d);
        }
    printf("credit beyond compute scaled away (the skew rule, docs/SIM.md): at most %.4f%% of a cell's compute\n",
           100 * excess);
    printf("max |diff|: calibrated rows %.2f, predicted rows %.2f points\n", cmax, pmax);
    free(c);
    if (json && (rc = paper_json(json, &k, seed, horizon, calib_horizon, sim, excess, cmax, pmax, maxd)))
        return fail("paper", rc);
    printf("sim_vs_paper_max_diff_points: %.2f\n", maxd);
    return 0;
}

/* ---------------------------------------------------------------- tune */
static int cmd_tune(double horizon, double calib_horizon, uint64_t seed, double step_cv, double bw, double repair)
{
    calib k = {0};
    calibrate(seed, calib_horizon, repair, &k);
    dl_sim_cfg *c = dl_xcalloc(1, sizeof *c);
    static const int Q[] = {1, 2, 4, 6, 8};
    static const double G[] = {0.5, 1, 4, 16};
    static const int S[] = {1, 2, 4, 8, 16, DL_DEF_MAX_STALENESS};
    double best = -1, base = -1;
    int bq = 0, bs = 0;
    double bg = 0;
    dl_sim_result br = {0}, b0 = {0};
    printf("tuning at 1.2M chips, M=8, %.0f s simulated per setting (calibrated: dp R=%.0f, elastic resize_s=%.3f, "
           "repair_s=%.0f); step_cv %.2f, %.0f Mbit/s per site\n", horizon, k.R, k.resize, k.rep,
           step_cv >= 0 ? step_cv : 0.05, bw > 0 ? bw : 100000.0);
    printf("%7s %11s %13s | %8s %8s %10s %9s %10s\n", "quorum", "grace_steps", "max_staleness", "goodput", "quality",
           "gp*quality", "per_merge", "staleness");
    for (int qi = 0; qi < 5; qi++)
        for (int gi = 0; gi < 4; gi++)
            for (int si = 0; si < (int)(sizeof S / sizeof S[0]); si++) {
                study_cfg(c, seed, horizon);
                apply_calib(c, &k);
                c->chips = 1200000;
                c->learners = 8;
                if (step_cv >= 0) c->step_cv = step_cv;
                if (bw > 0)
                    for (int d = 0; d < c->n_sites; d++) c->bandwidth_mbit[d] = bw;
                c->policy.quorum = Q[qi];
                c->policy.tau_steps = G[gi];
                c->policy.max_staleness = S[si];
                dl_sim_result r;
                int rc = dl_sim_run(c, &r);
                if (rc) {
                    free(c);
                    return fail("tune", rc);
                }
                double obj = r.goodput_frac * r.quality;
                printf("%7d %11.1f %13d | %7.2f%% %8.4f %9.2f%% %9.2f %10.3f\n", Q[qi], G[gi], S[si],
                       100 * r.goodput_frac, r.quality, 100 * obj, r.mean_contrib, r.mean_staleness);
                fflush(stdout);
                if (Q[qi] == 1 && G[gi] == 4 && S[si] == DL_DEF_MAX_STALENESS) base = obj, b0 = r;
                if (obj > best) best = obj, bq = Q[qi], bg = G[gi], bs = S[si], br = r;
            }
    printf("defaults (quorum 1, grace_steps 4, max_staleness %d): goodput %.2f%%, quality %.4f, goodput x quality "
           "%.2f%%\n", DL_DEF_MAX_STALENESS, 100 * b0.goodput_frac, b0.quality, 100 * base);
    printf("best: quorum %d, grace_steps %.1f, max_staleness %d: goodput %.2f%%, quality %.4f, goodput x quality "
           "%.2f%%\n", bq, bg, bs, 100 * br.goodput_frac, br.quality, 100 * best);
    printf("vs the paper's 88%% (M=8, 1.2M chips): goodput %+.2f points, goodput x quality %+.2f points; vs the "
           "defaults: %+.2f points of goodput x quality\n", 100 * br.goodput_frac - 88, 100 * best - 88,
           100 * (best - base));
    printf("tune_best_gain_points: %.2f\n", 100 * best - 88);
    free(c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return cmd_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "keys")) {
        dl_scenario_usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "paper") || !strcmp(cmd, "tune")) {
        double horizon = 86400, ch = 7 * 86400, seed = 1, cv = -1, bw = 0, repair = -1;
        const char *json = NULL;
        if (!strcmp(cmd, "tune")) horizon = 21600;
        for (int i = 2; i < argc; i++) {
            if (!strcmp(argv[i], "--horizon_s") && i + 1 < argc) {
                if (num_arg("--horizon_s", argv[++i], 600, 30 * 86400, &horizon)) return 2;
            } else if (!strcmp(argv[i], "--calib_horizon_s") && i + 1 < argc) {
                if (num_arg("--calib_horizon_s", argv[++i], 3600, 365 * 86400, &ch)) return 2;
            } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
                if (num_arg("--seed", argv[++i], 0, 9e15, &seed)) return 2;
            } else if (!strcmp(cmd, "paper") && !strcmp(argv[i], "--json") && i + 1 < argc) {
                json = argv[++i];
            } else if (!strcmp(argv[i], "--repair_s") && i + 1 < argc) {
                if (num_arg("--repair_s", argv[++i], 0, 1e6, &repair)) return 2;
            } else if (!strcmp(cmd, "tune") && !strcmp(argv[i], "--step_cv") && i + 1 < argc) {
                if (num_arg("--step_cv", argv[++i], 0, 2, &cv)) return 2;
            } else if (!strcmp(cmd, "tune") && !strcmp(argv[i], "--bandwidth_mbit") && i + 1 < argc) {
                if (num_arg("--bandwidth_mbit", argv[++i], 1, 1e9, &bw)) return 2;
            } else {
                fprintf(stderr, "dloco-sim: %s: unknown or incomplete option '%s'\n", cmd, argv[i]);
                return 2;
            }
        }
        return !strcmp(cmd, "paper") ? cmd_paper(horizon, ch, (uint64_t)seed, repair, json)
                                     : cmd_tune(horizon, ch, (uint64_t)seed, cv, bw, repair);
    }
    fprintf(stderr, "dloco-sim: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
