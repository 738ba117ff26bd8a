/* The synchronizer's round merge (synchronizer/merge.c): embedding spans get
 * the weighted mean, other spans RDA per tensor (per block of a split one), then one Nesterov step —
 * checked against values computed here in double precision; and the robust
 * aggregators, which keep one hostile contribution out of the merge. */
#include "core/err.h"
#include "core/plan.h"
#include "kernels/outer.h"
#include "synchronizer/merge.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/check.h"

/* Three honest learners near (1, 2, -1, 0.5) and one hostile one (4 floats:
 * the embedding and the matrix of the plan in main). Merged with outer lr 1,
 * momentum 0 and scale 0.5 from zero params, so params = -0.5 x merged. */
static void merge_four(const dl_plan *plan, dl_merge_aggregate agg, float hostile, const double *w, float *merged,
                       float *params, double *norm)
{
    float d[4][4] = {{1.0f, 2.0f, -1.0f, 0.5f}, {1.1f, 1.9f, -0.9f, 0.6f}, {0.9f, 2.1f, -1.1f, 0.4f}, {0}};
    for (int j = 0; j < 4; j++) d[3][j] = hostile * d[0][j];
    float *dp[4] = {d[0], d[1], d[2], d[3]};
    float mom[4] = {0};
    memset(params, 0, 4 * sizeof *params);
    dl_merge_opts o = {.rule = DL_MERGE_RULE_RDA, .outer_lr = 1.0f, .outer_momentum = 0.0f, .aggregate = agg,
                       .trim = DL_MERGE_TRIM_DEFAULT};
    *norm = dl_merge_apply(plan, 0, &o, dp, w, 4, 0.5, merged, params, mom);
    for (int j = 0; j < 4; j++) CHECK_NEAR(mom[j], merged[j], 0);
}

static void test_robust(const dl_plan *plan)
{
    const double clean[4] = {1.0, 2.0, -1.0, 0.5}; /* mean of the three honest ones */
    const double w1[4] = {1, 1, 1, 1}, wbig[4] = {1, 1, 1, 1000};
    const float hostile[2] = {100.0f, -100.0f}; /* 100x scaled, and sign-flipped */
    float merged[4], params[4], m2[4], p2[4];
    double norm, norm2;
    for (int h = 0; h < 2; h++) {
        /* weighted (today's rule): the hostile contribution drags the merge far off */
        merge_four(plan, DL_MERGE_AGG_WEIGHTED, hostile[h], w1, merged, params, &norm);
        double err = 0;
        for (int j = 0; j < 4; j++) err = fmax(err, fabs(2.0 * merged[j] - clean[j])); /* scale 0.5 */
        CHECK(err > 10, "weighted merge with a %gx contribution is off by %g only", hostile[h], err);
        for (int a = DL_MERGE_AGG_TRIMMED_MEAN; a <= DL_MERGE_AGG_MEDIAN; a++) {
            merge_four(plan, (dl_merge_aggregate)a, hostile[h], w1, merged, params, &norm);
            double n2 = 0;
            for (int j = 0; j < 4; j++) {
                /* per coordinate: drop the hostile value and one honest extreme,
                 * mean of the middle two; within 0.05 of the clean mean */
                CHECK_NEAR(2.0 * merged[j], clean[j], 0.051);
                CHECK_NEAR(params[j], -merged[j], 0); /* outer step with lr 1, mu 0 */
                n2 += (double)merged[j] * merged[j];
            }
            CHECK_NEAR(norm, sqrt(n2), 1e-6);
            /* token weights are ignored: a 1000x weight claim changes nothing */
            merge_four(plan, (dl_merge_aggregate)a, hostile[h], wbig, m2, p2, &norm2);
            CHECK(!memcmp(m2, merged, sizeof m2) && norm2 == norm, "%s depends on the weights",
                  dl_merge_aggregate_name((dl_merge_aggregate)a));
        }
    }
    /* the exact values for +100x: coordinate 0 holds 0.9, 1.0, 1.1, 100 -> (1.0 + 1.1) / 2 */
    merge_four(plan, DL_MERGE_AGG_MEDIAN, 100.0f, w1, merged, params, &norm);
    CHECK_NEAR(merged[0], 0.5 * 1.05, 1e-6);
    CHECK_NEAR(merged[2], 0.5 * -1.05, 1e-6); /* -100, -1.1, -1.0, -0.9 */

    /* m < 3: the unweighted mean, whatever the weights */
    float a[4] = {1, 0, 3, 4}, b[4] = {0, 1, 0, 2};
    float *d[2] = {a, b};
    double w[2] = {1, 3};
    for (int ag = DL_MERGE_AGG_TRIMMED_MEAN; ag <= DL_MERGE_AGG_MEDIAN; ag++) {
        dl_merge_opts o = {.outer_lr = 1.0f, .outer_momentum = 0.0f, .aggregate = (dl_merge_aggregate)ag,
                           .trim = 0.49};
        float pz[4] = {0}, mz[4] = {0};
        dl_merge_apply(plan, 0, &o, d, w, 2, 1.0, merged, pz, mz);
        for (int j = 0; j < 4; j++) CHECK_NEAR(merged[j], 0.5 * (a[j] + b[j]), 1e-7);
        memset(pz, 0, sizeof pz);
        memset(mz, 0, sizeof mz);
        dl_merge_apply(plan, 0, &o, d, w, 1, 1.0, merged, pz, mz);
        for (int j = 0; j < 4; j++) CHECK_NEAR(merged[j], a[j], 0);
    }

    /* m = 5 with trim 0.4 trims 2 per side: the median */
    float e[5][4];
    float *ep[5];
    double w5[5] = {1, 1, 1, 1, 1};
    for (int i = 0; i < 5; i++) {
        for (int j = 0; j < 4; j++) e[i][j] = (float)((i * 7 + j * 3) % 5) - (i == 4 ? 1000.0f : 0.0f);
        ep[i] = e[i];
    }
    dl_merge_opts ot = {.outer_lr = 1.0f, .aggregate = DL_MERGE_AGG_TRIMMED_MEAN, .trim = 0.4};
    dl_merge_opts om = {.outer_lr = 1.0f, .aggregate = DL_MERGE_AGG_MEDIAN, .trim = 0.4};
    float pz[4] = {0}, mz[4] = {0};
    dl_merge_apply(plan, 0, &ot, ep, w5, 5, 1.0, merged, pz, mz);
    memset(pz, 0, sizeof pz);
    memset(mz, 0, sizeof mz);
    dl_merge_apply(plan, 0, &om, ep, w5, 5, 1.0, m2, pz, mz);
    CHECK(!memcmp(merged, m2, sizeof m2), "trim 0.4 of 5 is the median");

    /* trim counts */
    CHECK_EQ(dl_merge_trim_count(0.25, 4), 1);
    CHECK_EQ(dl_merge_trim_count(0.25, 3), 0);
    CHECK_EQ(dl_merge_trim_count(0.25, 2), 0);
    CHECK_EQ(dl_merge_trim_count(0.49, 2), 0);
    CHECK_EQ(dl_merge_trim_count(0.49, 3), 1);
    CHECK_EQ(dl_merge_trim_count(0.4, 5), 2);
    CHECK_EQ(dl_merge_trim_count(0.29, 100), 29);
    CHECK_EQ(dl_merge_trim_count(0.499, 1000), 499);
    CHECK_EQ(dl_merge_trim_count(0.0, 1000), 0);
}

static void test_names(void)
{
    dl_merge_aggregate a = DL_MERGE_AGG_MEDIAN;
    CHECK(dl_merge_aggregate_parse("weighted", &a) == 0 && a == DL_MERGE_AGG_WEIGHTED, "parse weighted");
    CHECK(dl_merge_aggregate_parse("trimmed_mean", &a) == 0 && a == DL_MERGE_AGG_TRIMMED_MEAN, "parse trimmed_mean");
    CHECK(dl_merge_aggregate_parse("median", &a) == 0 && a == DL_MERGE_AGG_MEDIAN, "parse median");
    const char *bad[] = {"trimmed-mean", "Median", "", "mean", "rda", "median "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        a = DL_MERGE_AGG_MEDIAN;
        CHECK(dl_merge_aggregate_parse(bad[i], &a) == DL_EINVAL && a == DL_MERGE_AGG_MEDIAN, "'%s' refused", bad[i]);
    }
    CHECK(dl_merge_aggregate_parse(NULL, &a) == DL_EINVAL, "NULL refused");
    CHECK(strstr(dl_errmsg(), "trimmed_mean") != NULL, "the valid names are listed: %s", dl_errmsg());
    for (int i = 0; i < 3; i++) {
        CHECK(dl_merge_aggregate_parse(dl_merge_aggregate_name((dl_merge_aggregate)i), &a) == 0 && (int)a == i,
              "name %d round-trips", i);
    }
    CHECK_STR(dl_merge_aggregate_name((dl_merge_aggregate)9), "?");

    dl_merge_opts o = {.outer_lr = 0.7f, .outer_momentum = 0.9f, .trim = DL_MERGE_TRIM_DEFAULT};
    CHECK_EQ(dl_merge_opts_check(&o), 0);
    struct {
        const char *field;
        dl_merge_opts o;
    } refused[7];
    int nr = 0;
#define REFUSE(f, v) (refused[nr].field = #f, refused[nr].o = o, refused[nr].o.f = (v), nr++)
    REFUSE(trim, 0.5);
    REFUSE(trim, -0.1);
    REFUSE(trim, NAN);
    REFUSE(aggregate, (dl_merge_aggregate)3);
    REFUSE(rule, (dl_merge_rule)2);
    REFUSE(clip_norm, -1.0);
    REFUSE(clip_norm, INFINITY);
#undef REFUSE
    for (int i = 0; i < nr; i++) {
        CHECK(dl_merge_opts_check(&refused[i].o) == DL_EINVAL, "opts with bad %s accepted", refused[i].field);
        CHECK(strstr(dl_errmsg(), refused[i].field) != NULL, "'%s' does not name %s", dl_errmsg(), refused[i].field);
    }
}

/* A matrix the plan splits: w [4, 1] (above the target 3 of P = 2) and a
 * vector b [1]. Whole tensors would give 4 / 1; the split gives f0 = b +
 * w rows [0, 2), f1 = w rows [2, 4). RDA then runs per block (core/plan.h):
 * fragment 1 alone, with the norms of its two rows, is exactly the RDA of
 * those rows, whatever fragment 0 holds. */
static void test_split_matrix(void)
{
    dl_tensor t[2];
    memset(t, 0, sizeof t);
    snprintf(t[0].name, sizeof t[0].name, "w");
    t[0].offset = 0; t[0].numel = 4; t[0].ndim = 2; t[0].shape[0] = 4; t[0].shape[1] = 1; t[0].kind = DL_TENSOR_MATRIX;
    snprintf(t[1].name, sizeof t[1].name, "b");
    t[1].offset = 4; t[1].numel = 1; t[1].ndim = 1; t[1].shape[0] = 1; t[1].kind = DL_TENSOR_VECTOR;
    dl_plan *plan = NULL;
    REQUIRE(dl_plan_build(t, 2, 2, &plan) == 0, "%s", dl_errmsg());
    int ns = 0;
    const dl_plan_span *sp = dl_plan_fragment_spans(plan, 1, &ns);
    REQUIRE(dl_plan_tensor_nblocks(plan, 0) == 2 && ns == 1 && sp[0].tensor == 0 && sp[0].start == 2 &&
                sp[0].numel == 2 && dl_plan_fragment_numel(plan, 0) == 3,
            "w split as rows [0, 2) + b | rows [2, 4): %d blocks, f1 %d spans", dl_plan_tensor_nblocks(plan, 0), ns);
    /* learner A: rows 2..3 of w = (3, 4), weight 1; B: (0, 2), weight 3 */
    float a[2] = {3, 4}, b[2] = {0, 2}, merged[2], params[2] = {0, 0}, mom[2] = {0, 0}, want[2];
    float *d[2] = {a, b};
    const float *x[2] = {a, b};
    double w[2] = {1, 3};
    dl_merge_opts o = {.rule = DL_MERGE_RULE_RDA, .outer_lr = 1.0f, .outer_momentum = 0.0f};
    dl_cpu_rda(want, x, w, 2, 2);
    dl_merge_apply(plan, 1, &o, d, w, 2, 1.0, merged, params, mom);
    CHECK(merged[0] == want[0] && merged[1] == want[1], "fragment 1: (%g, %g), RDA of the block (%g, %g)", merged[0],
          merged[1], want[0], want[1]);
    printf("split matrix: fragment 1 = rows [2, 4) of w, merged (%.4f, %.4f) = RDA of the block\n", merged[0],
           merged[1]);
    dl_plan_close(&plan);
}

/* The out-of-place merge (the worker's: no copy of the global into scratch
 * first) gives the in-place one's values bit for bit and leaves its inputs
 * as they were; momentum 0.9 and lr 0.7 so both terms of the step count. */
static void test_apply_to(const dl_plan *plan)
{
    float a[4] = {1, -2, 3, 4}, b[4] = {0.5f, 1, 0, -2}, a2[4], b2[4];
    memcpy(a2, a, sizeof a), memcpy(b2, b, sizeof b);
    float *d[2] = {a, b}, *d2[2] = {a2, b2};
    double w[2] = {1, 3};
    float merged[4], merged2[4], params[4] = {10, -3, 2, 0.25f}, mom[4] = {0.1f, -0.2f, 0.3f, 0};
    float p_in[4], m_in[4], p_out[4], m_out[4];
    memcpy(p_in, params, sizeof params), memcpy(m_in, mom, sizeof mom);
    dl_merge_opts o = {.rule = DL_MERGE_RULE_RDA, .outer_lr = 0.7f, .outer_momentum = 0.9f};
    double n1 = dl_merge_apply(plan, 0, &o, d, w, 2, 0.8, merged, params, mom);
    double n2 = dl_merge_apply_to(plan, 0, &o, d2, w, NULL, 2, 0.8, merged2, p_in, m_in, p_out, m_out);
    CHECK(n1 == n2 && !memcmp(merged, merged2, sizeof merged), "same merged delta and norm");
    CHECK(!memcmp(params, p_out, sizeof p_out) && !memcmp(mom, m_out, sizeof m_out),
          "out of place: the in-place step's params and momentum bit for bit");
    CHECK(p_in[0] == 10 && p_in[3] == 0.25f && m_in[1] == -0.2f, "the inputs are left as they were");
    /* the deltas' sums of squares per span, as the synchronizer gathers them on
     * receive (exact for these values): the same merge without a pass over
     * the deltas; sums that disagree with the deltas change the RDA span only */
    const double ssa[2] = {1 + 4, 9 + 16}, ssb[2] = {0.25 + 1, 0 + 4};
    const double *ss[2] = {ssa, ssb};
    float merged3[4], p3[4], m3[4];
    double n3 = dl_merge_apply_to(plan, 0, &o, d2, w, ss, 2, 0.8, merged3, p_in, m_in, p3, m3);
    CHECK(n3 == n1 && !memcmp(merged3, merged, sizeof merged) && !memcmp(p3, params, sizeof p3),
          "given span sums of squares: the same merge bit for bit");
    const double ssa4[2] = {5, 4 * 25.0};
    const double *ssw[2] = {ssa4, ssb};
    dl_merge_apply_to(plan, 0, &o, d2, w, ssw, 2, 0.8, merged3, p_in, m_in, p3, m3);
    CHECK(merged3[0] == merged[0] && merged3[1] == merged[1] && (merged3[2] != merged[2] || merged3[3] != merged[3]),
          "the given sums are the ones used (RDA span changed, mean span not)");
}

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
    test_apply_to(plan);
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
    test_robust(plan);
    test_split_matrix();
    test_names();
    dl_plan_close(&plan);
    printf("%s\n", failures ? "test_merge: FAILED" : "test_merge: all checks passed");
    return failures ? 1 : 0;
}
