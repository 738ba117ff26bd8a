/* Fragment plan: LPT bin packing of whole tensors into P fragments, gather /
 * scatter of fragment payloads, the model fingerprint and the push schedule. */
#include "core/plan.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/hash.h"

struct dl_plan {
    int P;               /* fragments */
    int nt;              /* tensors */
    dl_tensor *t;        /* [nt] copy of the table, buffer order */
    int *frag_of;        /* [nt] fragment of each tensor */
    int *start;          /* [P+1] fragment p owns idx/spans [start[p], start[p+1]) */
    int *idx;            /* [nt] table indices grouped by fragment, buffer order inside */
    dl_plan_span *spans; /* [nt] aligned with idx; offsets inside each payload */
    size_t *fnumel;      /* [P] floats per fragment */
    size_t total;        /* floats in all tensors */
};

/* ---------------------------------------------------------------- validation */

static int check_table(const dl_tensor *t, int nt)
{
    for (int i = 0; i < nt; i++) {
        const dl_tensor *e = &t[i];
        if (!memchr(e->name, '\0', sizeof e->name) || e->name[0] == '\0')
            return dl_err(DL_EINVAL, "plan: tensor %d has an empty or unterminated name", i);
        if (e->ndim != 1 && e->ndim != 2)
            return dl_err(DL_EINVAL, "plan: tensor %d (%s): ndim %d, want 1 or 2", i, e->name, e->ndim);
        if (e->kind != DL_TENSOR_MATRIX && e->kind != DL_TENSOR_VECTOR && e->kind != DL_TENSOR_EMBED)
            return dl_err(DL_EINVAL, "plan: tensor %d (%s): unknown kind %d", i, e->name, e->kind);
        size_t prod = 1;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] <= 0)
                return dl_err(DL_EINVAL, "plan: tensor %d (%s): shape[%d] = %d", i, e->name, d, e->shape[d]);
            prod *= (size_t)e->shape[d];
        }
        if (e->numel == 0 || e->numel != prod)
            return dl_err(DL_EINVAL, "plan: tensor %d (%s): numel %zu but shape product %zu", i, e->name, e->numel,
                          prod);
        if (i > 0) {
            const dl_tensor *q = &t[i - 1];
            if (e->offset < q->offset || e->offset - q->offset < q->numel)
                return dl_err(DL_EINVAL,
                              "plan: tensor %d (%s) at offset %zu overlaps or precedes %s [%zu, +%zu): "
                              "the table must be in buffer order",
                              i, e->name, e->offset, q->name, q->offset, q->numel);
        }
        if (e->offset + e->numel < e->offset)
            return dl_err(DL_EINVAL, "plan: tensor %d (%s): offset + numel overflows", i, e->name);
    }
    /* Names identify tensors in checkpoints and logs: they must be unique. */
    for (int i = 0; i < nt; i++)
        for (int j = i + 1; j < nt; j++)
            if (strcmp(t[i].name, t[j].name) == 0)
                return dl_err(DL_EINVAL, "plan: tensors %d and %d share the name %s", i, j, t[i].name);
    return 0;
}

/* ---------------------------------------------------------------- build */

typedef struct {
    size_t numel;
    int idx;
} lpt_item;

/* numel descending, then table index ascending: a total order, so qsort's
 * instability cannot make the plan depend on the C library. */
static int lpt_cmp(const void *a, const void *b)
{
    const lpt_item *x = a, *y = b;
    if (x->numel != y->numel) return x->numel > y->numel ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

int dl_plan_build(const dl_tensor *t, int ntensors, int P, dl_plan **out)
{
    assert(out);
    *out = NULL;
    if (ntensors < 1 || !t) return dl_err(DL_EINVAL, "plan: empty tensor table");
    if (P < 1 || P > ntensors)
        return dl_err(DL_EINVAL, "plan: P = %d fragments, must be in [1, %d] (one whole tensor at least each)", P,
                      ntensors);
    DL_TRY(check_table(t, ntensors));

    dl_plan *pl = dl_xcalloc(1, sizeof *pl);
    lpt_item *items = dl_xmalloc((size_t)ntensors * sizeof *items);
    pl->P = P;
    pl->nt = ntensors;
    pl->t = dl_xmalloc((size_t)ntensors * sizeof *pl->t);
    pl->frag_of = dl_xmalloc((size_t)ntensors * sizeof *pl->frag_of);
    pl->start = dl_xcalloc((size_t)P + 1, sizeof *pl->start);
    pl->idx = dl_xmalloc((size_t)ntensors * sizeof *pl->idx);
    pl->spans = dl_xmalloc((size_t)ntensors * sizeof *pl->spans);
    pl->fnumel = dl_xcalloc((size_t)P, sizeof *pl->fnumel);
    int *fill = dl_xcalloc((size_t)P, sizeof *fill);
    memcpy(pl->t, t, (size_t)ntensors * sizeof *t);

    /* LPT: largest tensor first onto the lightest fragment. */
    for (int i = 0; i < ntensors; i++) items[i] = (lpt_item){t[i].numel, i};
    qsort(items, (size_t)ntensors, sizeof *items, lpt_cmp);
    for (int k = 0; k < ntensors; k++) {
        int best = 0;
        for (int p = 1; p < P; p++)
            if (pl->fnumel[p] < pl->fnumel[best]) best = p;
        pl->frag_of[items[k].idx] = best;
        pl->fnumel[best] += items[k].numel;
        pl->total += items[k].numel;
    }

    /* Group by fragment; walking the table in order keeps buffer order. */
    for (int i = 0; i < ntensors; i++) pl->start[pl->frag_of[i] + 1]++;
    for (int p = 0; p < P; p++) {
        /* The first P tensors land on the P empty fragments and numel > 0,
         * so no fragment stays empty. */
        if (pl->start[p + 1] == 0) DL_PANIC("plan: fragment %d is empty", p);
        pl->start[p + 1] += pl->start[p];
    }
    for (int i = 0; i < ntensors; i++) {
        int p = pl->frag_of[i];
        int k = pl->start[p] + fill[p]++;
        size_t off = k == pl->start[p] ? 0 : pl->spans[k - 1].offset + pl->spans[k - 1].numel;
        pl->idx[k] = i;
        pl->spans[k] = (dl_plan_span){.offset = off, .numel = t[i].numel, .kind = t[i].kind, .tensor = i};
    }
    free(items);
    free(fill);
    *out = pl;
    return 0;
}

void dl_plan_close(dl_plan **plan)
{
    if (!plan || !*plan) return;
    dl_plan *pl = *plan;
    free(pl->t);
    free(pl->frag_of);
    free(pl->start);
    free(pl->idx);
    free(pl->spans);
    free(pl->fnumel);
    free(pl);
    *plan = NULL;
}

/* ---------------------------------------------------------------- accessors */

int dl_plan_P(const dl_plan *plan) { assert(plan); return plan->P; }
int dl_plan_ntensors(const dl_plan *plan) { assert(plan); return plan->nt; }
size_t dl_plan_total_numel(const dl_plan *plan) { assert(plan); return plan->total; }

const dl_tensor *dl_plan_tensor(const dl_plan *plan, int i)
{
    assert(plan && i >= 0 && i < plan->nt);
    return &plan->t[i];
}

size_t dl_plan_max_fragment_numel(const dl_plan *plan)
{
    assert(plan);
    size_t m = 0;
    for (int p = 0; p < plan->P; p++)
        if (plan->fnumel[p] > m) m = plan->fnumel[p];
    return m;
}

size_t dl_plan_fragment_numel(const dl_plan *plan, int p)
{
    assert(plan && p >= 0 && p < plan->P);
    return plan->fnumel[p];
}

int dl_plan_fragment_ntensors(const dl_plan *plan, int p)
{
    assert(plan && p >= 0 && p < plan->P);
    return plan->start[p + 1] - plan->start[p];
}

const int *dl_plan_fragment_tensors(const dl_plan *plan, int p)
{
    assert(plan && p >= 0 && p < plan->P);
    return plan->idx + plan->start[p];
}

const dl_plan_span *dl_plan_fragment_spans(const dl_plan *plan, int p, int *nspans)
{
    assert(plan && p >= 0 && p < plan->P && nspans);
    *nspans = plan->start[p + 1] - plan->start[p];
    return plan->spans + plan->start[p];
}

int dl_plan_fragment_of(const dl_plan *plan, int tensor)
{
    assert(plan && tensor >= 0 && tensor < plan->nt);
    return plan->frag_of[tensor];
}

int dl_plan_fragment_has_kind(const dl_plan *plan, int p, int kind)
{
    assert(plan && p >= 0 && p < plan->P);
    for (int k = plan->start[p]; k < plan->start[p + 1]; k++)
        if (plan->spans[k].kind == kind) return 1;
    return 0;
}

double dl_plan_imbalance(const dl_plan *plan)
{
    assert(plan);
    double mean = (double)plan->total / plan->P;
    return (double)dl_plan_max_fragment_numel(plan) / mean;
}

/* ---------------------------------------------------------------- gather / scatter */

void dl_plan_gather(const dl_plan *plan, int p, const float *params, float *out)
{
    assert(plan && p >= 0 && p < plan->P && params && out);
    for (int k = plan->start[p]; k < plan->start[p + 1]; k++) {
        const dl_plan_span *s = &plan->spans[k];
        memcpy(out + s->offset, params + plan->t[s->tensor].offset, s->numel * sizeof(float));
    }
}

void dl_plan_scatter(const dl_plan *plan, int p, const float *in, float *params)
{
    assert(plan && p >= 0 && p < plan->P && in && params);
    for (int k = plan->start[p]; k < plan->start[p + 1]; k++) {
        const dl_plan_span *s = &plan->spans[k];
        memcpy(params + plan->t[s->tensor].offset, in + s->offset, s->numel * sizeof(float));
    }
}

/* ---------------------------------------------------------------- fingerprint */

static unsigned char *put_u32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
    return b + 4;
}

static unsigned char *put_u64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    return b + 8;
}

/* Serialisation version 1: header "DLPLAN01", u64 cfg length, u32 P, u32
 * ntensors; then the cfg bytes; then per tensor a fixed 84-byte record
 * (name zero-padded to 48, u32 ndim, u32 shape[2] (0 past ndim), u64 offset,
 * u64 numel, u32 kind, u32 fragment). Chained through the seed of dl_hash64. */
uint64_t dl_plan_fingerprint(const dl_plan *plan, const void *model_cfg_bytes, size_t len)
{
    assert(plan && (model_cfg_bytes || len == 0));
    unsigned char hdr[24], rec[84];
    unsigned char *b = hdr;
    memcpy(b, "DLPLAN01", 8);
    b = put_u64(b + 8, (uint64_t)len);
    b = put_u32(b, (uint32_t)plan->P);
    put_u32(b, (uint32_t)plan->nt);
    uint64_t h = dl_hash64(hdr, sizeof hdr, 0);
    if (len) h = dl_hash64(model_cfg_bytes, len, h);
    for (int i = 0; i < plan->nt; i++) {
        const dl_tensor *e = &plan->t[i];
        memset(rec, 0, sizeof rec);
        /* strnlen-bounded copy: bytes after the terminator are not hashed. */
        memcpy(rec, e->name, strnlen(e->name, sizeof e->name));
        b = put_u32(rec + 48, (uint32_t)e->ndim);
        b = put_u32(b, (uint32_t)e->shape[0]);
        b = put_u32(b, e->ndim > 1 ? (uint32_t)e->shape[1] : 0);
        b = put_u64(b, (uint64_t)e->offset);
        b = put_u64(b, (uint64_t)e->numel);
        b = put_u32(b, (uint32_t)e->kind);
        b = put_u32(b, (uint32_t)plan->frag_of[i]);
        assert(b == rec + sizeof rec);
        h = dl_hash64(rec, sizeof rec, h);
    }
    return h;
}

/* ---------------------------------------------------------------- schedule */

int dl_plan_due(int64_t step, int p, int H, int P)
{
    assert(H >= 1 && P >= 1 && p >= 0 && p < P);
    int64_t off = (int64_t)p * H / P; /* in [0, H) */
    /* For 0 < step < off, step - off is in (-H, 0): never a multiple of H. */
    return step > 0 && (step - off) % H == 0;
}
