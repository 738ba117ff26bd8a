/* The CUDA learner's parameter interface: fragment snapshots device -> pinned
 * host on a side stream overlapping the next step, and adopts host -> device + axpby without host stalls. */
#include "gpt/xfer_cuda.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/log.h"
#include "core/plan.h"
#include "kernels/cuda/cuda.h"

/* A stretch of a fragment that is contiguous in the payload and in the
 * parameter buffer (adjacent blocks of one fragment: whole tensors or row
 * blocks of one): one copy, one kernel. */
typedef struct {
    size_t dst; /* floats from the start of the fragment payload */
    size_t src; /* floats from the start of the device parameters */
    size_t n;
} run;

struct dl_gptc_xfer {
    dl_node_model iface;
    dl_gptc *g;
    const dl_plan *plan;
    int P;
    size_t total;     /* floats: sum of all fragments = the model's parameters */
    size_t *off;      /* [P] start of fragment p inside the four buffers below, floats */
    size_t *numel;    /* [P] */
    run **runs;       /* [P][nruns[p]] */
    int *nruns;       /* [P] */
    float *dsnap;     /* device: snapshots, fragment p at off[p] */
    float *dstage;    /* device: uploaded updates */
    float *hsnap;     /* pinned host: snapshots as read_end hands them out */
    float *hstage;    /* pinned host: updates on their way up */
    dl_cuda_stream side;
    dl_cuda_event *ev_snap; /* [P] compute: device snapshot of p taken */
    dl_cuda_event *ev_done; /* [P] side: host snapshot of p complete */
    dl_cuda_event *ev_up;   /* [P] side: upload of p's staging complete */
    dl_cuda_event *ev_used; /* [P] compute: axpby from p's device staging done */
};

static int x_read_begin(void *ctx, int p) { return dl_gptc_xfer_read_begin(ctx, p); }
static int x_read_end(void *ctx, int p, const float **theta) { return dl_gptc_xfer_read_end(ctx, p, theta); }
static int x_apply(void *ctx, int p, float a, float b, const float *in) { return dl_gptc_xfer_apply(ctx, p, a, b, in); }

/* The plan must describe g's buffer: the same tensors at the same offsets. */
static int check_plan(dl_gptc *g, const dl_plan *plan)
{
    int nt;
    const dl_tensor *t = dl_gptc_tensors(g, &nt);
    if (dl_plan_ntensors(plan) != nt || dl_plan_total_numel(plan) != dl_gptc_num_params(g))
        return dl_err(DL_EINVAL, "xfer: plan of %d tensors / %zu floats, model has %d / %zu",
                      dl_plan_ntensors(plan), dl_plan_total_numel(plan), nt, dl_gptc_num_params(g));
    for (int i = 0; i < nt; i++) {
        const dl_tensor *pt = dl_plan_tensor(plan, i);
        if (pt->offset != t[i].offset || pt->numel != t[i].numel)
            return dl_err(DL_EINVAL, "xfer: plan tensor %d (%s) at %zu+%zu, model's at %zu+%zu", i, pt->name,
                          pt->offset, pt->numel, t[i].offset, t[i].numel);
    }
    return 0;
}

static int open_events(dl_cuda_event **evs, int P)
{
    *evs = dl_xcalloc((size_t)P, sizeof **evs);
    for (int p = 0; p < P; p++) DL_TRY(dl_cuda_event_open(&(*evs)[p]));
    return 0;
}

static void close_events(dl_cuda_event **evs, int P)
{
    if (!*evs) return;
    for (int p = 0; p < P; p++) dl_cuda_event_close(&(*evs)[p]);
    free(*evs);
    *evs = NULL;
}

static int xfer_init(dl_gptc_xfer *x)
{
    int P = x->P;
    x->off = dl_xcalloc((size_t)P, sizeof *x->off);
    x->numel = dl_xcalloc((size_t)P, sizeof *x->numel);
    x->runs = dl_xcalloc((size_t)P, sizeof *x->runs);
    x->nruns = dl_xcalloc((size_t)P, sizeof *x->nruns);
    size_t at = 0;
    for (int p = 0; p < P; p++) {
        int ns;
        const dl_plan_span *sp = dl_plan_fragment_spans(x->plan, p, &ns);
        x->off[p] = at;
        x->numel[p] = dl_plan_fragment_numel(x->plan, p);
        x->runs[p] = dl_xcalloc((size_t)ns, sizeof(run));
        int nr = 0;
        for (int i = 0; i < ns; i++) {
            run *last = nr ? &x->runs[p][nr - 1] : NULL;
            if (last && last->dst + last->n == sp[i].offset && last->src + last->n == sp[i].src) {
                last->n += sp[i].numel;
            } else {
                x->runs[p][nr++] = (run){.dst = sp[i].offset, .src = sp[i].src, .n = sp[i].numel};
            }
        }
        x->nruns[p] = nr;
        at += x->numel[p];
    }
    x->total = at;
    size_t bytes = x->total * sizeof(float);
    DL_TRY(dl_cuda_malloc(bytes, (void **)&x->dsnap));
    DL_TRY(dl_cuda_malloc(bytes, (void **)&x->dstage));
    DL_TRY(dl_cuda_host_alloc(bytes, (void **)&x->hsnap));
    DL_TRY(dl_cuda_host_alloc(bytes, (void **)&x->hstage));
    DL_TRY(dl_cuda_stream_open(&x->side));
    DL_TRY(open_events(&x->ev_snap, P));
    DL_TRY(open_events(&x->ev_done, P));
    DL_TRY(open_events(&x->ev_up, P));
    DL_TRY(open_events(&x->ev_used, P));
    return 0;
}

int dl_gptc_xfer_open(dl_gptc *g, const dl_plan *plan, dl_gptc_xfer **out)
{
    assert(g && plan && out);
    *out = NULL;
    DL_TRY(check_plan(g, plan));
    dl_gptc_xfer *x = dl_xcalloc(1, sizeof *x);
    x->g = g;
    x->plan = plan;
    x->P = dl_plan_P(plan);
    x->iface = (dl_node_model){
        .ctx = x, .deferred = 1, .read_begin = x_read_begin, .read_end = x_read_end, .apply = x_apply};
    int rc = xfer_init(x);
    if (rc) {
        dl_gptc_xfer_close(&x);
        return rc;
    }
    *out = x;
    return 0;
}

void dl_gptc_xfer_close(dl_gptc_xfer **xp)
{
    if (!xp || !*xp) return;
    dl_gptc_xfer *x = *xp;
    /* nothing may still read or write the buffers: the side stream's copies
     * and the compute stream's axpby kernels */
    dl_cuda_stream_close(&x->side);
    if (x->dsnap && dl_cuda_sync() != 0) DL_WARN("xfer close: %s", dl_errmsg());
    close_events(&x->ev_snap, x->P);
    close_events(&x->ev_done, x->P);
    close_events(&x->ev_up, x->P);
    close_events(&x->ev_used, x->P);
    dl_cuda_free((void **)&x->dsnap);
    dl_cuda_free((void **)&x->dstage);
    dl_cuda_host_free((void **)&x->hsnap);
    dl_cuda_host_free((void **)&x->hstage);
    if (x->runs)
        for (int p = 0; p < x->P; p++) free(x->runs[p]);
    free(x->runs);
    free(x->nruns);
    free(x->off);
    free(x->numel);
    free(x);
    *xp = NULL;
}

const dl_node_model *dl_gptc_xfer_model(dl_gptc_xfer *x) { return &x->iface; }

int dl_gptc_xfer_read_begin(dl_gptc_xfer *x, int p)
{
    assert(x && p >= 0 && p < x->P);
    float *params = dl_gptc_params_dev(x->g), *ds = x->dsnap + x->off[p];
    /* the previous host copy of this snapshot may still be reading it */
    DL_TRY(dl_cuda_stream_wait(NULL, x->ev_done[p]));
    for (int i = 0; i < x->nruns[p]; i++) {
        const run *r = &x->runs[p][i];
        DL_TRY(dl_cuda_copy_async(ds + r->dst, params + r->src, r->n * sizeof(float), NULL));
    }
    DL_TRY(dl_cuda_event_record(x->ev_snap[p], NULL));
    DL_TRY(dl_cuda_stream_wait(x->side, x->ev_snap[p]));
    DL_TRY(dl_cuda_copy_async(x->hsnap + x->off[p], ds, x->numel[p] * sizeof(float), x->side));
    return dl_cuda_event_record(x->ev_done[p], x->side);
}

int dl_gptc_xfer_read_end(dl_gptc_xfer *x, int p, const float **theta)
{
    assert(x && theta && p >= 0 && p < x->P);
    *theta = NULL;
    DL_TRY(dl_cuda_event_sync(x->ev_done[p]));
    *theta = x->hsnap + x->off[p];
    return 0;
}

int dl_gptc_xfer_apply(dl_gptc_xfer *x, int p, float a, float b, const float *in)
{
    assert(x && in && p >= 0 && p < x->P);
    float *params = dl_gptc_params_dev(x->g);
    float *hs = x->hstage + x->off[p], *ds = x->dstage + x->off[p];
    size_t bytes = x->numel[p] * sizeof(float);
    /* the previous upload of p must have left the pinned staging */
    DL_TRY(dl_cuda_event_sync(x->ev_up[p]));
    memcpy(hs, in, bytes);
    DL_TRY(dl_cuda_stream_wait(x->side, x->ev_used[p])); /* compute done reading the device staging */
    DL_TRY(dl_cuda_copy_async(ds, hs, bytes, x->side));
    DL_TRY(dl_cuda_event_record(x->ev_up[p], x->side));
    DL_TRY(dl_cuda_stream_wait(NULL, x->ev_up[p]));
    for (int i = 0; i < x->nruns[p]; i++) {
        const run *r = &x->runs[p][i];
        DL_TRY(dl_cuda_axpby(params + r->src, a, ds + r->dst, b, r->n));
    }
    return dl_cuda_event_record(x->ev_used[p], NULL);
}

size_t dl_gptc_xfer_device_bytes(const dl_gptc_xfer *x) { return 2 * x->total * sizeof(float); }
size_t dl_gptc_xfer_host_bytes(const dl_gptc_xfer *x) { return 2 * x->total * sizeof(float); }
