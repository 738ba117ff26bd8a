/* The synchronizer's round merge (synchronizer/merge.c): embedding spans get
 * the weighted mean, other spans RDA per tensor, then one Nesterov step —
 * checked against values computed here in double precision. */
#include "core/plan.h"
#include "kernels/outer.h"
#include "synchronizer/merge.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/check.h"

int main(void)
{
    /* one fragment holding an embedding (2 floats) and a matrix (2x1) */
    dl_tensor t[2];
    memset(t, 0, sizeof t);
    snprintf(t[0].name, sizeof t[0].name, "wte");
    t[0].offset = 0; t[0].numel = 2; t[0].ndim = 2; t[0].shape[0] = 1; t[0].shape[1] = 2; t[0].kind = DL_TENSOR_EMBED;
    snprintf(t[1].name, sizeof t[1].name, "w");
    t[1].offset = 2; t[1].numel = 2; t[1].ndim = 2; t[1].shape[0] = 2; t[1].shape[1] = 1; t[1].kind = DL_TENSOR_MATRIX;
    dl_plan *plan = NULL;
    if (dl_plan_build(t, 2, 1, &plan)) {
        printf("FAIL: plan\n");
        return 1;
    }
    /* learner A: embed (1, 0), matrix (3, 4) weight 1; learner B: embed (0, 1), matrix (0, 2) weight 3 */
    float a[4] = {1, 0, 3, 4}, b[4] = {0, 1, 0, 2};
    float *d[2] = {a, b};
    double w[2] = {1, 3};
    float merged[4], params[4] = {10, 10, 10, 10}, mom[4] = {0, 0, 0, 0};
    dl_merge_opts o = {.rule = DL_MERGE_RULE_RDA, .outer_lr = 0.7f, .outer_momentum = 0.9f, .clip_norm = 0};
    double norm = dl_merge_apply(plan, 0, &o, d, w, 2, 1.0, merged, params, mom);
    /* embedding: weighted mean (0.25, 0.75) */
    CHECK(fabs(merged[0] - 0.25) < 1e-6 && fabs(merged[1] - 0.75) < 1e-6, "embed mean %g %g", merged[0], merged[1]);
    /* matrix: RDA. radius (1*5 + 3*2)/4 = 2.75; direction unit((1*(0.6,0.8) + 3*(0,1))/4) */
    double dx = 0.6 / 4, dy = (0.8 + 3.0) / 4, dn = sqrt(dx * dx + dy * dy);
    double ex = 2.75 * dx / dn, ey = 2.75 * dy / dn;
    CHECK(fabs(merged[2] - ex) < 1e-5 && fabs(merged[3] - ey) < 1e-5, "rda %g %g, expected %g %g", merged[2],
          merged[3], ex, ey);
    double en = sqrt(0.25 * 0.25 + 0.75 * 0.75 + ex * ex + ey * ey);
    CHECK(fabs(norm - en) < 1e-5, "merged norm %g expected %g", norm, en);
    /* Nesterov from zero momentum: mom = g, param -= lr * (g + mu*g) = 10 - 0.7*1.9*g */
    for (int i = 0; i < 4; i++) {
        double g = merged[i];
        CHECK(fabs(mom[i] - g) < 1e-6, "momentum[%d]", i);
        CHECK(fabs(params[i] - (10 - 0.7 * 1.9 * g)) < 1e-5, "param[%d] %g expected %g", i, params[i], 10 - 1.33 * g);
    }
    printf("merge: embed (%.3f, %.3f), rda (%.4f, %.4f), |delta| %.4f, params (%.4f %.4f %.4f %.4f)\n", merged[0],
           merged[1], merged[2], merged[3], norm, params[0], params[1], params[2], params[3]);

    /* the mean rule averages the matrix too */
    float p2[4] = {0}, m2[4] = {0};
    o.rule = DL_MERGE_RULE_MEAN;
    dl_merge_apply(plan, 0, &o, d, w, 2, 1.0, merged, p2, m2);
    CHECK(fabs(merged[2] - 0.75) < 1e-6 && fabs(merged[3] - 2.5) < 1e-6, "mean rule %g %g", merged[2], merged[3]);

    /* clipping bounds each contribution before the merge */
    float c1[4] = {0, 0, 30, 40}, c2[4] = {0, 0, 30, 40};
    float *dc[2] = {c1, c2};
    o.rule = DL_MERGE_RULE_RDA;
    o.clip_norm = 5;
    dl_merge_apply(plan, 0, &o, dc, w, 2, 1.0, merged, p2, m2);
    CHECK(fabs(merged[2] - 3) < 1e-5 && fabs(merged[3] - 4) < 1e-5, "clipped %g %g", merged[2], merged[3]);

    float bad[2] = {1, NAN};
    CHECK(!dl_merge_finite(bad, 2) && dl_merge_finite(a, 4), "finite check");
    dl_merge_rule r;
    CHECK(dl_merge_rule_parse("median", &r) != 0, "unknown merge rule refused");
    dl_plan_close(&plan);
    printf("%s\n", failures ? "test_merge: FAILED" : "test_merge: all checks passed");
    return failures ? 1 : 0;
}
