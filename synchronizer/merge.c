/* Round merge: per span of the fragment (a tensor or a row block of one), the configured averaging of
 * the contributions (or a robust coordinate-wise aggregate of the whole fragment), then one outer Nesterov
 * step over the whole fragment. */
#include "synchronizer/merge.h"

#include "core/err.h"
#include "kernels/outer.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int dl_merge_rule_parse(const char *name, dl_merge_rule *out)
{
    if (!strcmp(name, "rda")) *out = DL_MERGE_RULE_RDA;
    else if (!strcmp(name, "mean")) *out = DL_MERGE_RULE_MEAN;
    else return dl_err(DL_EINVAL, "merge rule '%s' is not rda or mean", name);
    return 0;
}

static const char *const agg_names[] = {"weighted", "trimmed_mean", "median"};

const char *dl_merge_aggregate_name(dl_merge_aggregate a)
{
    return (unsigned)a < 3 ? agg_names[a] : "?";
}

int dl_merge_aggregate_parse(const char *name, dl_merge_aggregate *out)
{
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, agg_names[i])) return *out = (dl_merge_aggregate)i, 0;
    return dl_err(DL_EINVAL, "merge aggregate '%s' is not weighted, trimmed_mean or median", name ? name : "(null)");
}

int dl_merge_opts_check(const dl_merge_opts *o)
{
    if (o->rule != DL_MERGE_RULE_RDA && o->rule != DL_MERGE_RULE_MEAN)
        return dl_err(DL_EINVAL, "merge rule %d is not rda (0) or mean (1)", (int)o->rule);
    if ((unsigned)o->aggregate > DL_MERGE_AGG_MEDIAN)
        return dl_err(DL_EINVAL, "merge aggregate %d is not weighted (0), trimmed_mean (1) or median (2)",
                      (int)o->aggregate);
    if (!(o->trim >= 0.0 && o->trim < 0.5)) return dl_err(DL_EINVAL, "merge trim %g outside [0, 0.5)", o->trim);
    if (!(o->clip_norm >= 0.0 && isfinite(o->clip_norm)))
        return dl_err(DL_EINVAL, "merge clip_norm %g must be finite and >= 0 (0 = off)", o->clip_norm);
    return 0;
}

int dl_merge_trim_count(double trim, int m)
{
    assert(trim >= 0.0 && trim < 0.5 && m >= 1);
    if (m < 3) return 0;
    int k = (int)floor(trim * m + 1e-9);
    return 2 * k < m ? k : (m - 1) / 2;
}

int dl_merge_finite(const float *x, size_t n)
{
    int ok = 1;
#pragma omp parallel for simd reduction(& : ok) schedule(static)
    for (size_t i = 0; i < n; i++) ok &= isfinite(x[i]) ? 1 : 0;
    return ok;
}

double dl_merge_apply(const dl_plan *plan, int p, const dl_merge_opts *o, float *const *deltas, const double *w,
                      int m, double scale, float *merged, float *params, float *momentum)
{
    return dl_merge_apply_to(plan, p, o, deltas, w, NULL, m, scale, merged, params, momentum, params, momentum);
}

double dl_merge_apply_to(const dl_plan *plan, int p, const dl_merge_opts *o, float *const *deltas, const double *w,
                         const double *const *span_ss, int m, double scale, float *merged, const float *params,
                         const float *momentum, float *params_out, float *momentum_out)
{
    size_t n = dl_plan_fragment_numel(plan, p);
    if (o->clip_norm > 0) {
        for (int i = 0; i < m; i++) dl_cpu_clip_norm(deltas[i], n, o->clip_norm);
        span_ss = NULL; /* the deltas changed */
    }
    const float *x[m > 0 ? m : 1];
    double ss[m > 0 ? m : 1];
    if (o->aggregate == DL_MERGE_AGG_WEIGHTED) {
        int ns = 0;
        const dl_plan_span *sp = dl_plan_fragment_spans(plan, p, &ns);
        /* A span is a block (core/plan.h): RDA's norms are the block's; the
         * weighted mean is element-wise, so blocks change nothing there. */
        for (int s = 0; s < ns; s++) {
            for (int i = 0; i < m; i++) {
                x[i] = deltas[i] + sp[s].offset;
                if (span_ss) ss[i] = span_ss[i][s];
            }
            if (o->rule == DL_MERGE_RULE_MEAN || sp[s].kind == DL_TENSOR_EMBED)
                dl_cpu_weighted_mean(merged + sp[s].offset, x, w, m, sp[s].numel);
            else
                dl_cpu_rda_sumsq(merged + sp[s].offset, x, w, span_ss ? ss : NULL, m, sp[s].numel);
        }
    } else {
        /* coordinate-wise over the whole fragment; weights ignored (merge.h) */
        assert(m >= 1 && o->trim >= 0.0 && o->trim < 0.5);
        for (int i = 0; i < m; i++) x[i] = deltas[i];
        int k = o->aggregate == DL_MERGE_AGG_MEDIAN ? (m - 1) / 2 : dl_merge_trim_count(o->trim, m);
        if (m < 3 || k == 0) {
            /* nothing to trim: the unweighted mean, without the per-coordinate sort */
            double *u = dl_xmalloc((size_t)m * sizeof *u);
            for (int i = 0; i < m; i++) u[i] = 1.0;
            dl_cpu_weighted_mean(merged, x, u, m, n);
            free(u);
        } else if (o->aggregate == DL_MERGE_AGG_MEDIAN) {
            dl_cpu_median(merged, x, m, n);
        } else {
            dl_cpu_trimmed_mean(merged, x, m, n, k);
        }
    }
    /* scale, norm and the outer step in one pass (out of place: no copy of the global into scratch first) */
    return dl_cpu_nesterov_to(params_out, momentum_out, params, momentum, merged, n, o->outer_lr, o->outer_momentum,
                              (float)scale);
}
