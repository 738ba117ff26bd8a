/* A reader of event lines (docs/EVENTS.md "Line format", written by
 * core/event.c): one line into key/value pairs, typed lookups, a file iterator.
 *
 * Line format:  ts=<unix ns> proc=<p> pid=<pid> event=<name> k=v ...
 * Keys are [A-Za-z0-9_]+; fields are separated by one space. Keys are
 * unique in what dloco writes; a repeated key (a hand-made file) is
 * accepted and a lookup finds its last value. A value is
 * bare (no space, quote, backslash or control byte) or double-quoted with
 * the escapes \" \\ \n \r \t \xHH. A line the writer had
 * to cut ends with `cut=1`: its fields are whole, later ones are missing.
 *
 * The reader is strict about the form and lenient about content: a line that
 * is not well-formed is garbage (skipped and counted by the iterator, never a
 * failure of the file), a missing key is DL_ENOTFOUND, and readers look keys
 * up by name only, so fields added at the end of a line never break them. */
#ifndef DL_CHAOS_LOGFMT_H
#define DL_CHAOS_LOGFMT_H

#include <stddef.h>
#include <stdint.h>

/* The longest line accepted, newline excluded (the writer's bound is 4096
 * bytes with the newline). A longer line is skipped and counted. */
#define DL_LOGFMT_LINE 4096
/* Most fields in one line; a line with more is garbage. */
#define DL_LOGFMT_FIELDS 256

/* One parsed line. key[i] / val[i] point into buf (unescaped, NUL-terminated),
 * so a line is self-contained and can be copied by value. */
typedef struct {
    int n;        /* fields */
    int cut;      /* 1: the last field is cut=1 (the writer cut the line; fields after it are missing) */
    int64_t ts;   /* the ts field (unix ns) when it is an integer, else INT64_MIN */
    const char *event; /* the event field, or NULL */
    const char *key[DL_LOGFMT_FIELDS];
    const char *val[DL_LOGFMT_FIELDS];
    char buf[DL_LOGFMT_LINE + 2];
} dl_logfmt_line;

/* Parse s[0..len) (no newline) into *out. Returns 0, DL_ERANGE for a line
 * longer than DL_LOGFMT_LINE, or DL_EFORMAT with the reason (no key, bad
 * escape, an open quote, a raw control byte, a doubled or trailing space, an
 * empty bare value, \x00, too many fields). On failure *out
 * holds no fields. */
int dl_logfmt_parse(const char *s, size_t len, dl_logfmt_line *out);

/* The value of `key` (its last, when it repeats), or NULL when the line has
 * none. */
const char *dl_logfmt_get(const dl_logfmt_line *l, const char *key);
/* Typed lookups: 0 and *out set; DL_ENOTFOUND when absent; DL_EFORMAT when
 * the whole value is not a base-10 integer in range (i64, u64) or a number
 * strtod reads (f64: also nan and inf, as %g writes them). *out is left
 * alone on failure. */
int dl_logfmt_i64(const dl_logfmt_line *l, const char *key, int64_t *out);
int dl_logfmt_u64(const dl_logfmt_line *l, const char *key, uint64_t *out);
int dl_logfmt_f64(const dl_logfmt_line *l, const char *key, double *out);
/* The same with a default for an absent or malformed value. */
int64_t dl_logfmt_i64_or(const dl_logfmt_line *l, const char *key, int64_t def);
uint64_t dl_logfmt_u64_or(const dl_logfmt_line *l, const char *key, uint64_t def);
double dl_logfmt_f64_or(const dl_logfmt_line *l, const char *key, double def);
/* The string value, or def when absent. */
const char *dl_logfmt_str_or(const dl_logfmt_line *l, const char *key, const char *def);

/* ---- files of event lines */

typedef struct dl_logfmt_file dl_logfmt_file;

/* What the iterator saw so far. Every line is exactly one of events,
 * garbage, too_long or torn; cut counts events that end with cut=1. */
typedef struct {
    int64_t lines;    /* lines read, a torn last line included */
    int64_t events;   /* returned by dl_logfmt_next */
    int64_t garbage;  /* not well-formed, empty, or without an integer ts and an event */
    int64_t too_long; /* longer than DL_LOGFMT_LINE */
    int64_t torn;     /* the last line had no newline: skipped, since its last value may be cut short */
    int64_t cut;      /* events with cut=1 (returned, fields missing) */
} dl_logfmt_stats;

/* Open `path` for reading. DL_ENOTFOUND when it does not exist, DL_EIO for
 * another failure (both with the path in the detail). */
int dl_logfmt_open(const char *path, dl_logfmt_file **out);
/* The next event line into *line: 1 when one was read, 0 at the end of the
 * file, DL_EIO on a read error. Garbage, over-long and torn lines are
 * skipped and counted, never returned. */
int dl_logfmt_next(dl_logfmt_file *f, dl_logfmt_line *line);
/* The line number (1-based) of the line last returned by dl_logfmt_next. */
int64_t dl_logfmt_lineno(const dl_logfmt_file *f);
const dl_logfmt_stats *dl_logfmt_file_stats(const dl_logfmt_file *f);
/* Close and NULL *f; safe on NULL and twice. */
void dl_logfmt_close(dl_logfmt_file **f);

#endif
