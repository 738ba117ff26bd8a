/* Validation loss of a store's global model (see evaluate.h). */
#include "gpt/evaluate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "gpt/data.h"
#include "gpt/gpt.h"

struct dl_evaluate {
    dl_model_config m;
    dl_gpt *g;
    dl_data *d;
    int B, batches;
    int32_t *inp, *tgt; /* [B * T] */
    float *frag;        /* one fragment's params, read from the store */
    size_t frag_cap;
};

int dl_evaluate_open(const dl_model_config *m, const dl_evaluate_opts *o, dl_evaluate **out)
{
    *out = NULL;
    if (o->batch < 1 || o->seqs < 1)
        return dl_err(DL_EINVAL, "evaluation batch %d and sequences %d must be >= 1", o->batch, o->seqs);
    dl_evaluate *e = dl_xcalloc(1, sizeof *e);
    e->m = *m;
    e->B = o->batch;
    e->batches = (o->seqs + o->batch - 1) / o->batch;
    int rc = dl_gpt_open(m, e->B, &e->g);
    const char *fmt = o->data_format ? o->data_format : "auto";
    dl_data_opts dop = {.path = o->data, .format = fmt, .seq_len = m->seq_len, .vocab = m->vocab,
                        .val_frac = o->val_frac, .seed = 0};
    if (!rc && (rc = dl_data_open(&dop, &e->d)) == DL_ERANGE && strstr(dl_errmsg(), ">= vocab"))
        rc = dl_err(DL_EMISMATCH, "the store's model has vocab %d, but the data %s holds larger tokens (%s): give "
                                  "the data the run trained on", m->vocab, o->data, dl_errmsg());
    if (!rc && !strcmp(dl_data_kind(e->d), "text") && m->vocab != 256 && !strcmp(fmt, "auto"))
        rc = dl_err(DL_EMISMATCH, "the store's model has vocab %d, but the data %s is text (one token per byte: "
                                  "vocab 256): give the data the run trained on (e.g. its llm.c .bin token shards; "
                                  "data_format text if it was text)", m->vocab, o->data);
    if (rc) {
        dl_evaluate_close(&e);
        return rc;
    }
    size_t bt = (size_t)e->B * (size_t)m->seq_len;
    e->inp = dl_xmalloc(bt * sizeof(int32_t));
    e->tgt = dl_xmalloc(bt * sizeof(int32_t));
    *out = e;
    return 0;
}

int dl_evaluate_load(dl_evaluate *e, dl_store *s, const dl_plan *plan, uint64_t *version_sum)
{
    size_t need = dl_plan_max_fragment_numel(plan);
    if (need > e->frag_cap) {
        free(e->frag);
        e->frag = dl_xmalloc(need * sizeof(float));
        e->frag_cap = need;
    }
    float *params = dl_gpt_params(e->g);
    uint64_t sum = 0;
    for (int p = 0; p < dl_plan_P(plan); p++) {
        uint64_t v = 0;
        DL_TRY(dl_store_read_fragment(s, (uint32_t)p, &v, e->frag, NULL));
        dl_plan_scatter(plan, p, e->frag, params);
        sum += v;
    }
    *version_sum = sum;
    return 0;
}

int dl_evaluate_run(dl_evaluate *e, const atomic_int *stop, double *loss)
{
    double sum = 0;
    for (int i = 0; i < e->batches; i++) {
        if (stop && atomic_load(stop))
            return dl_err(DL_EAGAIN, "evaluation stopped after %d of %d batches", i, e->batches);
        dl_data_val_batch(e->d, (uint64_t)i, e->B, e->inp, e->tgt);
        sum += dl_gpt_forward(e->g, e->inp, e->tgt, e->B, e->m.seq_len);
    }
    *loss = sum / e->batches;
    return 0;
}

int dl_evaluate_dump(dl_evaluate *e, const char *path)
{
    const int B = e->B, T = e->m.seq_len;
    int32_t hdr[8] = {0x51534c44, 1, e->batches, B, T, e->m.vocab, 0, 0};
    FILE *f = fopen(path, "wb");
    if (!f) return dl_err(DL_EIO, "cannot create %s: %s", path, strerror(errno));
    int ok = fwrite(hdr, sizeof hdr, 1, f) == 1;
    for (int i = 0; ok && i < e->batches; i++) {
        dl_data_val_batch(e->d, (uint64_t)i, B, e->inp, e->tgt);
        for (int b = 0; ok && b < B; b++)
            ok = fwrite(e->inp + (size_t)b * T, sizeof(int32_t), (size_t)T, f) == (size_t)T &&
                 fwrite(e->tgt + (size_t)b * T, sizeof(int32_t), (size_t)T, f) == (size_t)T;
    }
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : dl_err(DL_EIO, "write %s", path);
}

int dl_evaluate_seqs(const dl_evaluate *e) { return e->batches * e->B; }
int dl_evaluate_batches(const dl_evaluate *e) { return e->batches; }

void dl_evaluate_close(dl_evaluate **ep)
{
    if (!ep || !*ep) return;
    dl_evaluate *e = *ep;
    dl_gpt_close(&e->g);
    dl_data_close(&e->d);
    free(e->inp);
    free(e->tgt);
    free(e->frag);
    free(e);
    *ep = NULL;
}
