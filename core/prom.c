/* Prometheus text exposition builder (see prom.h): escaping, samples,
 * cumulative histograms. */
#include "core/prom.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/json.h"

void dl_prom_init(dl_prom *p)
{
    p->len = 0;
    p->failed = 0;
    p->cap = 4096;
    p->buf = dl_try_malloc(p->cap);
    if (p->buf) p->buf[0] = 0;
    else p->cap = 0, p->failed = 1;
}

void dl_prom_free(dl_prom *p)
{
    free(p->buf);
    p->buf = NULL;
    p->len = p->cap = 0;
}

/* Room for `more` bytes and the NUL: 0, or -1 with p->failed set (the text
 * so far stays; nothing more is appended). */
static int reserve(dl_prom *p, size_t more)
{
    if (p->len + more + 1 <= p->cap) return 0;
    size_t cap = p->cap ? p->cap : 4096;
    while (p->len + more + 1 > cap) cap *= 2;
    char *b = dl_try_realloc(p->buf, cap);
    if (!b) {
        p->failed = 1;
        return -1;
    }
    p->buf = b;
    p->cap = cap;
    return 0;
}

static void vraw(dl_prom *p, const char *fmt, va_list ap)
{
    if (p->failed) return;
    va_list aq;
    va_copy(aq, ap);
    int k = vsnprintf(p->buf + p->len, p->cap - p->len, fmt, aq);
    va_end(aq);
    if (k < 0) return;
    if ((size_t)k >= p->cap - p->len) {
        if (reserve(p, (size_t)k)) {
            p->buf[p->len] = 0; /* vsnprintf wrote a truncated tail */
            return;
        }
        vsnprintf(p->buf + p->len, p->cap - p->len, fmt, ap);
    }
    p->len += (size_t)k;
}

void dl_prom_raw(dl_prom *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vraw(p, fmt, ap);
    va_end(ap);
}

void dl_prom_family(dl_prom *p, const char *name, const char *type, const char *help)
{
    dl_prom_raw(p, "# HELP %s ", name);
    for (const char *c = help; *c; c++) {
        if (*c == '\\') dl_prom_raw(p, "\\\\");
        else if (*c == '\n') dl_prom_raw(p, "\\n");
        else dl_prom_raw(p, "%c", *c);
    }
    dl_prom_raw(p, "\n# TYPE %s %s\n", name, type);
}

static void value(char *b, size_t cap, double v)
{
    if (isnan(v)) snprintf(b, cap, "NaN");
    else if (isinf(v)) snprintf(b, cap, v > 0 ? "+Inf" : "-Inf");
    else {
        /* the shortest of %.15g..%.17g that reads back exactly: 0.1 stays "0.1" */
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(b, cap, "%.*g", prec, v);
            if (strtod(b, NULL) == v) break;
        }
    }
}

void dl_prom_sample(dl_prom *p, const char *name, const char *labels, double v)
{
    char vb[40];
    value(vb, sizeof vb, v);
    if (labels && *labels) dl_prom_raw(p, "%s{%s} %s\n", name, labels, vb);
    else dl_prom_raw(p, "%s %s\n", name, vb);
}

int dl_prom_label(char *buf, size_t cap, const char *key, const char *val)
{
    size_t o = strlen(buf), start = o;
    int k = snprintf(buf + o, cap - o, "%s%s=\"", o ? "," : "", key);
    if (k < 0 || (size_t)k >= cap - o) goto full;
    o += (size_t)k;
    for (const char *c = val; *c; c++) {
        const char *esc = *c == '\\' ? "\\\\" : *c == '"' ? "\\\"" : *c == '\n' ? "\\n" : NULL;
        size_t n = esc ? 2 : 1;
        if (o + n + 2 > cap) goto full;
        if (esc) memcpy(buf + o, esc, 2);
        else buf[o] = *c;
        o += n;
    }
    if (o + 2 > cap) goto full;
    buf[o++] = '"';
    buf[o] = 0;
    return 0;
full:
    buf[start] = 0;
    return DL_ERANGE;
}

void dl_prom_hist_init(dl_prom_hist *h, const double *le, int nb)
{
    assert(nb >= 1 && nb <= DL_PROM_MAX_BUCKETS);
    memset(h, 0, sizeof *h);
    h->nb = nb;
    for (int i = 0; i < nb; i++) {
        assert(i == 0 || le[i] > le[i - 1]);
        h->le[i] = le[i];
    }
}

void dl_prom_hist_observe(dl_prom_hist *h, double v)
{
    int i = 0;
    while (i < h->nb && !(v <= h->le[i])) i++; /* NaN lands in +Inf */
    h->n[i]++;
    h->count++;
    if (!isnan(v)) h->sum += v;
}

void dl_prom_histogram(dl_prom *p, const char *name, const char *labels, const dl_prom_hist *h)
{
    char nb[256], lb[512];
    uint64_t cum = 0;
    snprintf(nb, sizeof nb, "%s_bucket", name);
    for (int i = 0; i <= h->nb; i++) {
        cum += h->n[i];
        char le[40];
        value(le, sizeof le, i < h->nb ? h->le[i] : INFINITY);
        snprintf(lb, sizeof lb, "%s", labels ? labels : "");
        dl_prom_label(lb, sizeof lb, "le", le);
        dl_prom_sample(p, nb, lb, (double)cum);
    }
    snprintf(nb, sizeof nb, "%s_sum", name);
    dl_prom_sample(p, nb, labels, h->sum);
    snprintf(nb, sizeof nb, "%s_count", name);
    dl_prom_sample(p, nb, labels, (double)h->count);
}

static void prom_put(void *p, const char *b, size_t n) { dl_prom_raw(p, "%.*s", (int)n, b); }

void dl_prom_json_str(dl_prom *p, const char *s) { dl_json_quote(s, prom_put, p); }
