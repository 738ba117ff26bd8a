/* Learner registry: ids in an open-addressing hash (XXH64 of the id) over a
 * dense slot array, so a message costs one hash lookup, not a scan. */
#include "synchronizer/registry.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/hash.h"

struct dl_registry {
    dl_registry_learner *slots; /* [max], [0, n) used */
    int n, max;
    int32_t *table;             /* [mask + 1] slot index, -1 = empty; load <= 1/2 */
    uint32_t mask;
};

int dl_registry_open(int max, dl_registry **out)
{
    assert(out && max >= 1);
    dl_registry *r = dl_xcalloc(1, sizeof *r);
    r->max = max;
    r->slots = dl_xcalloc((size_t)max, sizeof *r->slots);
    uint32_t cap = 4;
    while (cap < 2u * (uint32_t)max) cap <<= 1;
    r->mask = cap - 1;
    r->table = dl_xmalloc((size_t)cap * sizeof *r->table);
    memset(r->table, 0xff, (size_t)cap * sizeof *r->table);
    *out = r;
    return 0;
}

void dl_registry_close(dl_registry **rp)
{
    if (!rp || !*rp) return;
    free((*rp)->slots);
    free((*rp)->table);
    free(*rp);
    *rp = NULL;
}

/* Table position of id: its slot's position, or the empty one it would take. */
static uint32_t probe(const dl_registry *r, const char *id)
{
    uint32_t h = (uint32_t)dl_hash64(id, strlen(id), 0) & r->mask;
    while (r->table[h] >= 0 && strcmp(r->slots[r->table[h]].id, id)) h = (h + 1) & r->mask;
    return h;
}

int dl_registry_find(const dl_registry *r, const char *id)
{
    return r->table[probe(r, id)];
}

int dl_registry_add(dl_registry *r, const char *id, int64_t now_wall)
{
    assert(id && strlen(id) <= DL_WIRE_LEARNER_ID_MAX);
    uint32_t h = probe(r, id);
    if (r->table[h] >= 0) return r->table[h];
    if (r->n == r->max) return dl_err(DL_ERANGE, "the synchronizer already serves %d learners", r->max);
    dl_registry_learner *l = &r->slots[r->n];
    memset(l, 0, sizeof *l);
    memcpy(l->id, id, strlen(id) + 1);
    l->first_seen_wall = now_wall;
    r->table[h] = r->n;
    return r->n++;
}

int dl_registry_count(const dl_registry *r) { return r->n; }
int dl_registry_max(const dl_registry *r) { return r->max; }

dl_registry_learner *dl_registry_get(dl_registry *r, int slot)
{
    assert(slot >= 0 && slot < r->n);
    return &r->slots[slot];
}

const dl_registry_learner *dl_registry_cget(const dl_registry *r, int slot)
{
    assert(slot >= 0 && slot < r->n);
    return &r->slots[slot];
}
