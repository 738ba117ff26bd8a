/* The model's manifest (see manifest.h): building and checking the tensor list, the GPT-2 tag, plan and
 * fingerprint, the first difference between two manifests, and the JSON form. */
#include "core/manifest.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/plan.h"
#include "core/json.h"

struct dl_manifest {
    dl_tensor *t;   /* [n] in buffer order, offsets and numel filled */
    int n, cap;
    size_t numel;   /* floats in all tensors */
    int gpt;        /* 1: the table is cfg's (dl_manifest_from_gpt / set_gpt) */
    dl_model_config cfg;
};

int dl_manifest_open(dl_manifest **out)
{
    *out = dl_try_calloc(1, sizeof **out);
    if (!*out) return dl_err(DL_ENOMEM, "manifest: out of memory");
    return 0;
}

void dl_manifest_close(dl_manifest **m)
{
    if (!m || !*m) return;
    free((*m)->t);
    free(*m);
    *m = NULL;
}

/* The name as a message can show it: printable bytes kept, the rest '?'. */
static const char *shown(const char *name, char *buf, size_t cap)
{
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++) buf[i] = (unsigned char)name[i] < 0x20 || name[i] == 0x7f ? '?' : name[i];
    buf[i] = '\0';
    return buf;
}

int dl_manifest_add(dl_manifest *m, const char *name, int ndim, const int64_t *shape, int role)
{
    int i = m->n;
    char nb[64];
    if (m->gpt) return dl_err(DL_EINVAL, "manifest: a GPT-2 manifest's tensors are fixed by its config");
    if (m->n >= DL_MANIFEST_TENSORS_MAX)
        return dl_err(DL_EINVAL, "manifest: more than %d tensors", DL_MANIFEST_TENSORS_MAX);
    if (!name || !name[0]) return dl_err(DL_EINVAL, "manifest: tensor %d has an empty name", i);
    size_t len = strnlen(name, DL_TENSOR_NAME_MAX);
    if (len >= DL_TENSOR_NAME_MAX)
        return dl_err(DL_EINVAL, "manifest: tensor %d ('%s...') has a name longer than %d bytes", i,
                      shown(name, nb, 40), DL_TENSOR_NAME_MAX - 1);
    for (size_t k = 0; k < len; k++)
        if ((unsigned char)name[k] < 0x20 || name[k] == 0x7f)
            return dl_err(DL_EINVAL, "manifest: tensor %d ('%s') has a control character in its name", i,
                          shown(name, nb, sizeof nb));
    if (ndim < 1 || ndim > DL_TENSOR_NDIM_MAX)
        return dl_err(DL_EINVAL, "manifest: tensor '%s' has %d dimensions, want 1 to %d", name, ndim,
                      DL_TENSOR_NDIM_MAX);
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1)
            return dl_err(DL_EINVAL, "manifest: tensor '%s' has dimension %d = %lld, want >= 1", name, d,
                          (long long)shape[d]);
        if ((uint64_t)shape[d] > DL_MANIFEST_NUMEL_MAX / numel)
            return dl_err(DL_EINVAL, "manifest: tensor '%s' has more than 2^40 elements", name);
        numel *= (uint64_t)shape[d];
    }
    if (numel > DL_MANIFEST_NUMEL_MAX - m->numel)
        return dl_err(DL_EINVAL, "manifest: the model passes 2^40 floats at tensor '%s'", name);
    if (role != DL_TENSOR_MATRIX && role != DL_TENSOR_VECTOR && role != DL_TENSOR_EMBED)
        return dl_err(DL_EINVAL, "manifest: tensor '%s' has role %d, want matrix, vector or embedding", name, role);
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 16;
        dl_tensor *t = dl_try_realloc(m->t, (size_t)cap * sizeof *t);
        if (!t) return dl_err(DL_ENOMEM, "manifest: out of memory at tensor %d", i);
        m->t = t;
        m->cap = cap;
    }
    dl_tensor *e = &m->t[m->n++];
    memset(e, 0, sizeof *e);
    memcpy(e->name, name, len);
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++) e->shape[d] = shape[d];
    e->offset = m->numel;
    e->numel = (size_t)numel;
    e->kind = role;
    m->numel += (size_t)numel;
    return 0;
}

static int name_cmp(const void *a, const void *b)
{
    const dl_tensor *x = *(const dl_tensor *const *)a, *y = *(const dl_tensor *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x > y) - (x < y);
}

int dl_manifest_check(const dl_manifest *m)
{
    if (m->n == 0) return dl_err(DL_EINVAL, "manifest: no tensors");
    const dl_tensor **s = dl_try_malloc((size_t)m->n * sizeof *s);
    if (!s) return dl_err(DL_ENOMEM, "manifest: out of memory checking %d names", m->n);
    for (int i = 0; i < m->n; i++) s[i] = &m->t[i];
    qsort(s, (size_t)m->n, sizeof *s, name_cmp); /* equal names: table order */
    int rc = 0;
    for (int i = 1; i < m->n && !rc; i++)
        if (strcmp(s[i - 1]->name, s[i]->name) == 0)
            rc = dl_err(DL_EINVAL, "manifest: tensors %d and %d are both named '%s'", (int)(s[i - 1] - m->t),
                        (int)(s[i] - m->t), s[i]->name);
    free(s);
    return rc;
}

/* ---------------------------------------------------------------- GPT-2 */

static int gpt_table(const dl_model_config *cfg_in, dl_model_config *cfg, dl_tensor **tab, int *n)
{
    *cfg = *cfg_in;
    DL_TRY(dl_model_config_check(cfg));
    *n = dl_model_tensor_table(cfg, NULL, 0, NULL);
    *tab = dl_try_calloc((size_t)*n, sizeof **tab);
    if (!*tab) return dl_err(DL_ENOMEM, "manifest: out of memory for a GPT-2 table of %d tensors", *n);
    dl_model_tensor_table(cfg, *tab, *n, NULL);
    return 0;
}

int dl_manifest_from_gpt(const dl_model_config *cfg_in, dl_manifest **out)
{
    *out = NULL;
    dl_model_config cfg;
    dl_tensor *tab;
    int n;
    DL_TRY(gpt_table(cfg_in, &cfg, &tab, &n));
    dl_manifest *m = dl_try_calloc(1, sizeof *m);
    if (!m) {
        free(tab);
        return dl_err(DL_ENOMEM, "manifest: out of memory");
    }
    m->t = tab;
    m->n = m->cap = n;
    for (int i = 0; i < n; i++) m->numel += tab[i].numel;
    m->gpt = 1;
    m->cfg = cfg;
    *out = m;
    return 0;
}

static int same_tensor(const dl_tensor *a, const dl_tensor *b)
{
    if (strcmp(a->name, b->name) || a->ndim != b->ndim || a->kind != b->kind) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

int dl_manifest_set_gpt(dl_manifest *m, const dl_model_config *cfg_in)
{
    dl_manifest *g;
    DL_TRY(dl_manifest_from_gpt(cfg_in, &g));
    int same = m->n == g->n;
    for (int i = 0; i < g->n && same; i++) same = same_tensor(&g->t[i], &m->t[i]);
    int rc = 0;
    if (!same) {
        char msg[512];
        int nd = dl_manifest_diff(m, g, "the GPT-2 table", msg, sizeof msg);
        rc = dl_err(DL_EMISMATCH,
                    "manifest: not the GPT-2 table of n_layer %d n_embd %d seq_len %d vocab %d (%d tensor%s; "
                    "first: %s)",
                    g->cfg.n_layer, g->cfg.n_embd, g->cfg.seq_len, g->cfg.vocab, nd, nd == 1 ? " differs" : "s differ", msg);
    } else {
        m->gpt = 1;
        m->cfg = g->cfg;
    }
    dl_manifest_close(&g);
    return rc;
}

int dl_manifest_gpt(const dl_manifest *m, dl_model_config *cfg)
{
    if (m->gpt && cfg) *cfg = m->cfg;
    return m->gpt;
}

/* ---------------------------------------------------------------- accessors, plan, fingerprint */

int dl_manifest_ntensors(const dl_manifest *m) { return m->n; }
const dl_tensor *dl_manifest_table(const dl_manifest *m) { return m->t; }
size_t dl_manifest_numel(const dl_manifest *m) { return m->numel; }

const dl_tensor *dl_manifest_tensor(const dl_manifest *m, int i)
{
    if (i < 0 || i >= m->n) return NULL;
    return &m->t[i];
}

int dl_manifest_plan_open(const dl_manifest *m, int P, dl_plan **out)
{
    *out = NULL;
    if (m->gpt) return dl_model_plan_open(&m->cfg, P, out);
    DL_TRY(dl_manifest_check(m));
    return dl_plan_build(m->t, m->n, P, out);
}

uint64_t dl_manifest_fingerprint(const dl_manifest *m, const dl_plan *plan)
{
    if (m->gpt) return dl_model_fingerprint(&m->cfg, plan);
    return dl_plan_fingerprint_v3(plan, NULL, 0);
}

/* ---------------------------------------------------------------- difference */

const char *dl_manifest_role_name(int role)
{
    switch (role) {
    case DL_TENSOR_MATRIX: return "matrix";
    case DL_TENSOR_VECTOR: return "vector";
    case DL_TENSOR_EMBED: return "embedding";
    default: return "?";
    }
}

int dl_manifest_role_parse(const char *name)
{
    if (!strcmp(name, "matrix")) return DL_TENSOR_MATRIX;
    if (!strcmp(name, "vector")) return DL_TENSOR_VECTOR;
    if (!strcmp(name, "embedding") || !strcmp(name, "embed")) return DL_TENSOR_EMBED;
    return -1;
}

const char *dl_manifest_shape_str(const dl_tensor *t, char *buf, size_t cap)
{
    size_t n = 0;
    if (cap == 0) return buf;
    buf[0] = '\0';
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int d = 0; d < t->ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

static void put(char *msg, size_t cap, const char *fmt, ...)
{
    if (!msg || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
}

static void gpt_str(const dl_manifest *m, char *buf, size_t cap)
{
    if (!m->gpt) snprintf(buf, cap, "not a GPT-2 config");
    else
        snprintf(buf, cap, "GPT-2 n_layer %d n_head %d n_embd %d seq_len %d vocab %d", m->cfg.n_layer,
                 m->cfg.n_head, m->cfg.n_embd, m->cfg.seq_len, m->cfg.vocab);
}

int dl_manifest_diff(const dl_manifest *a, const dl_manifest *b, const char *label, char *msg, size_t cap)
{
    int count = 0, first = 1;
    int n = a->n < b->n ? a->n : b->n;
    if (msg && cap) msg[0] = '\0';
    for (int i = 0; i < n; i++) {
        const dl_tensor *x = &a->t[i], *y = &b->t[i];
        if (same_tensor(x, y)) continue;
        if (first) {
            char s1[128], s2[128];
            if (strcmp(x->name, y->name))
                put(msg, cap, "tensor %d of %d is '%s' here, '%s' in %s", i, a->n, x->name, y->name, label);
            else if (x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof x->shape))
                put(msg, cap, "tensor '%s' (%d of %d) has shape %s here, %s in %s", x->name, i, a->n,
                    dl_manifest_shape_str(x, s1, sizeof s1), dl_manifest_shape_str(y, s2, sizeof s2), label);
            else
                put(msg, cap, "tensor '%s' (%d of %d) has role %s here, %s in %s", x->name, i, a->n,
                    dl_manifest_role_name(x->kind), dl_manifest_role_name(y->kind), label);
            first = 0;
        }
        count++;
    }
    if (a->n != b->n) {
        const dl_manifest *l = a->n > b->n ? a : b;
        if (first)
            put(msg, cap, "%d tensors here, %d in %s: tensor %d '%s' is only %s", a->n, b->n, label, n,
                l->t[n].name, l == a ? "here" : "there");
        first = 0;
        count += a->n > b->n ? a->n - b->n : b->n - a->n;
    }
    if (count == 0 && (a->gpt != b->gpt || (a->gpt && memcmp(&a->cfg, &b->cfg, sizeof a->cfg)))) {
        char s1[160], s2[160];
        gpt_str(a, s1, sizeof s1);
        gpt_str(b, s2, sizeof s2);
        put(msg, cap, "the same tensors, but %s here, %s in %s", s1, s2, label);
        count = 1;
    }
    return count;
}

/* ---------------------------------------------------------------- JSON */

typedef struct {
    char *b;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *s, const char *fmt, ...)
{
    if (s->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(s->b ? s->b + s->n : NULL, s->b ? s->cap - s->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            s->oom = 1;
            return;
        }
        if (s->b && s->n + (size_t)k < s->cap) {
            s->n += (size_t)k;
            return;
        }
        size_t cap = s->cap ? s->cap : 4096;
        while (cap <= s->n + (size_t)k) cap *= 2;
        char *b = dl_try_realloc(s->b, cap);
        if (!b) {
            s->oom = 1;
            return;
        }
        s->b = b;
        s->cap = cap;
    }
}

/* A JSON string: quote and backslash escaped (names hold no control
 * characters, dl_manifest_add refuses them); bytes >= 0x80 as they are. */
static void sb_str(sbuf *s, const char *str)
{
    sb_add(s, "\"");
    for (const char *p = str; *p; p++) {
        if (*p == '"' || *p == '\\') sb_add(s, "\\%c", *p);
        else sb_add(s, "%c", *p);
    }
    sb_add(s, "\"");
}

int dl_manifest_to_json(const dl_manifest *m, char **out, size_t *len)
{
    *out = NULL;
    if (len) *len = 0;
    DL_TRY(dl_manifest_check(m));
    sbuf s = {0};
    sb_add(&s, "{\"dloco_manifest\": 1,\n");
    if (m->gpt)
        sb_add(&s, " \"gpt\": {\"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d, \"seq_len\": %d, \"vocab\": %d},\n",
               m->cfg.n_layer, m->cfg.n_head, m->cfg.n_embd, m->cfg.seq_len, m->cfg.vocab);
    sb_add(&s, " \"tensors\": [\n");
    for (int i = 0; i < m->n; i++) {
        const dl_tensor *t = &m->t[i];
        sb_add(&s, "  {\"name\": ");
        sb_str(&s, t->name);
        sb_add(&s, ", \"shape\": [");
        for (int d = 0; d < t->ndim; d++) sb_add(&s, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        sb_add(&s, "], \"role\": \"%s\"}%s\n", dl_manifest_role_name(t->kind), i + 1 < m->n ? "," : "");
    }
    sb_add(&s, " ]}\n");
    if (s.oom) {
        free(s.b);
        return dl_err(DL_ENOMEM, "manifest: out of memory writing the JSON of %d tensors", m->n);
    }
    *out = s.b;
    if (len) *len = s.n;
    return 0;
}

/* Largest integer a JSON number (a double) holds exactly. */
#define JSON_INT_MAX 9007199254740992.0 /* 2^53 */

static int json_int(const dl_json *v, double lo, double hi, int64_t *out)
{
    if (!v || v->type != DL_JSON_NUM || !isfinite(v->num) || v->num != floor(v->num) || v->num < lo || v->num > hi)
        return -1;
    *out = (int64_t)v->num;
    return 0;
}

/* The first member name that appears twice in object o, or NULL: JSON
 * leaves duplicates undefined, and a reader that took the first could see
 * another manifest than one that took the last. */
static const char *dup_member(const dl_json *o)
{
    for (const dl_json *a = o->child; a; a = a->next)
        for (const dl_json *b = a->next; b; b = b->next)
            if (!strcmp(a->key, b->key)) return a->key;
    return NULL;
}

static int from_tree(const dl_json *root, dl_manifest **out)
{
    if (!root || root->type != DL_JSON_OBJ) return dl_err(DL_EFORMAT, "manifest JSON: not an object");
    const char *dup = dup_member(root);
    if (dup) return dl_err(DL_EFORMAT, "manifest JSON: member \"%s\" appears twice", dup);
    int64_t ver;
    if (json_int(dl_json_get(root, "dloco_manifest"), 0, JSON_INT_MAX, &ver) || ver != 1)
        return dl_err(DL_EFORMAT, "manifest JSON: \"dloco_manifest\": 1 missing (this build reads version 1)");
    for (const dl_json *k = root->child; k; k = k->next)
        if (strcmp(k->key, "dloco_manifest") && strcmp(k->key, "gpt") && strcmp(k->key, "tensors"))
            return dl_err(DL_EFORMAT, "manifest JSON: unknown member \"%s\" (dloco_manifest, gpt, tensors)", k->key);
    const dl_json *ts = dl_json_get(root, "tensors");
    if (!ts || ts->type != DL_JSON_ARR) return dl_err(DL_EFORMAT, "manifest JSON: \"tensors\" is not an array");
    dl_manifest *m;
    DL_TRY(dl_manifest_open(&m));
    int rc = 0, i = 0;
    for (const dl_json *t = ts->child; t && !rc; t = t->next, i++) {
        if (t->type != DL_JSON_OBJ) {
            rc = dl_err(DL_EFORMAT, "manifest JSON: tensor %d is not an object", i);
            break;
        }
        const char *name = dl_json_str(t, "name", NULL), *role = dl_json_str(t, "role", NULL);
        const char *dtype = dl_json_str(t, "dtype", "F32");
        const dl_json *sh = dl_json_get(t, "shape");
        if (!name) {
            rc = dl_err(DL_EFORMAT, "manifest JSON: tensor %d has no \"name\" string", i);
            break;
        }
        if ((dup = dup_member(t))) {
            rc = dl_err(DL_EFORMAT, "manifest JSON: tensor '%.*s' has member \"%s\" twice", DL_TENSOR_NAME_MAX, name,
                        dup);
            break;
        }
        for (const dl_json *k = t->child; k && !rc; k = k->next)
            if (strcmp(k->key, "name") && strcmp(k->key, "shape") && strcmp(k->key, "role") && strcmp(k->key, "dtype"))
                rc = dl_err(DL_EFORMAT, "manifest JSON: tensor '%.*s' has an unknown member \"%s\" "
                                        "(name, shape, role, dtype)",
                            DL_TENSOR_NAME_MAX, name, k->key);
        if (rc) break;
        if (strcmp(dtype, "F32")) {
            rc = dl_err(DL_EFORMAT, "manifest JSON: tensor '%.*s' has dtype %s; runs train fp32 (F32) tensors",
                        DL_TENSOR_NAME_MAX, name, dtype);
            break;
        }
        int kind = role ? dl_manifest_role_parse(role) : -1;
        if (kind < 0) {
            rc = dl_err(DL_EFORMAT, "manifest JSON: tensor '%.*s' has role %s%s%s, want \"matrix\", \"vector\" or "
                                    "\"embedding\"",
                        DL_TENSOR_NAME_MAX, name, role ? "\"" : "", role ? role : "(none)", role ? "\"" : "");
            break;
        }
        if (!sh || sh->type != DL_JSON_ARR) {
            rc = dl_err(DL_EFORMAT, "manifest JSON: tensor '%.*s' has no \"shape\" array", DL_TENSOR_NAME_MAX, name);
            break;
        }
        int64_t shape[DL_TENSOR_NDIM_MAX];
        int nd = 0;
        for (const dl_json *d = sh->child; d; d = d->next, nd++) {
            if (nd >= DL_TENSOR_NDIM_MAX) {
                rc = dl_err(DL_EINVAL, "manifest: tensor '%.*s' has more than %d dimensions", DL_TENSOR_NAME_MAX,
                            name, DL_TENSOR_NDIM_MAX);
                break;
            }
            if (json_int(d, -JSON_INT_MAX, JSON_INT_MAX, &shape[nd])) {
                rc = dl_err(DL_EFORMAT, "manifest JSON: tensor '%.*s': dimension %d is not an integer",
                            DL_TENSOR_NAME_MAX, name, nd);
                break;
            }
        }
        if (!rc) rc = dl_manifest_add(m, name, nd, shape, kind);
    }
    if (!rc) rc = dl_manifest_check(m);
    const dl_json *g = dl_json_get(root, "gpt");
    if (!rc && g) {
        int64_t v[5];
        const char *keys[5] = {"n_layer", "n_head", "n_embd", "seq_len", "vocab"};
        for (int k = 0; k < 5 && !rc; k++)
            if (json_int(dl_json_get(g, keys[k]), 0, 1 << 30, &v[k]))
                rc = dl_err(DL_EFORMAT, "manifest JSON: \"gpt\" needs an integer \"%s\"", keys[k]);
        if (!rc) {
            dl_model_config cfg = {.n_layer = (int)v[0], .n_head = (int)v[1], .n_embd = (int)v[2],
                                   .seq_len = (int)v[3], .vocab = (int)v[4]};
            rc = dl_manifest_set_gpt(m, &cfg);
        }
    }
    if (rc) {
        dl_manifest_close(&m);
        return rc;
    }
    *out = m;
    return 0;
}

int dl_manifest_json_bounded(const char *text, size_t len, const char *what)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += text[i] == '[' || text[i] == '{' || text[i] == ',';
    if (n > DL_MANIFEST_JSON_VALUES_MAX)
        return dl_err(DL_EFORMAT,
                      "%s: more than %u JSON values (%zu '[', '{' and ','): refused unparsed, a manifest needs far "
                      "fewer",
                      what, DL_MANIFEST_JSON_VALUES_MAX, n);
    return 0;
}

int dl_manifest_from_json(const char *text, size_t len, dl_manifest **out)
{
    *out = NULL;
    dl_json *root = NULL;
    DL_TRY(dl_manifest_json_bounded(text, len, "manifest JSON"));
    int rc = dl_json_parse(text, len, &root);
    if (rc) return dl_err(rc, "manifest: %s", dl_errmsg());
    rc = from_tree(root, out);
    dl_json_free(&root);
    return rc;
}

/* Manifest files are small (names and shapes): 64 MiB is far beyond any. */
#define FILE_MAX (64u << 20)

int dl_manifest_load(const char *path, dl_manifest **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return dl_err(DL_EIO, "manifest %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= FILE_MAX) {
                rc = dl_err(DL_EFORMAT, "manifest %s: larger than %u MiB", path, FILE_MAX >> 20);
                break;
            }
            cap = cap ? cap * 2 : 65536;
            char *b = dl_try_realloc(buf, cap);
            if (!b) {
                rc = dl_err(DL_ENOMEM, "manifest %s: out of memory", path);
                break;
            }
            buf = b;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) {
            if (ferror(f)) rc = dl_err(DL_EIO, "manifest %s: read failed", path);
            break;
        }
    }
    fclose(f);
    if (!rc) {
        rc = dl_manifest_from_json(buf, n, out);
        if (rc) rc = dl_err(rc, "%s: %s", path, dl_errmsg());
    }
    free(buf);
    return rc;
}

int dl_manifest_save(const dl_manifest *m, const char *path)
{
    char *js;
    size_t len;
    DL_TRY(dl_manifest_to_json(m, &js, &len));
    size_t pl = strlen(path);
    char *tmp = dl_try_malloc(pl + 5);
    if (!tmp) {
        free(js);
        return dl_err(DL_ENOMEM, "manifest %s: out of memory", path);
    }
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    int rc = 0;
    FILE *f = fopen(tmp, "wb");
    if (!f) rc = dl_err(DL_EIO, "manifest %s: %s", tmp, strerror(errno));
    else {
        int bad = fwrite(js, 1, len, f) != len;
        bad |= fclose(f) != 0;
        if (bad) rc = dl_err(DL_EIO, "manifest %s: write failed", tmp);
        else if (rename(tmp, path)) rc = dl_err(DL_EIO, "manifest %s: %s", path, strerror(errno));
        if (rc) remove(tmp);
    }
    free(tmp);
    free(js);
    return rc;
}
