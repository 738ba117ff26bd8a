/* Round merge: per tensor span of the fragment, the configured averaging of
 * the contributions, then one outer Nesterov step over the whole fragment. */
#include "synchronizer/merge.h"

#include "core/err.h"
#include "kernels/outer.h"

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
    size_t n = dl_plan_fragment_numel(plan, p);
    if (o->clip_norm > 0)
        for (int i = 0; i < m; i++) dl_cpu_clip_norm(deltas[i], n, o->clip_norm);
    int ns = 0;
    const dl_plan_span *sp = dl_plan_fragment_spans(plan, p, &ns);
    const float *x[m > 0 ? m : 1];
    for (int s = 0; s < ns; s++) {
        for (int i = 0; i < m; i++) x[i] = deltas[i] + sp[s].offset;
        if (o->rule == DL_MERGE_RULE_MEAN || sp[s].kind == DL_TENSOR_EMBED)
            dl_cpu_weighted_mean(merged + sp[s].offset, x, w, m, sp[s].numel);
        else
            dl_cpu_rda(merged + sp[s].offset, x, w, m, sp[s].numel);
    }
    if (scale != 1.0) {
        float sc = (float)scale;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) merged[i] *= sc;
    }
    double norm = dl_cpu_norm2(merged, n);
    dl_cpu_nesterov(params, momentum, merged, n, o->outer_lr, o->outer_momentum);
    return norm;
}
