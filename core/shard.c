/* The shard layout rule: fragment p belongs to shard p % S. */
#include "core/shard.h"

#include <assert.h>

#include "core/err.h"

int dl_shard_of(int p, int shards)
{
    assert(p >= 0);
    return shards > 1 ? p % shards : 0;
}

int dl_shard_owns(int p, int shard, int shards) { return dl_shard_of(p, shards) == (shards > 1 ? shard : 0); }

int dl_shard_count(int P, int shard, int shards)
{
    int n = 0;
    for (int p = 0; p < P; p++) n += dl_shard_owns(p, shard, shards);
    return n;
}

int dl_shard_fragments(int P, int shard, int shards, int *out)
{
    int n = 0;
    for (int p = 0; p < P; p++)
        if (dl_shard_owns(p, shard, shards)) out[n++] = p;
    return n;
}

int dl_shard_check(int P, int shard, int shards)
{
    if (shards <= 1) {
        if (shard != 0) return dl_err(DL_EINVAL, "shard %d without shards (an unsharded synchronizer is shard 0)", shard);
        return 0;
    }
    if (shards > P) return dl_err(DL_EINVAL, "shards %d > fragments %d: a shard would own no fragment", shards, P);
    if (shard < 0 || shard >= shards) return dl_err(DL_EINVAL, "shard %d is not in [0, shards %d)", shard, shards);
    return 0;
}
