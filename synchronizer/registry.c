/* Learner registry: ids in an open-addressing hash (XXH64 of the id, linear
 * probing, backward-shift deletion) over a slot array with a free list, so a
 * message costs one hash lookup, not a scan, and freed slots are reused. */
#include "synchronizer/registry.h"

#include <assert.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "core/err.h"
#include "core/hash.h"

struct dl_registry {
    dl_registry_learner *slots; /* [max], [0, n) touched */
    int n, max, P, used;
    int *free_list, n_free;     /* removed slots, reused first */
    int32_t *table;             /* [mask + 1] slot index, -1 = empty; load <= 1/2 */
    uint32_t mask;
};

int dl_registry_open(int max, int P, dl_registry **out)
{
    assert(out && max >= 1 && P >= 1);
    dl_registry *r = dl_xcalloc(1, sizeof *r);
    r->max = max;
    r->P = P;
    r->slots = dl_xcalloc((size_t)max, sizeof *r->slots);
    r->free_list = dl_xcalloc((size_t)max, sizeof *r->free_list);
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
    dl_registry *r = *rp;
    for (int i = 0; i < r->n; i++) {
        dl_wire_queue_release(&r->slots[i].outq);
        free(r->slots[i].bases);
        free(r->slots[i].nbases);
        free(r->slots[i].owed);
        free(r->slots[i].given);
        free(r->slots[i].pushed_ns);
    }
    free(r->slots);
    free(r->free_list);
    free(r->table);
    free(r);
    *rp = NULL;
}

static uint32_t home(const dl_registry *r, const char *id)
{
    return (uint32_t)dl_hash64(id, strlen(id), 0) & r->mask;
}

/* Table position of id: its slot's position, or the empty one it would take. */
static uint32_t probe(const dl_registry *r, const char *id)
{
    uint32_t h = home(r, id);
    while (r->table[h] >= 0 && strcmp(r->slots[r->table[h]].id, id)) h = (h + 1) & r->mask;
    return h;
}

int dl_registry_find(const dl_registry *r, const char *id)
{
    return r->table[probe(r, id)];
}

int dl_registry_add(dl_registry *r, const char *id, int64_t now_wall)
{
    assert(id && id[0] && strlen(id) <= DL_WIRE_LEARNER_ID_MAX);
    uint32_t h = probe(r, id);
    if (r->table[h] >= 0) return r->table[h];
    int slot;
    if (r->n_free) slot = r->free_list[--r->n_free];
    else if (r->n < r->max) slot = r->n++;
    else return dl_err(DL_ERANGE, "the synchronizer already serves %d learners (max_learners)", r->max);
    dl_registry_learner *l = &r->slots[slot];
    dl_registry_base *bases = l->bases;
    uint32_t *nbases = l->nbases;
    uint8_t *owed = l->owed;
    uint64_t *given = l->given;
    int64_t *pushed_ns = l->pushed_ns;
    memset(l, 0, sizeof *l);
    l->bases = bases ? bases : dl_xcalloc((size_t)r->P * DL_REGISTRY_BASES, sizeof *l->bases);
    l->nbases = nbases ? nbases : dl_xcalloc((size_t)r->P, sizeof *l->nbases);
    l->owed = owed ? owed : dl_xcalloc((size_t)r->P, 1);
    memset(l->nbases, 0, (size_t)r->P * sizeof *l->nbases);
    memset(l->owed, 0, (size_t)r->P);
    l->given = given ? given : dl_xcalloc((size_t)r->P, sizeof *l->given);
    memset(l->given, 0, (size_t)r->P * sizeof *l->given);
    l->pushed_ns = pushed_ns ? pushed_ns : dl_xcalloc((size_t)r->P, sizeof *l->pushed_ns);
    memset(l->pushed_ns, 0, (size_t)r->P * sizeof *l->pushed_ns);
    l->used = 1;
    l->train_loss = NAN; /* no push yet */
    memcpy(l->id, id, strlen(id) + 1);
    l->first_seen_wall = now_wall;
    r->table[h] = slot;
    r->used++;
    return slot;
}

void dl_registry_remove(dl_registry *r, int slot)
{
    assert(slot >= 0 && slot < r->n && r->slots[slot].used);
    dl_registry_learner *l = &r->slots[slot];
    /* backward-shift deletion keeps every probe chain unbroken */
    uint32_t i = probe(r, l->id);
    assert(r->table[i] == slot);
    r->table[i] = -1;
    for (uint32_t j = (i + 1) & r->mask; r->table[j] >= 0; j = (j + 1) & r->mask) {
        uint32_t k = home(r, r->slots[r->table[j]].id);
        /* move j back into the hole at i unless its home lies cyclically in (i, j] */
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        r->table[i] = r->table[j];
        r->table[j] = -1;
        i = j;
    }
    dl_wire_queue_release(&l->outq);
    l->used = 0;
    l->id[0] = 0;
    l->route_len = 0;
    l->user[0] = 0;
    r->free_list[r->n_free++] = slot;
    r->used--;
}

int dl_registry_count(const dl_registry *r) { return r->n; }
int dl_registry_used(const dl_registry *r) { return r->used; }
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

void dl_registry_set_route(dl_registry *r, int slot, const uint8_t *route, size_t len, const char *user)
{
    assert(len > 0 && len <= DL_WIRE_ROUTING_ID_MAX && user && strlen(user) <= DL_WIRE_USER_ID_MAX);
    dl_registry_learner *l = dl_registry_get(r, slot);
    int same = l->route_len == len && !memcmp(l->route, route, len) && l->outq;
    memcpy(l->route, route, len);
    l->route_len = len;
    snprintf(l->user, sizeof l->user, "%s", user);
    l->probe_ns = 0;
    if (same) return; /* the same connection again: what it holds stays counted against it */
    dl_wire_queue_release(&l->outq);
    l->outq = dl_wire_queue_new();
    l->outq_busy_ns = 0;
}

void dl_registry_clear_route(dl_registry *r, int slot)
{
    dl_registry_learner *l = dl_registry_get(r, slot);
    l->route_len = 0;
    /* the queue counter stays: what is queued there still counts until libzmq frees it */
}

int dl_registry_route_is(const dl_registry *r, int slot, const uint8_t *route, size_t len)
{
    const dl_registry_learner *l = dl_registry_cget(r, slot);
    return l->route_len == len && len > 0 && memcmp(l->route, route, len) == 0;
}

void dl_registry_base_add(dl_registry *r, int slot, int p, uint64_t version, int64_t ns)
{
    assert(p >= 0 && p < r->P);
    dl_registry_learner *l = dl_registry_get(r, slot);
    l->bases[(size_t)p * DL_REGISTRY_BASES + l->nbases[p] % DL_REGISTRY_BASES] = (dl_registry_base){version, ns};
    l->nbases[p]++;
}

int dl_registry_given(const dl_registry *r, int slot, int p, uint64_t *version)
{
    assert(p >= 0 && p < r->P);
    uint64_t g = dl_registry_cget(r, slot)->given[p];
    if (g) *version = g - 1;
    return g != 0;
}

void dl_registry_given_set(dl_registry *r, int slot, int p, uint64_t version)
{
    assert(p >= 0 && p < r->P && version < UINT64_MAX);
    dl_registry_get(r, slot)->given[p] = version + 1;
}

void dl_registry_given_clear(dl_registry *r, int slot, int p)
{
    assert(p >= -1 && p < r->P);
    dl_registry_learner *l = dl_registry_get(r, slot);
    if (p >= 0) l->given[p] = 0;
    else memset(l->given, 0, (size_t)r->P * sizeof *l->given);
}

int64_t dl_registry_base_ns(const dl_registry *r, int slot, int p, uint64_t version, int *found)
{
    assert(p >= 0 && p < r->P);
    const dl_registry_learner *l = dl_registry_cget(r, slot);
    uint32_t n = l->nbases[p] < DL_REGISTRY_BASES ? l->nbases[p] : DL_REGISTRY_BASES;
    *found = 0;
    if (!n) return 0;
    const dl_registry_base *b = &l->bases[(size_t)p * DL_REGISTRY_BASES];
    int64_t oldest = INT64_MAX;
    /* newest first */
    for (uint32_t k = 0; k < n; k++) {
        const dl_registry_base *e = &b[(l->nbases[p] - 1 - k) % DL_REGISTRY_BASES];
        if (e->version == version) {
            *found = 1;
            return e->ns;
        }
        if (e->ns < oldest) oldest = e->ns;
    }
    return oldest;
}
