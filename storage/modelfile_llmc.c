/* Model files, llm.c checkpoints (train_gpt2.c's fp32 layout, version 3):
 * writer and reader. */
#include "storage/modelfile_int.h"

#include "core/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* llm.c's 16 parameter arrays, in train_gpt2.c's order, as pieces. */
int dl_modelfile_write_llmc(const char *path, const dl_model_config *cfg, const float *params, FILE *progress,
                      const char *label)
{
    int L = cfg->n_layer, C = cfg->n_embd, V = cfg->vocab, T = cfg->seq_len;
    int Vp = (V + LLMC_VPAD - 1) / LLMC_VPAD * LLMC_VPAD;
    int nt = dl_model_tensor_table(cfg, NULL, 0, NULL);
    dl_tensor *tab = dl_xcalloc((size_t)nt, sizeof *tab);
    dl_model_tensor_table(cfg, tab, nt, NULL);
    int32_t hdr[LLMC_HEADER] = {LLMC_MAGIC, LLMC_VERSION, T, V, L, cfg->n_head, C, Vp};
    int fd, rc;
    if ((rc = dl_modelfile_create(path, &fd))) {
        free(tab);
        return rc;
    }
    writer *w = dl_xmalloc(sizeof *w);
    uint64_t total = sizeof hdr + 4ull * ((uint64_t)Vp * C + (uint64_t)T * C + (uint64_t)L * (12ull * C * C + 13ull * C) + 2ull * C);
    *w = (writer){.fd = fd, .path = path, .label = label, .total = total, .progress = progress};
    w->next_report = total / 10;
    rc = dl_modelfile_w_bytes(w, hdr, sizeof hdr);
    piece wte = {.src = params + tab[0].offset, .n = (size_t)V * C};
    piece pad = {.src = NULL, .n = (size_t)(Vp - V) * C};
    piece wpe = {.src = params + tab[1].offset, .n = (size_t)T * C};
    if (!rc) rc = dl_modelfile_w_piece(w, &wte);
    if (!rc) rc = dl_modelfile_w_piece(w, &pad);
    if (!rc) rc = dl_modelfile_w_piece(w, &wpe);
    /* per-layer tensor k of layer l is table entry 2 + 12 l + k; llm.c stacks each k over l */
    for (int k = 0; k < 12 && !rc; k++)
        for (int l = 0; l < L && !rc; l++) {
            const dl_tensor *t = &tab[2 + 12 * l + k];
            piece pc = {.src = params + t->offset, .n = t->numel};
            rc = dl_modelfile_w_piece(w, &pc);
        }
    for (int k = 0; k < 2 && !rc; k++) {
        const dl_tensor *t = &tab[2 + 12 * L + k];
        piece pc = {.src = params + t->offset, .n = t->numel};
        rc = dl_modelfile_w_piece(w, &pc);
    }
    if (!rc) rc = dl_modelfile_w_flush(w);
    free(w);
    free(tab);
    if (rc) close(fd);
    else rc = dl_modelfile_finish(fd, path);
    return rc;
}

int dl_modelfile_read_llmc(const char *path, const unsigned char *map, uint64_t size, const dl_model_config *cfg,
                     float *params, dl_modelfile_info *info)
{
    if (size < LLMC_HEADER * 4)
        return dl_err(DL_ETRUNC, "%s: %llu bytes: shorter than llm.c's 1024-byte header", path, (unsigned long long)size);
    int32_t hd[LLMC_HEADER];
    memcpy(hd, map, sizeof hd);
    if (hd[1] != LLMC_VERSION)
        return dl_err(DL_EFORMAT, "%s: llm.c checkpoint version %d, this build reads version %d (fp32, padded vocabulary)",
                      path, hd[1], LLMC_VERSION);
    dl_model_config fm = {.n_layer = hd[4], .n_head = hd[5], .n_embd = hd[6], .seq_len = hd[2], .vocab = hd[3]};
    dl_model_config chk = fm;
    if (dl_model_config_check(&chk))
        return dl_err(DL_ERANGE, "%s: llm.c header maxT=%d V=%d L=%d NH=%d C=%d: %s", path, hd[2], hd[3], hd[4], hd[5],
                      hd[6], dl_errmsg());
    int64_t Vp = hd[7];
    if (Vp < fm.vocab || Vp > (int64_t)fm.vocab + 1048576)
        return dl_err(DL_ERANGE, "%s: llm.c header padded vocabulary %lld is not in [V=%d, V + 2^20]", path, (long long)Vp,
                      fm.vocab);
    uint64_t L = (uint64_t)fm.n_layer, C = (uint64_t)fm.n_embd, T = (uint64_t)fm.seq_len;
    uint64_t nparams = (uint64_t)Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    uint64_t want = LLMC_HEADER * 4 + 4 * nparams;
    if (size != want)
        return dl_err(size < want ? DL_ETRUNC : DL_EFORMAT,
                      "%s: %llu bytes, but its header (L=%d C=%d Vp=%lld T=%d) implies exactly %llu", path,
                      (unsigned long long)size, fm.n_layer, fm.n_embd, (long long)Vp, fm.seq_len, (unsigned long long)want);
    if (info) {
        info->model = fm;
        snprintf(info->kind, sizeof info->kind, "llmc");
        snprintf(info->dtype, sizeof info->dtype, "F32");
    }
    if (!dl_modelfile_same_model(&fm, cfg)) return dl_modelfile_mismatch(path, &fm, cfg);
    const float *src = (const float *)(map + LLMC_HEADER * 4); /* page-aligned map + 1024 */
    for (uint64_t i = 0; i < nparams; i++)
        if (!isfinite(src[i])) return dl_err(DL_ERANGE, "%s: parameter %llu is %s", path, (unsigned long long)i, isnan(src[i]) ? "NaN" : "Inf");
    int nt = dl_model_tensor_table(cfg, NULL, 0, NULL);
    dl_tensor *tab = dl_xcalloc((size_t)nt, sizeof *tab);
    dl_model_tensor_table(cfg, tab, nt, NULL);
    const float *p = src;
    memcpy(params + tab[0].offset, p, (size_t)cfg->vocab * C * sizeof(float));
    memset(params + tab[0].offset + (size_t)cfg->vocab * C, 0, (size_t)(cfg->padded_vocab - cfg->vocab) * C * sizeof(float));
    p += (size_t)Vp * C;
    memcpy(params + tab[1].offset, p, (size_t)(T * C) * sizeof(float));
    p += T * C;
    for (int k = 0; k < 12; k++)
        for (uint64_t l = 0; l < L; l++) {
            const dl_tensor *t = &tab[2 + 12 * l + (uint64_t)k];
            memcpy(params + t->offset, p, t->numel * sizeof(float));
            p += t->numel;
        }
    for (int k = 0; k < 2; k++) {
        const dl_tensor *t = &tab[2 + 12 * L + (uint64_t)k];
        memcpy(params + t->offset, p, t->numel * sizeof(float));
        p += t->numel;
    }
    free(tab);
    return 0;
}

