/* GPA-AdamW: the step over the stored pair (x, y) with z recovered, the
 * model-level step over AdamW's decay runs, and the networked parameter interface that moves x and y together. */
#include "gpt/gpa.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>

#include "core/err.h"
#include "core/plan.h"

const char *dl_gpa_optimizer_name(int optimizer)
{
    return optimizer == DL_OPT_ADAMW ? "adamw" : optimizer == DL_OPT_GPA ? "gpa" : NULL;
}

double dl_gpa_mu_x_from(double mu, int64_t H)
{
    assert(mu >= 0.0 && mu < 1.0 && H >= 1);
    return pow(mu, 1.0 / (double)H);
}

int dl_gpa_check(double mu_x, double mu_y)
{
    if (!(isfinite(mu_x) && mu_x >= 0.0 && mu_x < 1.0))
        return dl_err(DL_EINVAL, "gpa mu_x %g: must be in [0, 1) (0 = plain AdamW; 1 would freeze the model x)", mu_x);
    if (!(isfinite(mu_y) && mu_y >= 0.0 && mu_y < 1.0))
        return dl_err(DL_EINVAL,
                      "gpa mu_y %g: must be in [0, 1) (0 = the gradient at z; 1 would leave z unrecoverable from "
                      "the stored x and y)", mu_y);
    return 0;
}

void dl_gpa_adamw(float *x, float *y, const float *grad, float *m, float *v, size_t n, const dl_adamw_hp *hp,
                  float mu_x, float mu_y)
{
    float b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, eps = hp->eps, wd = hp->weight_decay, gs = hp->grad_scale;
    float c1 = 1.0f / (1.0f - powf(b1, (float)hp->t));
    float c2 = 1.0f / (1.0f - powf(b2, (float)hp->t));
    float k = mu_y / (1.0f - mu_y); /* z = y + k (y - x) */
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float xi = x[i], yi = y[i];
        float z = yi + k * (yi - xi);
        /* dl_cpu_adamw on z, expression for expression */
        float g = grad[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi * c1, vhat = vi * c2;
        z -= lr * (mhat / (sqrtf(vhat) + eps) + wd * z);
        float xn = z + mu_x * (xi - z);
        x[i] = xn;
        y[i] = z + mu_y * (xn - z);
    }
}

void dl_gpa_z(float *z, const float *x, const float *y, size_t n, float mu_y)
{
    float k = mu_y / (1.0f - mu_y);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) z[i] = y[i] + k * (y[i] - x[i]);
}

void dl_gpa_y(float *y, const float *x, const float *z, size_t n, float mu_y)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) y[i] = z[i] + mu_y * (x[i] - z[i]);
}

void dl_gpa_swap(float *a, float *b, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

float dl_gpa_step(dl_gpt *g, float *y, const dl_adamw_cfg *c, float lr, int64_t t, float mu_x, float mu_y)
{
    assert(t >= 1 && y);
    size_t np = dl_gpt_num_params(g);
    float *x = dl_gpt_params(g), *grads = dl_gpt_grads(g), *m = dl_gpt_adam_m(g), *v = dl_gpt_adam_v(g);
    double norm = sqrt(dl_cpu_sumsq(grads, np));
    dl_adamw_hp hp = dl_gpt_adamw_hp(c, lr, t, norm);
    int nt;
    const dl_tensor *tens = dl_gpt_tensors(g, &nt);
    size_t off, n;
    int decay;
    for (int i = 0; i < nt;) {
        i = dl_gpt_decay_run(tens, nt, i, &off, &n, &decay);
        hp.weight_decay = decay ? c->weight_decay : 0.0f;
        dl_gpa_adamw(x + off, y + off, grads + off, m + off, v + off, n, &hp, mu_x, mu_y);
    }
    return (float)norm;
}

/* ---- the networked parameter interface: theta = x, apply moves x and y */

typedef struct {
    dl_node_model iface; /* first: the handle is a pointer to it */
    const dl_plan *plan;
    float *x, *y;
    float *snap; /* [max numel] x_p at the last read_begin (non-deferred: read_end follows at once) */
    float *tmp;  /* [max numel] a fragment being updated by apply */
} gpa_model;

static int gpa_read_begin(void *ctx, int p)
{
    gpa_model *h = ctx;
    dl_plan_gather(h->plan, p, h->x, h->snap);
    return 0;
}

static int gpa_read_end(void *ctx, int p, const float **theta)
{
    (void)p;
    *theta = ((gpa_model *)ctx)->snap;
    return 0;
}

/* buf = a*buf + b*in over fragment p of `params` */
static void apply_one(gpa_model *h, int p, float *params, float a, float b, const float *in)
{
    if (a == 0.0f && b == 1.0f) {
        dl_plan_scatter(h->plan, p, in, params);
        return;
    }
    size_t k = dl_plan_fragment_numel(h->plan, p);
    if (a != 0.0f) dl_plan_gather(h->plan, p, params, h->tmp);
    dl_cpu_axpby(h->tmp, a, in, b, k);
    dl_plan_scatter(h->plan, p, h->tmp, params);
}

static int gpa_apply(void *ctx, int p, float a, float b, const float *in)
{
    gpa_model *h = ctx;
    apply_one(h, p, h->x, a, b, in);
    apply_one(h, p, h->y, a, b, in);
    return 0;
}

int dl_gpa_node_model_open(const dl_plan *plan, float *x, float *y, dl_node_model **out)
{
    assert(out);
    *out = NULL;
    if (!plan || !x || !y) return dl_err(DL_EINVAL, "gpa model: no plan, x or y buffer");
    gpa_model *h = dl_xcalloc(1, sizeof *h);
    h->plan = plan;
    h->x = x;
    h->y = y;
    h->snap = dl_xcalloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    h->tmp = dl_xcalloc(dl_plan_max_fragment_numel(plan), sizeof(float));
    h->iface = (dl_node_model){
        .ctx = h, .deferred = 0, .read_begin = gpa_read_begin, .read_end = gpa_read_end, .apply = gpa_apply};
    *out = &h->iface;
    return 0;
}

void dl_gpa_node_model_close(dl_node_model **mp)
{
    if (!mp || !*mp) return;
    gpa_model *h = (gpa_model *)(*mp)->ctx;
    assert(&h->iface == *mp);
    free(h->snap);
    free(h->tmp);
    free(h);
    *mp = NULL;
}
