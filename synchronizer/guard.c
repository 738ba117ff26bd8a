/* Push guards: plausibility of a push's counters, norm bounds from a robust
 * per-fragment history, replay refusal, and the merged-parameter check. Pure. */
#include "synchronizer/guard.h"

#include "kernels/outer.h"

#include "core/err.h"
#include "core/hash.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

/* Below this many floats the O(n) passes run on one thread. */
#define PAR_MIN ((size_t)1 << 15)
/* Sums add a fixed number of chunk sums in order: bit-identical results
 * whatever the thread count. */
#define NCHUNK 256

/* Recent push norms of one fragment, each with its learner slot: a ring in
 * arrival order holding at most one record per learner (the newest), so the
 * median is one vote per learner among the norm_window most recent pushers
 * (O(window) per record, window <= 1024; 32 by default). */
typedef struct {
    double norm;  /* the push's norm per sqrt(step): L2 norm / sqrt(max(steps, 1)) */
    double steps; /* its steps (at least 1) */
    double rate;  /* its steps per second since its base reached its learner (0: not known) */
    int slot;
} obs;
typedef struct {
    obs *ring;      /* [cap], ring[(pos - n + i) mod cap] is the i-th oldest */
    int n, pos;     /* remembered norms; next ring index to write */
} hist;

struct dl_guard {
    dl_guard_cfg cfg;
    int P, L;
    int cap;           /* ring capacity of every hist = cfg.norm_window */
    hist *h;           /* [P] */
    obs *hmem;         /* [P][cap]: every ring */
    double *scratch;   /* [cap]: the median's values */
    uint64_t **next;   /* [L], each NULL or [P]: lowest base that is not a replay */
};

/* A reason for the caller (why may be NULL). */
static void say(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t cap, const char *fmt, ...)
{
    if (!why || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
}

/* The same reason in why and in dl_errmsg(); returns code. */
static int refuse(int code, char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int refuse(int code, char *why, size_t cap, const char *fmt, ...)
{
    char m[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    say(why, cap, "%s", m);
    return dl_err(code, "%s", m);
}

/* ---------------------------------------------------------------- config */

dl_guard_cfg dl_guard_cfg_default(void)
{
    dl_guard_cfg c = {
        .norm_k = 10.0,
        .norm_window = 32,
        .norm_min_history = 1,
        .norm_param_ratio = 10.0,
        .norm_action = DL_GUARD_REJECT,
        .param_abs_max = 1000.0,
        .max_step_rate = 10000.0, /* a small model on a GPU makes thousands */
        .step_slack = 64,
        .max_batch = 65536,
        .max_tokens_per_step = 1ull << 24,
    };
    return c;
}

int dl_guard_cfg_check(const dl_guard_cfg *c)
{
    /* written as !(in range) so a NaN fails every check */
    if (!(c->norm_k == 0.0 || (c->norm_k >= 1.0 && c->norm_k <= 1e6)))
        return dl_err(DL_EINVAL, "guard config: norm_k %g must be 0 (off) or in [1, 1e6]", c->norm_k);
    if (c->norm_window < 1 || c->norm_window > DL_GUARD_MAX_WINDOW)
        return dl_err(DL_EINVAL, "guard config: norm_window %d outside [1, %d]", c->norm_window, DL_GUARD_MAX_WINDOW);
    if (c->norm_min_history < 1 || c->norm_min_history > c->norm_window)
        return dl_err(DL_EINVAL, "guard config: norm_min_history %d outside [1, norm_window %d]", c->norm_min_history,
                      c->norm_window);
    if (!(c->norm_param_ratio == 0.0 || (c->norm_param_ratio > 0.0 && c->norm_param_ratio <= 1e9)))
        return dl_err(DL_EINVAL, "guard config: norm_param_ratio %g must be 0 (off) or in (0, 1e9]",
                      c->norm_param_ratio);
    if (c->norm_action != DL_GUARD_REJECT && c->norm_action != DL_GUARD_CLIP)
        return dl_err(DL_EINVAL, "guard config: norm_action %d is not reject (0) or clip (1)", (int)c->norm_action);
    if (!(c->param_abs_max >= 0.0 && isfinite(c->param_abs_max)))
        return dl_err(DL_EINVAL, "guard config: param_abs_max %g must be 0 (off) or finite > 0", c->param_abs_max);
    if (!(c->max_step_rate > 0.0 && c->max_step_rate <= 1e9))
        return dl_err(DL_EINVAL, "guard config: max_step_rate %g outside (0, 1e9] steps/s", c->max_step_rate);
    if (c->max_batch < 1) return dl_err(DL_EINVAL, "guard config: max_batch %u must be >= 1", c->max_batch);
    if (c->max_tokens_per_step < 1 || c->max_tokens_per_step > (1ull << 40))
        return dl_err(DL_EINVAL, "guard config: max_tokens_per_step %llu outside [1, 2^40]",
                      (unsigned long long)c->max_tokens_per_step);
    return 0;
}

static const char *const action_names[] = {"reject", "clip"};

const char *dl_guard_action_name(dl_guard_action a)
{
    return (unsigned)a < 2 ? action_names[a] : "?";
}

int dl_guard_action_parse(const char *name, dl_guard_action *out)
{
    for (int i = 0; name && i < 2; i++)
        if (!strcmp(name, action_names[i])) return *out = (dl_guard_action)i, 0;
    return dl_err(DL_EINVAL, "guard norm action '%s' is not reject or clip", name ? name : "(null)");
}

/* ---------------------------------------------------------------- lifetime */

/* Point every fragment's history into a fresh block for capacity cap. */
static void hist_alloc(int P, int cap, hist **h, obs **mem)
{
    *h = dl_xcalloc((size_t)P, sizeof **h);
    *mem = dl_xcalloc((size_t)P * (size_t)cap, sizeof **mem);
    for (int p = 0; p < P; p++) (*h)[p].ring = *mem + (size_t)p * (size_t)cap;
}

int dl_guard_open(const dl_guard_cfg *c, int n_fragments, int max_learners, dl_guard **out)
{
    *out = NULL;
    DL_TRY(dl_guard_cfg_check(c));
    if (n_fragments < 1 || n_fragments > DL_GUARD_MAX_FRAGMENTS)
        return dl_err(DL_EINVAL, "guard: n_fragments %d outside [1, %d]", n_fragments, DL_GUARD_MAX_FRAGMENTS);
    if (max_learners < 1 || max_learners > DL_GUARD_MAX_LEARNERS)
        return dl_err(DL_EINVAL, "guard: max_learners %d outside [1, %d]", max_learners, DL_GUARD_MAX_LEARNERS);
    dl_guard *g = dl_xcalloc(1, sizeof *g);
    g->cfg = *c;
    g->P = n_fragments;
    g->L = max_learners;
    g->cap = c->norm_window;
    hist_alloc(g->P, g->cap, &g->h, &g->hmem);
    g->scratch = dl_xcalloc((size_t)DL_GUARD_MAX_WINDOW, sizeof *g->scratch);
    g->next = dl_xcalloc((size_t)g->L, sizeof *g->next);
    *out = g;
    return 0;
}

void dl_guard_close(dl_guard **gp)
{
    if (!gp || !*gp) return;
    dl_guard *g = *gp;
    for (int s = 0; s < g->L; s++) free(g->next[s]);
    free(g->next);
    free(g->h);
    free(g->hmem);
    free(g->scratch);
    free(g);
    *gp = NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int dl_guard_reconfigure(dl_guard *g, const dl_guard_cfg *c)
{
    DL_TRY(dl_guard_cfg_check(c));
    if (c->norm_window != g->cap) {
        /* move each fragment's newest min(n, new window) norms, oldest first */
        int cap = c->norm_window;
        hist *h;
        obs *mem;
        hist_alloc(g->P, cap, &h, &mem);
        for (int p = 0; p < g->P; p++) {
            const hist *o = &g->h[p];
            int keep = o->n < cap ? o->n : cap;
            for (int i = 0; i < keep; i++) {
                int k = ((o->pos - keep + i) % g->cap + g->cap) % g->cap;
                h[p].ring[i] = o->ring[k];
            }
            h[p].n = keep;
            h[p].pos = keep % cap;
        }
        free(g->h);
        free(g->hmem);
        g->h = h;
        g->hmem = mem;
        g->cap = cap;
    }
    g->cfg = *c;
    return 0;
}

const dl_guard_cfg *dl_guard_get_cfg(const dl_guard *g) { return &g->cfg; }

/* ---------------------------------------------------------------- counters */

/* tokens <= steps * bs without forming the product: with q = tokens / bs,
 * r = tokens % bs, tokens > steps * bs  <=>  q > steps or (q == steps and
 * r > 0). */
static int tokens_over(uint64_t bs, uint64_t steps, uint64_t tokens)
{
    return bs ? (tokens / bs > steps || (tokens / bs == steps && tokens % bs)) : tokens > 0;
}

/* ceil(elapsed * rate) + slack, saturating */
static int steps_check(const dl_guard *g, uint64_t steps, double elapsed_s, char *why, size_t cap)
{
    double r = ceil(elapsed_s * g->cfg.max_step_rate);
    uint64_t lim = r >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)r;
    lim = lim > UINT64_MAX - g->cfg.step_slack ? UINT64_MAX : lim + g->cfg.step_slack;
    if (steps > lim) {
        return refuse(DL_ERANGE, why, cap,
                      "steps %llu > %llu plausible in %.3g s (max_step_rate %g/s + step_slack %llu)",
                      (unsigned long long)steps, (unsigned long long)lim, elapsed_s, g->cfg.max_step_rate,
                      (unsigned long long)g->cfg.step_slack);
    }
    return 0;
}

int dl_guard_counters(const dl_guard *g, uint32_t batch, uint32_t seq_len, uint64_t steps, uint64_t tokens,
                      double elapsed_s, char *why, size_t cap)
{
    assert(elapsed_s >= 0.0); /* also refuses NaN */
    uint32_t b = batch ? batch : g->cfg.max_batch;
    uint64_t bs = (uint64_t)b * seq_len; /* < 2^64 as a product of two 32-bit numbers */
    if (tokens_over(bs, steps, tokens)) {
        /* steps * bs < tokens <= UINT64_MAX here, so it is printable exactly */
        return refuse(DL_ERANGE, why, cap, "tokens %llu > steps %llu x batch %u%s x seq_len %u = %llu",
                      (unsigned long long)tokens, (unsigned long long)steps, b,
                      batch ? "" : " (max_batch: none declared)", seq_len, (unsigned long long)(steps * bs));
    }
    return steps_check(g, steps, elapsed_s, why, cap);
}

int dl_guard_counters_tps(const dl_guard *g, uint64_t tps, uint64_t steps, uint64_t tokens, double elapsed_s,
                          char *why, size_t cap)
{
    assert(elapsed_s >= 0.0);
    if (tokens_over(tps, steps, tokens))
        return refuse(DL_ERANGE, why, cap, "tokens %llu > steps %llu x max_tokens_per_step %llu = %llu",
                      (unsigned long long)tokens, (unsigned long long)steps, (unsigned long long)tps,
                      (unsigned long long)(steps * tps));
    return steps_check(g, steps, elapsed_s, why, cap);
}

int dl_guard_tokens_bound(const dl_guard *g, uint64_t claim, uint64_t *bound, char *why, size_t cap)
{
    *bound = claim ? claim : g->cfg.max_tokens_per_step;
    if (claim <= g->cfg.max_tokens_per_step) return 0;
    return refuse(DL_ERANGE, why, cap, "max_tokens_per_step %llu > the run's max_tokens_per_step %llu",
                  (unsigned long long)claim, (unsigned long long)g->cfg.max_tokens_per_step);
}

int dl_guard_batch(const dl_guard *g, uint32_t batch, char *why, size_t cap)
{
    if (batch <= g->cfg.max_batch) return 0;
    return refuse(DL_ERANGE, why, cap, "batch %u > max_batch %u", batch, g->cfg.max_batch);
}

/* ---------------------------------------------------------------- values */

double dl_guard_norm(const float *x, size_t n, int *finite)
{
    assert((x || n == 0) && finite);
    /* every square is finite and < 2^256 unless its value is not finite
     * (inf^2 = inf, nan^2 = nan; no -inf can cancel an inf), so the double
     * sum is finite exactly when every value is */
    double norm = dl_cpu_norm2(x, n);
    *finite = isfinite(norm) ? 1 : 0;
    return norm;
}

double dl_guard_sumsq(const float *x, size_t n)
{
    assert(x || n == 0);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

double dl_guard_copy_sumsq(float *dst, const void *src, size_t n)
{
    assert((dst && src) || n == 0);
    const unsigned char *b = src;
    double s = 0.0;
    size_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    /* dst is a pool buffer the merge reads long after this (a fragment is
     * tens of MB): streaming stores skip reading each of its cache lines in
     * before writing it, a third of this copy's memory traffic */
    while (i < n && ((uintptr_t)(dst + i) & 31u)) {
        float v;
        memcpy(&v, b + 4 * i, sizeof v);
        dst[i++] = v;
        s += (double)v * (double)v;
    }
    if (n - i >= 8) {
        __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps((const float *)(const void *)(b + 4 * i));
            _mm256_stream_ps(dst + i, v);
            __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
            a0 = _mm256_fmadd_pd(lo, lo, a0);
            a1 = _mm256_fmadd_pd(hi, hi, a1);
        }
        _mm_sfence();
        double part[4];
        _mm256_storeu_pd(part, _mm256_add_pd(a0, a1));
        s += (part[0] + part[1]) + (part[2] + part[3]);
    }
#endif
#pragma omp simd reduction(+ : s)
    for (size_t k = i; k < n; k++) {
        float v;
        memcpy(&v, b + 4 * k, sizeof v); /* an unaligned load */
        dst[k] = v;
        s += (double)v * (double)v;
    }
    return s;
}

/* What hist_median_of takes the median of. */
enum { MED_NORM, MED_STEPS, MED_RATE };

/* Median over learners of the newest record of each: of its norm per
 * sqrt(step), of its steps, or of its step rate (records with a known rate
 * only); *learners = how many learners that is. */
static double hist_median_of(const dl_guard *g, const hist *h, int what, int *learners)
{
    double *v = g->scratch;
    int m = 0;
    for (int i = 0; i < h->n; i++) { /* newest first */
        const obs *o = &h->ring[((h->pos - 1 - i) % g->cap + g->cap) % g->cap];
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = h->ring[((h->pos - 1 - j) % g->cap + g->cap) % g->cap].slot == o->slot;
        if (seen || (what == MED_RATE && !(o->rate > 0.0))) continue;
        v[m++] = what == MED_RATE ? o->rate : what == MED_STEPS ? o->steps : o->norm;
    }
    if (learners) *learners = m;
    if (m == 0) return 0.0;
    qsort(v, (size_t)m, sizeof *v, cmp_double);
    int k = m / 2;
    return m % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

static double hist_median(const dl_guard *g, const hist *h, int *learners)
{
    return hist_median_of(g, h, MED_NORM, learners);
}

double dl_guard_median(const dl_guard *g, int p, int *count)
{
    assert(p >= 0 && p < g->P);
    if (count) *count = g->h[p].n;
    return hist_median(g, &g->h[p], NULL);
}

/* The steps a push's bound grows with: its own (at least 1), but at most
 * norm_k x what the median learner makes in a push (its latest steps) -- or,
 * when more, in the time this push's learner had since its base (elapsed_s x
 * the median step rate), up to norm_k times that again. So a push that
 * trained through an outage of up to ~norm_k^2 push periods is judged on its
 * own steps (before the time term, a 5 s cut of a fleet of fast learners
 * carried 5 x the cap of 10 x H steps, and its norm, grown like a drift, was
 * refused), and claiming more steps than it made buys a liar at most
 * sqrt(norm_k) times the bound an honest learner gets for the same time, and
 * at most norm_k times the bound of its honest steps however long it waits. */
static double bound_steps(const dl_guard *g, const hist *h, uint64_t steps, double elapsed_s)
{
    double st = steps ? (double)steps : 1.0;
    double cap = g->cfg.norm_k * hist_median_of(g, h, MED_STEPS, NULL);
    if (elapsed_s > 0.0 && isfinite(elapsed_s)) {
        double by_time = g->cfg.norm_k * hist_median_of(g, h, MED_RATE, NULL) * elapsed_s;
        if (by_time > g->cfg.norm_k * cap) by_time = g->cfg.norm_k * cap;
        if (by_time > cap) cap = by_time;
    }
    return cap >= 1.0 && st > cap ? cap : st;
}

int dl_guard_value(const dl_guard *g, int p, double norm, uint64_t steps, double elapsed_s, double param_norm,
                   double *scale, char *why, size_t cap)
{
    assert(p >= 0 && p < g->P && scale && !(norm < 0.0));
    const dl_guard_cfg *c = &g->cfg;
    const hist *h = &g->h[p];
    *scale = 0.0;
    if (!isfinite(norm)) {
        say(why, cap, "norm %g is not finite", norm);
        return DL_GUARD_REJECTED;
    }
    double bound = INFINITY, med = 0.0, st = 1.0;
    int rule = 0, learners = 0; /* rule 1: median, 2: parameter ratio */
    if (c->norm_k > 0.0 && h->n >= c->norm_min_history) {
        med = hist_median(g, h, &learners);
        st = bound_steps(g, h, steps, elapsed_s);
        bound = c->norm_k * med * sqrt(st);
        rule = 1;
    }
    if (c->norm_param_ratio > 0.0 && isfinite(param_norm) && param_norm > 0.0 &&
        c->norm_param_ratio * param_norm < bound) {
        bound = c->norm_param_ratio * param_norm;
        rule = 2;
    }
    if (norm <= bound) {
        *scale = 1.0;
        return DL_GUARD_OK;
    }
    char r[200];
    if (rule == 1)
        snprintf(r, sizeof r, "norm %.3g > %g x median %.3g of %d learner(s)' latest pushes (per sqrt(step), x sqrt(%.0f "
                 "steps))", norm, c->norm_k, med * sqrt(st), learners, st);
    else
        snprintf(r, sizeof r, "norm %.3g > %g x parameter norm %.3g", norm, c->norm_param_ratio, param_norm);
    /* the bound is positive (remembered norms are > 0, param_norm > 0), so
     * bound / norm is in (0, 1); it rounds to 0 only for a norm ~1e308 times
     * the bound, which is no delta worth keeping */
    double s = bound / norm;
    if (c->norm_action == DL_GUARD_CLIP && s > 0.0) {
        *scale = s < 1.0 ? s : nextafter(1.0, 0.0);
        say(why, cap, "%s: clipped to %.3g (x %.3g)", r, bound, *scale);
        return DL_GUARD_CLIPPED;
    }
    say(why, cap, "%s", r);
    return DL_GUARD_REJECTED;
}

void dl_guard_observe(dl_guard *g, int p, int slot, double norm, uint64_t steps, double elapsed_s)
{
    assert(p >= 0 && p < g->P && slot >= 0 && slot < g->L && isfinite(norm) && norm >= 0.0);
    if (norm == 0.0) return;
    hist *h = &g->h[p];
    double st = steps ? (double)steps : 1.0;
    norm /= sqrt(st); /* remembered per sqrt(step): pushes of any length compare */
    /* remembered at most at the median bound: one push (or one learner)
     * moves the median by at most norm_k */
    if (g->cfg.norm_k > 0.0 && h->n >= g->cfg.norm_min_history) {
        double cap = g->cfg.norm_k * hist_median(g, h, NULL);
        if (norm > cap) norm = cap;
    }
    /* one record per learner: its previous one leaves the ring, so a learner
     * pushing often cannot evict the others' votes */
    for (int i = 0; i < h->n; i++) {
        int k = ((h->pos - h->n + i) % g->cap + g->cap) % g->cap;
        if (h->ring[k].slot != slot) continue;
        for (int j = i; j + 1 < h->n; j++) { /* close the gap, oldest first */
            int a = ((h->pos - h->n + j) % g->cap + g->cap) % g->cap, b = (a + 1) % g->cap;
            h->ring[a] = h->ring[b];
        }
        h->n--;
        h->pos = (h->pos - 1 + g->cap) % g->cap;
        break;
    }
    double rate = elapsed_s > 0.0 && isfinite(elapsed_s) ? st / elapsed_s : 0.0;
    h->ring[h->pos] = (obs){norm, st, rate, slot};
    h->pos = (h->pos + 1) % g->cap;
    if (h->n < g->cap) h->n++;
}

/* ---------------------------------------------------------------- replays */

int dl_guard_replay(const dl_guard *g, int slot, int p, uint64_t base, char *why, size_t cap)
{
    assert(slot >= 0 && slot < g->L && p >= 0 && p < g->P);
    const uint64_t *nx = g->next[slot];
    if (!nx || base >= nx[p]) return 0;
    say(why, cap, "base version %llu of fragment %d is not newer than %llu, already merged from this learner",
        (unsigned long long)base, p, (unsigned long long)(nx[p] - 1));
    return 1;
}

void dl_guard_applied(dl_guard *g, int slot, int p, uint64_t base)
{
    assert(slot >= 0 && slot < g->L && p >= 0 && p < g->P && base < UINT64_MAX);
    if (!g->next[slot]) g->next[slot] = dl_xcalloc((size_t)g->P, sizeof(uint64_t));
    if (base + 1 > g->next[slot][p]) g->next[slot][p] = base + 1;
}

void dl_guard_forget(dl_guard *g, int slot)
{
    assert(slot >= 0 && slot < g->L);
    free(g->next[slot]);
    g->next[slot] = NULL;
}

/* ---------------------------------------------------------------- parameters */

int dl_guard_params_max(double param_abs_max, int p, const float *x, size_t n, char *why, size_t cap)
{
    assert((x || n == 0) && param_abs_max >= 0.0);
    /* one compare catches nan (false), inf (> FLT_MAX) and too big */
    double lim = param_abs_max > 0.0 && param_abs_max < FLT_MAX ? param_abs_max : FLT_MAX;
    int ok = 1;
#pragma omp parallel for simd reduction(& : ok) schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) ok &= (double)fabsf(x[i]) <= lim;
    if (ok) return 0;
    size_t i = 0;
    while ((double)fabsf(x[i]) <= lim) i++; /* the first offender exists */
    if (!isfinite(x[i]))
        return refuse(DL_ECORRUPT, why, cap, "parameter %zu of fragment %d is %s", i, p,
                      isnan(x[i]) ? "nan" : x[i] > 0 ? "inf" : "-inf");
    return refuse(DL_ECORRUPT, why, cap, "parameter %zu of fragment %d is %.3g %sparam_abs_max %g", i, p,
                  (double)x[i], x[i] > 0 ? "> " : "< -", param_abs_max);
}

int dl_guard_params_scan(double param_abs_max, int p, const float *x, size_t n, size_t block, double *norm,
                         uint64_t *hash, uint64_t *sums, char *why, size_t cap)
{
    assert((x || n == 0) && block > 0 && norm && hash && sums);
    double lim = param_abs_max > 0.0 && param_abs_max < FLT_MAX ? param_abs_max : FLT_MAX;
    dl_checksum_state *st = dl_checksum_begin();
    double ss = 0.0;
    for (size_t b = 0, lo = 0; lo < n; b++, lo += block) {
        size_t len = n - lo < block ? n - lo : block;
        const float *y = x + lo;
        int ok = 1;
        double s = 0.0;
#pragma omp simd reduction(& : ok) reduction(+ : s)
        for (size_t i = 0; i < len; i++) {
            ok &= (double)fabsf(y[i]) <= lim;
            s += (double)y[i] * (double)y[i];
        }
        if (!ok) {
            dl_checksum_end(st);
            return dl_guard_params_max(param_abs_max, p, x, n, why, cap); /* finds the first offender */
        }
        ss += s;
        sums[b] = dl_checksum64(y, len * sizeof(float));
        dl_checksum_update(st, y, len * sizeof(float));
    }
    *hash = dl_checksum_end(st);
    *norm = sqrt(ss);
    return 0;
}

int dl_guard_params(const dl_guard *g, int p, const float *x, size_t n, char *why, size_t cap)
{
    assert(p >= 0 && p < g->P);
    return dl_guard_params_max(g->cfg.param_abs_max, p, x, n, why, cap);
}
