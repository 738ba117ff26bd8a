/* Sync timing policies (learner/timing.h): fixed, wa, wa_forecast, matched_random, oracle. */
#include "learner/timing.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/plan.h"
#include "core/rng.h"

typedef struct {
    int64_t last;      /* step of the last push decision (or first_p - H) */
    int64_t pushes;
    double loss_ref;   /* loss EWMA at the last push decision; NAN = none */
    int64_t *plan;     /* matched_random / oracle: planned steps */
    int nplan, next;
} tfrag;

struct dl_timing {
    dl_timing_cfg c;
    tfrag *f;
    dl_pressure_sample s; /* last observed */
    double loss_ewma;     /* NAN until the first finite loss */
    double level, trend, forecast; /* Holt on the rate; NAN until the first known rate */
    double press;         /* pressure term of the last observe; NAN when unknown */
    int64_t cur_step;     /* wa: the step of the decisions counted in cur_n */
    int cur_n, quota;
};

static const char *const names[] = {"fixed", "wa", "wa_forecast", "matched_random", "oracle"};

const char *dl_timing_name(dl_timing_kind k)
{
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

int dl_timing_parse(const char *s, dl_timing_kind *out)
{
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
        if (s && !strcmp(s, names[i])) {
            *out = (dl_timing_kind)i;
            return 0;
        }
    return dl_err(DL_EINVAL, "sync_timing '%s' is not fixed, wa, wa_forecast, matched_random or oracle",
                  s ? s : "(null)");
}

void dl_timing_defaults(dl_timing_cfg *c, dl_timing_kind kind, int P, int H)
{
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->P = P;
    c->H = H;
    c->h_min = H / 2 > 1 ? H / 2 : 1;
    c->h_max = 2 * H;
    c->w_stale = 1.0;
    c->w_loss = 0.5;
    c->w_rate = c->w_link = c->w_ckpt = c->w_queue = 1.0;
    c->rate_ref = 50.0;
    c->queue_ref = 1.0;
    c->fc_alpha = 0.5;
    c->fc_beta = 0.3;
    c->window = 1;
}

static int64_t first_last(int p, int H, int P)
{
    int64_t off = (int64_t)p * H / P;
    return (off ? off : H) - H;
}

/* ---- placements over steps 1..S: rows indexed by t in [1, S] */

typedef struct {
    int64_t S, lo1, hi1; /* the first push's range */
    int hmin, hmax;
} corridor;

static corridor corridor_of(const dl_timing_cfg *c, int p)
{
    int64_t l0 = first_last(p, c->H, c->P);
    corridor k = {.S = c->steps, .hmin = c->h_min, .hmax = c->h_max};
    k.lo1 = l0 + c->h_min > 1 ? l0 + c->h_min : 1;
    k.hi1 = l0 + c->h_max < c->steps ? l0 + c->h_max : c->steps;
    return k;
}

static double unit(dl_rng *r) { return (double)(dl_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

/* Uniform over feasible placements of k pushes: rows N_i(t) (ways to finish with push i at t), each row
 * scaled by its max (only ratios inside a row are used). Returns 0 or DL_EINVAL when none exists. */
static int place_random(const corridor *k, int n, dl_rng *rng, int64_t *out)
{
    int64_t S = k->S;
    if (n == 0) return k->lo1 - k->hmin + k->hmax > S ? 0 : DL_EINVAL; /* S - l0 < hmax */
    double *N = calloc((size_t)n * (size_t)(S + 1), sizeof *N);
    if (!N) return DL_ENOMEM;
#define ROW(i) (N + (size_t)(i) * (size_t)(S + 1))
    for (int64_t t = 1; t <= S; t++) ROW(n - 1)[t] = S - t < k->hmax ? 1.0 : 0.0;
    for (int i = n - 2; i >= 0; i--) {
        double *r = ROW(i), *nx = ROW(i + 1), mx = 0.0;
        for (int64_t t = 1; t <= S; t++) {
            double s = 0.0;
            for (int g = k->hmin; g <= k->hmax && t + g <= S; g++) s += nx[t + g];
            r[t] = s;
            if (s > mx) mx = s;
        }
        if (mx > 0)
            for (int64_t t = 1; t <= S; t++) r[t] /= mx;
    }
    int64_t lo = k->lo1, hi = k->hi1;
    for (int i = 0; i < n; i++) {
        double tot = 0.0, *r = ROW(i);
        for (int64_t t = lo; t <= hi; t++) tot += r[t];
        if (!(tot > 0)) {
            free(N);
            return DL_EINVAL;
        }
        double u = unit(rng) * tot, acc = 0.0;
        int64_t pick = -1;
        for (int64_t t = lo; t <= hi; t++) {
            if (r[t] <= 0) continue;
            pick = t;
            acc += r[t];
            if (u < acc) break;
        }
        out[i] = pick;
        lo = pick + k->hmin;
        hi = pick + k->hmax < S ? pick + k->hmax : S;
    }
#undef ROW
    free(N);
    return 0;
}

double dl_timing_cost(const double *trace, int64_t len, int window, const int64_t *steps, int n)
{
    double c = 0.0;
    for (int i = 0; i < n; i++)
        for (int64_t s = steps[i]; s < steps[i] + window; s++)
            if (s >= 1 && s <= len) c += trace[s - 1];
    return c;
}

/* Least-cost feasible placement of k pushes (exact DP, ties: earliest). */
static int place_oracle(const corridor *k, int n, const double *trace, int64_t len, int window, int64_t *out)
{
    int64_t S = k->S;
    if (n == 0) return k->lo1 - k->hmin + k->hmax > S ? 0 : DL_EINVAL;
    size_t W = (size_t)(S + 1);
    double *C = malloc((size_t)n * W * sizeof *C);
    int64_t *arg = malloc((size_t)n * W * sizeof *arg);
    double *cost = malloc(W * sizeof *cost);
    if (!C || !arg || !cost) {
        free(C), free(arg), free(cost);
        return DL_ENOMEM;
    }
    for (int64_t t = 1; t <= S; t++) cost[t] = dl_timing_cost(trace, len, window, &t, 1);
    for (int64_t t = 1; t <= S; t++) C[(size_t)(n - 1) * W + (size_t)t] = S - t < k->hmax ? cost[t] : INFINITY;
    for (int i = n - 2; i >= 0; i--)
        for (int64_t t = 1; t <= S; t++) {
            double best = INFINITY;
            int64_t b = -1;
            for (int g = k->hmin; g <= k->hmax && t + g <= S; g++) {
                double v = C[(size_t)(i + 1) * W + (size_t)(t + g)];
                if (v < best) best = v, b = t + g;
            }
            C[(size_t)i * W + (size_t)t] = cost[t] + best;
            arg[(size_t)i * W + (size_t)t] = b;
        }
    double best = INFINITY;
    int64_t t0 = -1;
    for (int64_t t = k->lo1; t <= k->hi1; t++)
        if (C[t] < best) best = C[t], t0 = t;
    int rc = 0;
    if (t0 < 0) rc = DL_EINVAL;
    else
        for (int i = 0; i < n; i++) {
            out[i] = t0;
            if (i + 1 < n) t0 = arg[(size_t)i * W + (size_t)t0];
        }
    free(C), free(arg), free(cost);
    return rc;
}

/* ---- open / close */

static int finite_nonneg(double x) { return isfinite(x) && x >= 0; }

int dl_timing_open(const dl_timing_cfg *c, dl_timing **out)
{
    assert(c && out);
    *out = NULL;
    if ((unsigned)c->kind > DL_TIMING_ORACLE) return dl_err(DL_EINVAL, "sync_timing: unknown policy %d", c->kind);
    if (c->P < 1 || c->H < 1) return dl_err(DL_EINVAL, "sync_timing: P %d and H %d must be >= 1", c->P, c->H);
    if (c->kind != DL_TIMING_FIXED) {
        if (!(c->h_min >= 1 && c->h_min <= c->H && c->H <= c->h_max && c->h_max < 1000000000))
            return dl_err(DL_EINVAL, "sync_timing: corridor h_min %d .. h_max %d must hold H %d (1 <= h_min <= H <= h_max)",
                          c->h_min, c->h_max, c->H);
        const double w[] = {c->w_stale, c->w_loss, c->w_rate, c->w_link, c->w_ckpt, c->w_queue};
        static const char *const wn[] = {"w_stale", "w_loss", "w_rate", "w_link", "w_ckpt", "w_queue"};
        for (int i = 0; i < 6; i++)
            if (!finite_nonneg(w[i])) return dl_err(DL_EINVAL, "sync_timing: weight %s %g must be finite and >= 0", wn[i], w[i]);
        if (!(isfinite(c->rate_ref) && c->rate_ref > 0))
            return dl_err(DL_EINVAL, "sync_timing: rate_ref %g must be finite and > 0", c->rate_ref);
        if (!(isfinite(c->queue_ref) && c->queue_ref > 0))
            return dl_err(DL_EINVAL, "sync_timing: queue_ref %g must be finite and > 0", c->queue_ref);
        if (c->max_per_step < 0 || c->max_per_step > c->P)
            return dl_err(DL_EINVAL, "sync_timing: max_per_step %d outside [0, P = %d]", c->max_per_step, c->P);
        if (!(c->fc_alpha > 0 && c->fc_alpha <= 1 && c->fc_beta > 0 && c->fc_beta <= 1))
            return dl_err(DL_EINVAL, "sync_timing: forecast alpha %g / beta %g must be in (0, 1]", c->fc_alpha, c->fc_beta);
    }
    int planned = c->kind == DL_TIMING_MATCHED_RANDOM || c->kind == DL_TIMING_ORACLE;
    if (planned) {
        if (c->steps < 1 || c->steps > 100000000)
            return dl_err(DL_EINVAL, "sync_timing %s: steps %lld must be in [1, 1e8]", names[c->kind], (long long)c->steps);
        if (!c->counts) return dl_err(DL_EINVAL, "sync_timing %s: no push counts (a trace of the policy under test)", names[c->kind]);
        for (int p = 0; p < c->P; p++)
            if (c->counts[p] < 0 || c->counts[p] > c->steps)
                return dl_err(DL_EINVAL, "sync_timing %s: count %d of fragment %d outside [0, steps]", names[c->kind],
                              c->counts[p], p);
        /* the placement is a DP over counts[p] x (steps + 1) cells, each over the corridor's width: bound both
         * before allocating (a valid but huge trace would otherwise take gigabytes or hours before step 1) */
        double width = c->kind == DL_TIMING_FIXED ? 1.0 : (double)c->h_max - c->h_min + 1.0;
        for (int p = 0; p < c->P; p++) {
            double cells = (double)c->counts[p] * ((double)c->steps + 1.0);
            if (cells > DL_TIMING_PLAN_CELLS_MAX || cells * width > DL_TIMING_PLAN_WORK_MAX)
                return dl_err(DL_EINVAL, "sync_timing %s: fragment %d's placement needs %.3g cells x %.0f corridor steps, "
                              "above the bound of %.3g cells and %.3g steps of work (fewer steps or pushes)",
                              names[c->kind], p, cells, width, DL_TIMING_PLAN_CELLS_MAX, DL_TIMING_PLAN_WORK_MAX);
        }
    }
    if (c->kind == DL_TIMING_ORACLE) {
        if (!c->trace || c->trace_len < 1) return dl_err(DL_EINVAL, "sync_timing oracle: no pressure trace");
        if (c->window < 1 || c->window > 1000000) return dl_err(DL_EINVAL, "sync_timing oracle: window %d must be in [1, 1e6]", c->window);
        for (int64_t i = 0; i < c->trace_len; i++)
            if (!finite_nonneg(c->trace[i]))
                return dl_err(DL_EINVAL, "sync_timing oracle: trace value %g at step %lld not finite and >= 0", c->trace[i],
                              (long long)(i + 1));
    }
    dl_timing *t = dl_xcalloc(1, sizeof *t);
    t->c = *c;
    t->c.counts = NULL;
    t->c.trace = NULL;
    t->f = dl_xcalloc((size_t)c->P, sizeof *t->f);
    t->loss_ewma = t->level = t->trend = t->forecast = t->press = NAN;
    t->quota = c->max_per_step ? c->max_per_step : (c->P + c->H - 1) / c->H;
    dl_rng rng;
    dl_rng_seed(&rng, c->seed);
    for (int p = 0; p < c->P; p++) {
        tfrag *f = &t->f[p];
        f->last = first_last(p, c->H, c->P);
        f->loss_ref = NAN;
        if (!planned) continue;
        f->nplan = c->counts[p];
        f->plan = dl_xcalloc((size_t)(f->nplan ? f->nplan : 1), sizeof *f->plan);
        corridor k = corridor_of(c, p);
        int rc = c->kind == DL_TIMING_ORACLE ? place_oracle(&k, f->nplan, c->trace, c->trace_len, c->window, f->plan)
                                             : place_random(&k, f->nplan, &rng, f->plan);
        if (rc) {
            dl_timing_close(&t);
            if (rc == DL_ENOMEM) return dl_err(rc, "sync_timing: out of memory placing %d pushes", c->counts[p]);
            return dl_err(DL_EINVAL,
                          "sync_timing %s: no feasible placement of %d pushes of fragment %d over %lld steps in the corridor "
                          "[%d, %d] (a trace of another run length or corridor?)",
                          names[c->kind], c->counts[p], p, (long long)c->steps, c->h_min, c->h_max);
        }
    }
    *out = t;
    return 0;
}

void dl_timing_close(dl_timing **tp)
{
    if (!tp || !*tp) return;
    dl_timing *t = *tp;
    for (int p = 0; p < t->c.P; p++) free(t->f[p].plan);
    free(t->f);
    free(t);
    *tp = NULL;
}

/* ---- the online part */

void dl_timing_observe(dl_timing *t, int64_t step, const dl_pressure_sample *s, double loss)
{
    (void)step;
    if (isfinite(loss)) t->loss_ewma = isnan(t->loss_ewma) ? loss : 0.9 * t->loss_ewma + 0.1 * loss;
    if (!s || !s->known) {
        t->s.known = 0;
        t->press = NAN;
        return;
    }
    t->s = *s;
    double x = s->rate;
    if (isnan(t->level)) {
        t->level = x;
        t->trend = 0.0;
    } else {
        double lv = t->c.fc_alpha * x + (1 - t->c.fc_alpha) * (t->level + t->trend);
        t->trend = t->c.fc_beta * (lv - t->level) + (1 - t->c.fc_beta) * t->trend;
        t->level = lv;
    }
    t->forecast = t->level + t->trend > 0 ? t->level + t->trend : 0.0;
    double r = x;
    if (t->c.kind == DL_TIMING_WA_FORECAST && t->forecast > r) r = t->forecast;
    double excess = r / t->c.rate_ref - 1.0;
    t->press = t->c.w_rate * (excess > 0 ? excess : 0.0) + t->c.w_link * s->link + t->c.w_ckpt * s->ckpt +
              t->c.w_queue * s->queue / t->c.queue_ref;
}

static void decided(dl_timing *t, tfrag *f, int64_t step)
{
    f->last = step;
    f->pushes++;
    f->loss_ref = t->loss_ewma;
}

int dl_timing_due(dl_timing *t, int64_t step, int p, int H, dl_timing_decision *d)
{
    assert(t && p >= 0 && p < t->c.P && step >= 1 && H >= 1);
    dl_timing_decision z = {.score = NAN, .pressure = t->press};
    tfrag *f = &t->f[p];
    z.elapsed = step - f->last;
    switch (t->c.kind) {
    case DL_TIMING_FIXED:
        z.push = dl_plan_due(step, p, H, t->c.P);
        break;
    case DL_TIMING_MATCHED_RANDOM:
    case DL_TIMING_ORACLE:
        /* a planned step the node did not ask about (fragment not held then) goes at the next call */
        while (f->next < f->nplan && f->plan[f->next] <= step) {
            z.push = 1;
            f->next++;
        }
        break;
    default: {
        const dl_timing_cfg *c = &t->c;
        int64_t e = z.elapsed;
        if (t->cur_step != step) t->cur_step = step, t->cur_n = 0;
        if (e < c->h_min) break;
        if (e >= c->h_max) {
            z.push = z.forced = 1;
            t->cur_n++;
            break;
        }
        if (t->cur_n >= t->quota) break; /* this step's quota is spent: a later step */
        if (isnan(t->press)) { /* pressure unknown: the fixed period */
            z.push = e >= c->H;
            t->cur_n += z.push;
            break;
        }
        double prog = c->w_stale * (double)(e - c->H) / (double)(c->h_max - c->h_min);
        if (isfinite(f->loss_ref) && f->loss_ref > 0 && isfinite(t->loss_ewma))
            prog += c->w_loss * (f->loss_ref - t->loss_ewma) / f->loss_ref;
        z.score = prog - t->press;
        z.push = z.score >= 0;
        t->cur_n += z.push;
    }
    }
    if (z.push) decided(t, f, step);
    if (d) *d = z;
    return z.push;
}

int64_t dl_timing_pushes(const dl_timing *t, int p)
{
    assert(p >= 0 && p < t->c.P);
    return t->f[p].pushes;
}

double dl_timing_pressure(const dl_timing *t) { return t->press; }
double dl_timing_forecast(const dl_timing *t) { return t->forecast; }

const int64_t *dl_timing_plan(const dl_timing *t, int p, int *n)
{
    assert(p >= 0 && p < t->c.P);
    *n = t->f[p].nplan;
    return t->f[p].plan;
}
