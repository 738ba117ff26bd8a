/* Seeded arrival schedules of dloco-loadgen (chaos/loadsched.h). */
#include "chaos/loadsched.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/rng.h"

struct dl_loadsched {
    dl_loadsched_cfg c;
    double phase;        /* bursty */
    double *bs, *be, *bx; /* aperiodic bursts: start, end, rate factor */
    int nb;
    double *t;
    int64_t n;
};

static const char *const names[] = {"steady", "bursty", "aperiodic"};

int dl_loadsched_parse(const char *s, dl_load_regime *out)
{
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, names[i])) {
            *out = (dl_load_regime)i;
            return 0;
        }
    return dl_err(DL_EINVAL, "regime '%s' is not steady, bursty or aperiodic", s ? s : "(null)");
}

const char *dl_loadsched_name(dl_load_regime r) { return (unsigned)r < 3 ? names[r] : "?"; }

/* uniform (0, 1]: never 0, so log() is finite */
static double unit(dl_rng *r) { return ((double)(dl_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0); }

double dl_loadsched_rate(const dl_loadsched *s, double t)
{
    const dl_loadsched_cfg *c = &s->c;
    switch (c->regime) {
    case DL_LOAD_BURSTY: {
        double x = fmod(t - s->phase + 1000.0 * c->period_s, c->period_s);
        return x < c->duty * c->period_s ? c->burst_x * c->rate : c->rate;
    }
    case DL_LOAD_APERIODIC:
        for (int i = 0; i < s->nb; i++)
            if (t >= s->bs[i] && t < s->be[i]) return s->bx[i] * c->rate;
        return c->rate;
    default: return c->rate;
    }
}

int dl_loadsched_open(const dl_loadsched_cfg *c, dl_loadsched **out)
{
    assert(c && out);
    *out = NULL;
    if ((unsigned)c->regime > 2) return dl_err(DL_EINVAL, "loadsched: unknown regime %d", c->regime);
    if (!(c->rate > 0 && c->rate <= 1e5)) return dl_err(DL_EINVAL, "loadsched: rate %g outside (0, 1e5]", c->rate);
    if (!(c->burst_x >= 1 && c->burst_x <= 100)) return dl_err(DL_EINVAL, "loadsched: burst_x %g outside [1, 100]", c->burst_x);
    if (!(c->period_s >= 0.1 && c->period_s <= 3600))
        return dl_err(DL_EINVAL, "loadsched: period_s %g outside [0.1, 3600]", c->period_s);
    if (!(c->duty > 0 && c->duty < 1)) return dl_err(DL_EINVAL, "loadsched: duty %g outside (0, 1)", c->duty);
    if (!(c->duration_s > 0 && c->duration_s <= 86400))
        return dl_err(DL_EINVAL, "loadsched: duration_s %g outside (0, 86400]", c->duration_s);
    double peak = c->regime == DL_LOAD_STEADY ? c->rate : c->rate * c->burst_x * (c->regime == DL_LOAD_APERIODIC ? 1.5 : 1.0);
    if (peak * c->duration_s > 1e7) return dl_err(DL_EINVAL, "loadsched: more than 1e7 arrivals (rate x duration)");
    dl_loadsched *s = dl_xcalloc(1, sizeof *s);
    s->c = *c;
    dl_rng r;
    dl_rng_seed(&r, c->seed ^ 0x6c6f616467656e00ull);
    if (c->regime == DL_LOAD_BURSTY) s->phase = unit(&r) * c->period_s;
    if (c->regime == DL_LOAD_APERIODIC) {
        int cap = 16;
        s->bs = dl_xcalloc((size_t)cap, sizeof *s->bs);
        s->be = dl_xcalloc((size_t)cap, sizeof *s->be);
        s->bx = dl_xcalloc((size_t)cap, sizeof *s->bx);
        for (double t = -log(unit(&r)) * c->period_s; t < c->duration_s;) {
            if (s->nb == cap) {
                cap *= 2;
                s->bs = dl_xrealloc(s->bs, (size_t)cap * sizeof *s->bs);
                s->be = dl_xrealloc(s->be, (size_t)cap * sizeof *s->be);
                s->bx = dl_xrealloc(s->bx, (size_t)cap * sizeof *s->bx);
            }
            double len = c->duty * c->period_s * (0.5 + unit(&r));
            s->bs[s->nb] = t;
            s->be[s->nb] = t + len;
            s->bx[s->nb] = c->burst_x * (0.5 + unit(&r));
            if (s->bx[s->nb] < 1) s->bx[s->nb] = 1;
            s->nb++;
            t += len - log(unit(&r)) * c->period_s;
        }
    }
    size_t cap = 1024;
    s->t = dl_xcalloc(cap, sizeof *s->t);
    for (double t = 0;;) {
        t += -log(unit(&r)) / peak;
        if (t >= c->duration_s) break;
        double keep = dl_loadsched_rate(s, t) / peak;
        if (unit(&r) > keep) continue;
        if ((size_t)s->n == cap) s->t = dl_xrealloc(s->t, (cap *= 2) * sizeof *s->t);
        s->t[s->n++] = t;
    }
    *out = s;
    return 0;
}

void dl_loadsched_close(dl_loadsched **sp)
{
    if (!sp || !*sp) return;
    dl_loadsched *s = *sp;
    free(s->bs), free(s->be), free(s->bx), free(s->t);
    free(s);
    *sp = NULL;
}

const double *dl_loadsched_times(const dl_loadsched *s, int64_t *n)
{
    *n = s->n;
    return s->t;
}
