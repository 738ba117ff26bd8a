/* Fragment plan: LPT bin packing of tensors into P fragments (big ones split into row blocks),
 * gather / scatter of fragment payloads, the model fingerprint and the push schedule. */
#include "core/plan.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/hash.h"

struct dl_plan {
    int P;               /* fragments */
    int nt;              /* tensors */
    int nb;              /* blocks, >= nt */
    dl_tensor *t;        /* [nt] copy of the table, buffer order */
    int *start;          /* [P+1] fragment p owns spans [start[p], start[p+1]) */
    dl_plan_span *spans; /* [nb] grouped by fragment, buffer order inside; offsets inside each payload */
    int *tstart;         /* [nt+1] tensor i's blocks are by_tensor[tstart[i], tstart[i+1]) */
    int *by_tensor;      /* [nb] span indices ordered by (tensor, start) */
    size_t *fnumel;      /* [P] floats per fragment */
    size_t total;        /* floats in all tensors */
};

/* ---------------------------------------------------------------- validation */

static int name_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static int check_table(const dl_tensor *t, int nt)
{
    for (int i = 0; i < nt; i++) {
        const dl_tensor *e = &t[i];
        if (!memchr(e->name, '\0', sizeof e->name) || e->name[0] == '\0')
            return dl_err(DL_EINVAL, "plan: tensor %d has an empty or unterminated name", i);
        if (e->ndim < 1 || e->ndim > DL_TENSOR_NDIM_MAX)
            return dl_err(DL_EINVAL, "plan: tensor %d (%s): ndim %d, want 1 to %d", i, e->name, e->ndim,
                          DL_TENSOR_NDIM_MAX);
        if (e->kind != DL_TENSOR_MATRIX && e->kind != DL_TENSOR_VECTOR && e->kind != DL_TENSOR_EMBED)
            return dl_err(DL_EINVAL, "plan: tensor %d (%s): unknown kind %d", i, e->name, e->kind);
        size_t prod = 1;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] <= 0)
                return dl_err(DL_EINVAL, "plan: tensor %d (%s): shape[%d] = %lld", i, e->name, d,
                              (long long)e->shape[d]);
            if ((uint64_t)e->shape[d] > SIZE_MAX / prod)
                return dl_err(DL_EINVAL, "plan: tensor %d (%s): the shape's element count overflows", i, e->name);
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
    /* Names identify tensors in checkpoints and logs: they must be unique.
     * Sorted copies of the pointers: O(n log n) for tables of many tensors. */
    const char **names = dl_xmalloc((size_t)nt * sizeof *names);
    for (int i = 0; i < nt; i++) names[i] = t[i].name;
    qsort(names, (size_t)nt, sizeof *names, name_cmp);
    int dup = -1;
    for (int i = 1; i < nt && dup < 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0) dup = i;
    int rc = 0;
    if (dup >= 0) {
        int a = -1, b = -1;
        for (int i = 0; i < nt; i++)
            if (strcmp(t[i].name, names[dup]) == 0) {
                if (a < 0) a = i;
                else if (b < 0) b = i;
            }
        rc = dl_err(DL_EINVAL, "plan: tensors %d and %d share the name %s", a, b, t[a].name);
    }
    free(names);
    return rc;
}

/* ---------------------------------------------------------------- build */

/* One block while the plan is being built. */
typedef struct {
    int tensor, fragment;
    size_t start, numel; /* elements inside the tensor */
} blk;

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

/* LPT of the tensors not marked in `skip` (NULL: all) into P fragments:
 * frag[i] for each packed tensor, fill[p] its floats (zeroed first). */
static void lpt(const dl_tensor *t, int nt, const unsigned char *skip, int P, int *frag, size_t *fill)
{
    lpt_item *items = dl_xmalloc((size_t)nt * sizeof *items);
    int n = 0;
    for (int i = 0; i < nt; i++)
        if (!skip || !skip[i]) items[n++] = (lpt_item){t[i].numel, i};
    qsort(items, (size_t)n, sizeof *items, lpt_cmp);
    memset(fill, 0, (size_t)P * sizeof *fill);
    for (int k = 0; k < n; k++) {
        int best = 0;
        for (int p = 1; p < P; p++)
            if (fill[p] < fill[best]) best = p;
        frag[items[k].idx] = best;
        fill[best] += items[k].numel;
    }
    free(items);
}

static size_t max_of(const size_t *x, int n)
{
    size_t m = 0;
    for (int i = 0; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

/* Elements per row (rows = shape[0], a row = the product of the other
 * dimensions; 1 for a 1-D tensor): a block boundary of tensor e is a
 * multiple of this. */
static size_t row_width(const dl_tensor *e)
{
    size_t w = 1;
    for (int d = 1; d < e->ndim; d++) w *= (size_t)e->shape[d];
    return w;
}

/* Floats the fragments under `level` need to reach it, stopping once past cap. */
static size_t need_for(const size_t *fill, int P, size_t level, size_t cap)
{
    size_t need = 0;
    for (int p = 0; p < P && need <= cap; p++)
        if (fill[p] < level) need += level - fill[p];
    return need;
}

/* The liquid stream: the split tensors (big[]) concatenated in table order;
 * base[k] is where big[k] starts in it. Cut position x of the stream moved to
 * the nearest row boundary of the tensor it falls in (half a row rounds up). */
static size_t round_cut(const dl_tensor *t, const int *big, const size_t *base, int nbig, size_t x)
{
    int k = 0;
    while (k + 1 < nbig && base[k + 1] <= x) k++;
    const dl_tensor *e = &t[big[k]];
    size_t u = x - base[k], w = row_width(e);
    if (u >= e->numel) return base[k] + e->numel; /* the end of the stream */
    return base[k] + (u + w / 2) / w * w;
}

/* The split plan (see plan.h): LPT of the tensors up to the target, then the
 * big ones (big[0..nbig-1], table order) poured to a common level. Writes the
 * blocks to b and returns their count: nt - nbig whole tensors plus the P
 * stretches of the stream, cut again at its nbig - 1 inner tensor boundaries,
 * so fewer than nt + P. fill[] gets each fragment's floats. */
static int build_split(const dl_tensor *t, int nt, int P, const unsigned char *is_big, const int *big, int nbig,
                       blk *b, size_t *fill)
{
    int *frag = dl_xmalloc((size_t)nt * sizeof *frag);
    lpt(t, nt, is_big, P, frag, fill);
    int n = 0;
    for (int i = 0; i < nt; i++)
        if (!is_big[i]) b[n++] = (blk){.tensor = i, .fragment = frag[i], .start = 0, .numel = t[i].numel};
    free(frag);

    size_t *base = dl_xmalloc((size_t)nbig * sizeof *base), Q = 0;
    for (int k = 0; k < nbig; k++) {
        base[k] = Q;
        Q += t[big[k]].numel;
    }
    /* The level: the largest L whose need is at most Q (need(0) = 0 <= Q,
     * need(max fill + Q + 1) > Q). */
    size_t lo = 0, hi = max_of(fill, P) + Q + 1;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (need_for(fill, P, mid, Q) <= Q) lo = mid;
        else hi = mid;
    }
    /* need(lo + 1) - need(lo) = #fragments at or under lo > the remainder. */
    size_t rem = Q - need_for(fill, P, lo, Q), cum = 0, prev = 0;
    for (int p = 0; p < P; p++) {
        size_t q = fill[p] < lo ? lo - fill[p] : 0;
        if (rem && fill[p] <= lo) q++, rem--;
        cum += q;
        size_t cut = round_cut(t, big, base, nbig, cum); /* cum == Q at p == P - 1: the end */
        assert(cut >= prev);                              /* rounding to rows is monotone */
        /* stream [prev, cut) into fragment p, one block per big tensor it touches */
        for (int k = 0; k < nbig && prev < cut; k++) {
            size_t lo_k = base[k], hi_k = base[k] + t[big[k]].numel;
            if (hi_k <= prev || lo_k >= cut) continue;
            size_t s0 = (prev > lo_k ? prev : lo_k) - lo_k, s1 = (cut < hi_k ? cut : hi_k) - lo_k;
            b[n++] = (blk){.tensor = big[k], .fragment = p, .start = s0, .numel = s1 - s0};
            fill[p] += s1 - s0;
        }
        prev = cut;
    }
    if (rem) DL_PANIC("plan: %zu floats of the level left over", rem);
    free(base);
    return n;
}

/* (tensor, start) ascending: unique for non-empty blocks. */
static int blk_cmp(const void *a, const void *b)
{
    const blk *x = a, *y = b;
    if (x->tensor != y->tensor) return (x->tensor > y->tensor) - (x->tensor < y->tensor);
    return (x->start > y->start) - (x->start < y->start);
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
    int nt = ntensors;
    size_t total = 0;
    for (int i = 0; i < nt; i++) total += t[i].numel;

    /* The whole-tensor plan: one block per tensor. A split plan has at most
     * one block of each big tensor per fragment plus one per tensor boundary
     * inside the stream, so nt + P blocks bound both. */
    blk *b = dl_xmalloc(((size_t)nt + (size_t)P) * sizeof *b);
    size_t *fill = dl_xmalloc((size_t)P * sizeof *fill);
    int *frag = dl_xmalloc((size_t)nt * sizeof *frag);
    lpt(t, nt, NULL, P, frag, fill);
    int nb = nt;
    for (int i = 0; i < nt; i++) b[i] = (blk){.tensor = i, .fragment = frag[i], .start = 0, .numel = t[i].numel};
    free(frag);

    /* Big tensors: above the target and with two rows at least to cut between. */
    size_t target = total / (size_t)P + (total % (size_t)P != 0);
    unsigned char *is_big = dl_xcalloc((size_t)nt, 1);
    int *big = dl_xmalloc((size_t)nt * sizeof *big), nbig = 0;
    for (int i = 0; i < nt; i++)
        if (t[i].numel > target && t[i].numel / row_width(&t[i]) >= 2) is_big[i] = 1, big[nbig++] = i;
    if (nbig) {
        blk *b2 = dl_xmalloc(((size_t)nt + (size_t)P) * sizeof *b2);
        size_t *fill2 = dl_xmalloc((size_t)P * sizeof *fill2);
        int nb2 = build_split(t, nt, P, is_big, big, nbig, b2, fill2);
        int empty = 0;
        for (int p = 0; p < P; p++) empty |= fill2[p] == 0;
        if (!empty && max_of(fill2, P) < max_of(fill, P)) {
            free(b), free(fill);
            b = b2, fill = fill2, nb = nb2;
        } else {
            free(b2), free(fill2);
        }
    }
    free(is_big);
    free(big);
    qsort(b, (size_t)nb, sizeof *b, blk_cmp);

    dl_plan *pl = dl_xcalloc(1, sizeof *pl);
    pl->P = P;
    pl->nt = nt;
    pl->nb = nb;
    pl->total = total;
    pl->t = dl_xmalloc((size_t)nt * sizeof *pl->t);
    memcpy(pl->t, t, (size_t)nt * sizeof *t);
    pl->start = dl_xcalloc((size_t)P + 1, sizeof *pl->start);
    pl->spans = dl_xmalloc((size_t)nb * sizeof *pl->spans);
    pl->tstart = dl_xcalloc((size_t)nt + 1, sizeof *pl->tstart);
    pl->by_tensor = dl_xmalloc((size_t)nb * sizeof *pl->by_tensor);
    pl->fnumel = fill;

    /* Group by fragment; (tensor, start) order is buffer order, kept inside. */
    for (int k = 0; k < nb; k++) pl->start[b[k].fragment + 1]++;
    for (int p = 0; p < P; p++) {
        /* whole-tensor LPT gives the first P tensors the P empty fragments;
         * a split plan with an empty fragment was refused above */
        if (pl->start[p + 1] == 0) DL_PANIC("plan: fragment %d is empty", p);
        pl->start[p + 1] += pl->start[p];
    }
    int *at = dl_xcalloc((size_t)P, sizeof *at);
    for (int k = 0; k < nb; k++) {
        int p = b[k].fragment, j = pl->start[p] + at[p]++;
        const dl_tensor *e = &t[b[k].tensor];
        size_t off = j == pl->start[p] ? 0 : pl->spans[j - 1].offset + pl->spans[j - 1].numel;
        pl->spans[j] = (dl_plan_span){.offset = off, .src = e->offset + b[k].start, .start = b[k].start,
                                      .numel = b[k].numel, .kind = e->kind, .tensor = b[k].tensor, .fragment = p};
        pl->by_tensor[k] = j;
        pl->tstart[b[k].tensor + 1]++;
    }
    for (int i = 0; i < nt; i++) pl->tstart[i + 1] += pl->tstart[i];
    /* Invariants the consumers rely on: blocks tile each tensor in order,
     * payloads add up to the fragment sizes. */
    for (int i = 0; i < nt; i++) {
        size_t next = 0;
        for (int k = pl->tstart[i]; k < pl->tstart[i + 1]; k++) {
            const dl_plan_span *s = &pl->spans[pl->by_tensor[k]];
            if (s->start != next || s->numel == 0 || s->start % row_width(&t[i]) || s->numel % row_width(&t[i]))
                DL_PANIC("plan: block %d of tensor %s is not a row block at %zu", k - pl->tstart[i], t[i].name, next);
            next += s->numel;
        }
        if (next != t[i].numel) DL_PANIC("plan: blocks of %s cover %zu of %zu", t[i].name, next, t[i].numel);
    }
    for (int p = 0; p < P; p++) {
        const dl_plan_span *s = &pl->spans[pl->start[p + 1] - 1];
        if (s->offset + s->numel != pl->fnumel[p]) DL_PANIC("plan: fragment %d spans do not add up", p);
    }
    free(at);
    free(b);
    *out = pl;
    return 0;
}

void dl_plan_close(dl_plan **plan)
{
    if (!plan || !*plan) return;
    dl_plan *pl = *plan;
    free(pl->t);
    free(pl->start);
    free(pl->spans);
    free(pl->tstart);
    free(pl->by_tensor);
    free(pl->fnumel);
    free(pl);
    *plan = NULL;
}

/* ---------------------------------------------------------------- accessors */

int dl_plan_P(const dl_plan *plan) { assert(plan); return plan->P; }
int dl_plan_ntensors(const dl_plan *plan) { assert(plan); return plan->nt; }
int dl_plan_nblocks(const dl_plan *plan) { assert(plan); return plan->nb; }
size_t dl_plan_total_numel(const dl_plan *plan) { assert(plan); return plan->total; }

const dl_tensor *dl_plan_tensor(const dl_plan *plan, int i)
{
    assert(plan && i >= 0 && i < plan->nt);
    return &plan->t[i];
}

size_t dl_plan_max_fragment_numel(const dl_plan *plan)
{
    assert(plan);
    return max_of(plan->fnumel, plan->P);
}

size_t dl_plan_fragment_numel(const dl_plan *plan, int p)
{
    assert(plan && p >= 0 && p < plan->P);
    return plan->fnumel[p];
}

const dl_plan_span *dl_plan_fragment_spans(const dl_plan *plan, int p, int *nspans)
{
    assert(plan && p >= 0 && p < plan->P && nspans);
    *nspans = plan->start[p + 1] - plan->start[p];
    return plan->spans + plan->start[p];
}

int dl_plan_tensor_nblocks(const dl_plan *plan, int tensor)
{
    assert(plan && tensor >= 0 && tensor < plan->nt);
    return plan->tstart[tensor + 1] - plan->tstart[tensor];
}

const dl_plan_span *dl_plan_tensor_block(const dl_plan *plan, int tensor, int k)
{
    assert(plan && tensor >= 0 && tensor < plan->nt);
    assert(k >= 0 && k < plan->tstart[tensor + 1] - plan->tstart[tensor]);
    return &plan->spans[plan->by_tensor[plan->tstart[tensor] + k]];
}

int dl_plan_fragment_of(const dl_plan *plan, int tensor, size_t elem)
{
    assert(plan && tensor >= 0 && tensor < plan->nt && elem < plan->t[tensor].numel);
    /* blocks in element order: the last one starting at or before elem */
    int lo = plan->tstart[tensor], hi = plan->tstart[tensor + 1];
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (plan->spans[plan->by_tensor[mid]].start <= elem) lo = mid;
        else hi = mid;
    }
    return plan->spans[plan->by_tensor[lo]].fragment;
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
        memcpy(out + s->offset, params + s->src, s->numel * sizeof(float));
    }
}

void dl_plan_scatter(const dl_plan *plan, int p, const float *in, float *params)
{
    assert(plan && p >= 0 && p < plan->P && in && params);
    for (int k = plan->start[p]; k < plan->start[p + 1]; k++) {
        const dl_plan_span *s = &plan->spans[k];
        memcpy(params + s->src, in + s->offset, s->numel * sizeof(float));
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

#define FP_SPLIT 0xffffffffu /* format 2: the fragment field of a split tensor */

/* Two serialisations, chained through the seed of dl_hash64:
 *
 * Format 1, for a plan in which no tensor is split (nblocks == ntensors):
 * header "DLPLAN01", u64 cfg length, u32 P, u32 ntensors; then the cfg bytes;
 * then per tensor a fixed 84-byte record (name zero-padded to 48, u32 ndim,
 * u32 shape[2] (0 past ndim), u64 offset, u64 numel, u32 kind, u32 fragment).
 * It is the only format there was before blocks, so those plans keep their
 * fingerprints.
 *
 * Format 2, for a plan with at least one split tensor: header "DLPLAN02",
 * u64 cfg length, u32 P, u32 ntensors, u32 nblocks; then the cfg bytes; then
 * per tensor the same 84-byte record with fragment FP_SPLIT when the tensor
 * has more than one block, followed by u32 nblocks of that tensor and per
 * block, in element order, a 20-byte record (u64 start, u64 numel, u32
 * fragment).
 *
 * Format 3, for any table (a manifest's; used for every table formats 1 and
 * 2 cannot hold): header "DLPLAN03", u64 cfg length, u32 P, u32 ntensors,
 * u32 nblocks; then the cfg bytes; then per tensor u32 name length, the name
 * bytes (no terminator), u32 ndim, u64 shape[ndim], u64 offset, u64 numel,
 * u32 kind, u32 nblocks and per block, in element order, the 20-byte block
 * record of format 2. The headers differ, so no plan of one format can hash
 * the bytes of another. */
uint64_t dl_plan_fingerprint_v3(const dl_plan *plan, const void *model_cfg_bytes, size_t len)
{
    assert(plan && (model_cfg_bytes || len == 0));
    unsigned char hdr[28], rec[4 + 8 * DL_TENSOR_NDIM_MAX + 8 + 8 + 4 + 4], brec[20];
    unsigned char *b = hdr;
    memcpy(b, "DLPLAN03", 8);
    b = put_u64(b + 8, (uint64_t)len);
    b = put_u32(b, (uint32_t)plan->P);
    b = put_u32(b, (uint32_t)plan->nt);
    b = put_u32(b, (uint32_t)plan->nb);
    uint64_t h = dl_hash64(hdr, (size_t)(b - hdr), 0);
    if (len) h = dl_hash64(model_cfg_bytes, len, h);
    for (int i = 0; i < plan->nt; i++) {
        const dl_tensor *e = &plan->t[i];
        size_t nl = strnlen(e->name, sizeof e->name);
        put_u32(brec, (uint32_t)nl);
        h = dl_hash64(brec, 4, h);
        h = dl_hash64(e->name, nl, h);
        b = put_u32(rec, (uint32_t)e->ndim);
        for (int d = 0; d < e->ndim; d++) b = put_u64(b, (uint64_t)e->shape[d]);
        b = put_u64(b, (uint64_t)e->offset);
        b = put_u64(b, (uint64_t)e->numel);
        b = put_u32(b, (uint32_t)e->kind);
        int nbk = dl_plan_tensor_nblocks(plan, i);
        b = put_u32(b, (uint32_t)nbk);
        h = dl_hash64(rec, (size_t)(b - rec), h);
        for (int k = 0; k < nbk; k++) {
            const dl_plan_span *s = dl_plan_tensor_block(plan, i, k);
            b = put_u64(brec, (uint64_t)s->start);
            b = put_u64(b, (uint64_t)s->numel);
            b = put_u32(b, (uint32_t)s->fragment);
            h = dl_hash64(brec, sizeof brec, h);
        }
    }
    return h;
}

/* 1 when formats 1 and 2 hold every entry of the table exactly. */
static int fits_v1(const dl_plan *plan)
{
    for (int i = 0; i < plan->nt; i++) {
        const dl_tensor *e = &plan->t[i];
        if (e->ndim > 2 || strnlen(e->name, sizeof e->name) >= 48) return 0;
        for (int d = 0; d < e->ndim; d++)
            if ((uint64_t)e->shape[d] > UINT32_MAX) return 0;
    }
    return 1;
}

uint64_t dl_plan_fingerprint(const dl_plan *plan, const void *model_cfg_bytes, size_t len)
{
    assert(plan && (model_cfg_bytes || len == 0));
    if (!fits_v1(plan)) return dl_plan_fingerprint_v3(plan, model_cfg_bytes, len);
    int v2 = plan->nb != plan->nt;
    unsigned char hdr[28], rec[84], brec[20];
    unsigned char *b = hdr;
    memcpy(b, v2 ? "DLPLAN02" : "DLPLAN01", 8);
    b = put_u64(b + 8, (uint64_t)len);
    b = put_u32(b, (uint32_t)plan->P);
    b = put_u32(b, (uint32_t)plan->nt);
    if (v2) b = put_u32(b, (uint32_t)plan->nb);
    uint64_t h = dl_hash64(hdr, (size_t)(b - hdr), 0);
    if (len) h = dl_hash64(model_cfg_bytes, len, h);
    for (int i = 0; i < plan->nt; i++) {
        const dl_tensor *e = &plan->t[i];
        int nbk = dl_plan_tensor_nblocks(plan, i);
        memset(rec, 0, sizeof rec);
        /* strnlen-bounded copy: bytes after the terminator are not hashed. */
        memcpy(rec, e->name, strnlen(e->name, 48));
        b = put_u32(rec + 48, (uint32_t)e->ndim);
        b = put_u32(b, (uint32_t)e->shape[0]);
        b = put_u32(b, e->ndim > 1 ? (uint32_t)e->shape[1] : 0);
        b = put_u64(b, (uint64_t)e->offset);
        b = put_u64(b, (uint64_t)e->numel);
        b = put_u32(b, (uint32_t)e->kind);
        b = put_u32(b, nbk > 1 ? FP_SPLIT : (uint32_t)dl_plan_tensor_block(plan, i, 0)->fragment);
        assert(b == rec + sizeof rec);
        h = dl_hash64(rec, sizeof rec, h);
        if (!v2) continue;
        put_u32(brec, (uint32_t)nbk);
        h = dl_hash64(brec, 4, h);
        for (int k = 0; k < nbk; k++) {
            const dl_plan_span *s = dl_plan_tensor_block(plan, i, k);
            b = put_u64(brec, (uint64_t)s->start);
            b = put_u64(b, (uint64_t)s->numel);
            b = put_u32(b, (uint32_t)s->fragment);
            assert(b == brec + sizeof brec);
            h = dl_hash64(brec, sizeof brec, h);
        }
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
