/* Prometheus text exposition (format 0.0.4) built into one growable buffer:
 * HELP/TYPE lines, label-value escaping, counters, gauges and fixed-bucket
 * histograms. No state beyond the buffer and the histograms the caller owns. */
#ifndef DL_CORE_PROM_H
#define DL_CORE_PROM_H

#include <stddef.h>
#include <stdint.h>

/* A text buffer that grows; buf is NUL-terminated after init unless failed.
 * An allocation failure sets `failed` and stops appending (never aborts: the
 * learner library builds its /metrics page with this); a caller publishes
 * nothing from a failed buffer. */
typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
} dl_prom;

void dl_prom_init(dl_prom *p);
void dl_prom_free(dl_prom *p);
/* Append formatted text as is (no escaping): the JSON documents reuse it. */
void dl_prom_raw(dl_prom *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a JSON string appended to p (core/json.h dl_json_quote: escaped, not
 * UTF-8 as U+FFFD): the JSON documents built with this buffer (/status.json,
 * dloco status --json). */
void dl_prom_json_str(dl_prom *p, const char *s);
/* "# HELP name help\n# TYPE name type\n"; type is counter|gauge|histogram.
 * Help text has '\\' and newline escaped. Call once per metric family, before
 * its samples. */
void dl_prom_family(dl_prom *p, const char *name, const char *type, const char *help);
/* One sample line "name{labels} value\n". labels is NULL/"" or a list already
 * built with dl_prom_label ("a=\"x\",b=\"y\""). Values print as the shortest %.15g..%.17g that reads back exactly, or
 * +Inf / -Inf / NaN. */
void dl_prom_sample(dl_prom *p, const char *name, const char *labels, double v);
/* Append key="value" (with a leading ',' when buf is non-empty) to the label
 * list in buf, escaping '\\', '"' and newline in value. Returns 0, or
 * DL_ERANGE (buf unchanged) when it does not fit in cap. */
int dl_prom_label(char *buf, size_t cap, const char *key, const char *value);

/* A histogram with fixed upper bounds (le, increasing; +Inf is implicit).
 * n[i] counts observations in (le[i-1], le[i]]; n[nb] those above le[nb-1].
 * Rendered cumulative, as Prometheus wants. */
#define DL_PROM_MAX_BUCKETS 16
typedef struct {
    int nb;
    double le[DL_PROM_MAX_BUCKETS];
    uint64_t n[DL_PROM_MAX_BUCKETS + 1];
    uint64_t count;
    double sum;
} dl_prom_hist;

/* Set the bounds (nb <= DL_PROM_MAX_BUCKETS, strictly increasing: asserted)
 * and zero the counts. */
void dl_prom_hist_init(dl_prom_hist *h, const double *le, int nb);
void dl_prom_hist_observe(dl_prom_hist *h, double v);
/* name_bucket{labels,le="..."} cumulative, then name_sum and name_count. */
void dl_prom_histogram(dl_prom *p, const char *name, const char *labels, const dl_prom_hist *h);

#endif
