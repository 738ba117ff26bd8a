#include "core/codec.h"

#include <stdio.h>
#include <string.h>

#include "core/err.h"

int dl_codec_is_block(dl_codec_id id)
{
    return id == DL_CODEC_INT8 || id == DL_CODEC_INT4 || id == DL_CODEC_E3M0 || id == DL_CODEC_TOPK;
}

static const char *const names[DL_CODEC_N] = {NULL, "fp32", "bf16", "int8", "int4", "e3m0", "topk"};

const char *dl_codec_name(int id)
{
    return id >= 1 && id < DL_CODEC_N ? names[id] : "unknown";
}

int dl_codec_parse(const char *name, dl_codec_id *out)
{
    for (int i = 1; i < DL_CODEC_N; i++)
        if (name && !strcmp(name, names[i])) {
            *out = (dl_codec_id)i;
            return 0;
        }
    return dl_err(DL_EINVAL, "unknown codec '%s' (fp32|bf16|int8|int4|e3m0|topk)", name ? name : "");
}

int dl_codec_check(const dl_codec *c, char *why, size_t cap)
{
    char tmp[160];
    if (!why) why = tmp, cap = sizeof tmp;
    why[0] = 0;
    if ((int)c->id < 1 || (int)c->id >= DL_CODEC_N)
        snprintf(why, cap, "unknown codec %d", (int)c->id);
    else if (dl_codec_is_block(c->id)) {
        if (c->block < DL_CODEC_BLOCK_MIN || c->block > DL_CODEC_BLOCK_MAX || c->block % 2)
            snprintf(why, cap, "block_size %u of %s must be even and in [%u, %u]", c->block, names[c->id],
                     DL_CODEC_BLOCK_MIN, DL_CODEC_BLOCK_MAX);
        else if (c->id == DL_CODEC_TOPK && (c->topk < 1 || c->topk > c->block))
            snprintf(why, cap, "topk %u must be in [1, block_size %u]", c->topk, c->block);
        else if (c->id != DL_CODEC_TOPK && c->topk != 0)
            snprintf(why, cap, "topk %u must be 0 for %s", c->topk, names[c->id]);
    } else if (c->block != 0 || c->topk != 0) {
        snprintf(why, cap, "block_size %u and topk %u must be 0 for %s", c->block, c->topk, names[c->id]);
    }
    if (why[0]) return dl_err(DL_EINVAL, "%s", why);
    return 0;
}

uint64_t dl_codec_bytes(const dl_codec *c, uint64_t n)
{
    if (n == 0 || n > ((uint64_t)1 << 58) || dl_codec_check(c, NULL, 0)) return 0;
    uint64_t b = c->block, full = b ? n / b : 0, last = b ? n % b : 0, blocks = full + (last != 0);
    switch (c->id) {
    case DL_CODEC_FP32: return 4 * n;
    case DL_CODEC_BF16: return 2 * n;
    case DL_CODEC_INT8: return 4 * blocks + n;
    case DL_CODEC_INT4:
    case DL_CODEC_E3M0: return 4 * blocks + full * (b / 2) + (last + 1) / 2;
    case DL_CODEC_TOPK: return 6 * (full * c->topk + (last < c->topk ? last : c->topk));
    }
    return 0;
}

uint64_t dl_codec_chunk_numel(const dl_codec *c, uint64_t bytes)
{
    uint64_t unit = dl_codec_is_block(c->id) ? c->block : 1, per = dl_codec_bytes(c, unit);
    return per ? bytes / per * unit : 0;
}

double dl_codec_bits(const dl_codec *c, uint64_t n)
{
    uint64_t bytes = dl_codec_bytes(c, n);
    return n ? 8.0 * (double)bytes / (double)n : 0.0;
}
