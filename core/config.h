/* The config table: one array of entries per program (name, type, bounds,
 * default, mutable-at-runtime, help), filled from defaults, then an INI file
 * (--config FILE), then command-line flags; every value is validated. */
#ifndef DL_CORE_CONFIG_H
#define DL_CORE_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define DL_CFG_STRLEN 256

typedef enum {
    DL_CFG_INT,   /* int64_t field, bounded by [min, max] */
    DL_CFG_FLOAT, /* double field, bounded by [min, max], must be finite */
    DL_CFG_STR,   /* char[DL_CFG_STRLEN] field */
    DL_CFG_ENUM,  /* char[DL_CFG_STRLEN] field, one of `choices` ("a|b|c") */
    DL_CFG_BOOL   /* int field: true/false, yes/no, on/off, 1/0 */
} dl_cfg_type;

typedef struct {
    const char *name;    /* flag --name and INI key (INI "[sec] key" = "sec.key") */
    dl_cfg_type type;
    size_t offset;       /* offsetof(program config struct, field) */
    double min, max;     /* bounds for INT and FLOAT */
    const char *def;     /* default, as text */
    const char *choices; /* ENUM only */
    int reloadable;      /* may change at runtime (SIGHUP) */
    const char *help;
    /* Optional (rows may stop before it): the value's unit for --help, where
     * the name's suffix says nothing (dl_cfg_unit derives _ms, _s, _mb, ...). */
    const char *unit;
} dl_cfg_entry;

/* dl_cfg_parse_args's positive results: the caller prints and exits 0. */
enum { DL_CFG_HELP = 1, DL_CFG_PRINT = 2 };

/* Set every field to its default. Returns 0 or DL_EINVAL (bad table). */
int dl_cfg_defaults(const dl_cfg_entry *t, size_t n, void *obj);
/* Parse and validate one value. DL_EINVAL for an unknown name or bad value,
 * DL_ERANGE for out of bounds; dl_errmsg() names the option and the bounds. */
int dl_cfg_set(const dl_cfg_entry *t, size_t n, void *obj, const char *name, const char *value);
/* Load "key = value" lines; '#' and ';' start comments; "[section]" prefixes
 * keys with "section.". Errors carry path:line. */
int dl_cfg_load_ini(const dl_cfg_entry *t, size_t n, void *obj, const char *path);
/* Defaults, then --config FILE (if given), then flags. "--name value",
 * "--name=value", and a bare "--name" for BOOL. "-h"/"--help"/"--help-all"
 * returns DL_CFG_HELP (caller prints usage and exits 0); "--print-config" returns
 * DL_CFG_PRINT once everything is loaded and valid (caller prints the config
 * with dl_cfg_print and exits 0). Unknown or malformed flags: DL_EINVAL. */
int dl_cfg_parse_args(const dl_cfg_entry *t, size_t n, void *obj, int argc, char **argv);
/* The option preamble of every program's main (and of dloco's subcommands),
 * one copy: dl_cfg_parse_args, then
 *   --help            usage (when set) and dl_cfg_usage on stdout: exit 0
 *   --print-config    check (when set: what a start would refuse is refused
 *                     here too), then dl_cfg_print on stdout: exit 0
 *   a bad option, file or value, or a refused check:
 *                     "PROG: bad configuration: ERROR: DETAIL" on stderr: exit 2
 * Returns 1 when main should return *exit_code now, 0 when it goes on with
 * obj parsed (check is not run on that path: main runs what it needs). */
typedef struct {
    const char *prog;          /* "dloco-sync", "dloco eval": starts the error line */
    const char *usage;         /* lines printed before the options on --help, or NULL */
    int (*check)(void *obj);   /* cross-option checks for --print-config: 0 or DL_E*, or NULL */
    void (*options)(FILE *f);  /* --help's option list when not dl_cfg_usage of the table (e.g. in sections), or NULL */
} dl_cfg_main;
int dl_cfg_main_parse(const dl_cfg_entry *t, size_t n, void *obj, const dl_cfg_main *m, int argc, char **argv,
                      int *exit_code);
/* Every option: name, type and unit, default, range or choices, reloadable,
 * help (wrapped). */
void dl_cfg_usage(const dl_cfg_entry *t, size_t n, FILE *f);
/* --help in sections. Each section is a heading and the names of its
 * options, space-separated. --help prints the first section (the common
 * options) in full and every other one as one line per option (name, type,
 * default, the help up to its first ';', cut to fit); --help-all prints every option in full.
 * Options that no section names come last, under "other options", so a new
 * row is never hidden. */
typedef struct {
    const char *title;
    const char *names;
} dl_cfg_section;
void dl_cfg_usage_sections(const dl_cfg_entry *t, size_t n, const dl_cfg_section *sec, size_t nsec, FILE *f);
/* 1 when the dl_cfg_parse_args that returned DL_CFG_HELP saw --help-all
 * (per thread). */
int dl_cfg_help_all(void);
/* Every name of the sections is an option of the table, in one section
 * only: 0, or DL_EINVAL naming the first that is not. */
int dl_cfg_sections_check(const dl_cfg_entry *t, size_t n, const dl_cfg_section *sec, size_t nsec);
/* The same list for keys of a file format that has no flags (no preamble,
 * no reloadability): the chaos scenarios' sections. */
void dl_cfg_usage_keys(const dl_cfg_entry *t, size_t n, FILE *f);
/* The config in the INI format dl_cfg_load_ini reads: keys without a dot
 * first, then one "[sec]" block per prefix of dotted names; strings quoted
 * when they would not read back bare. Loading the output and printing again
 * gives the same text. */
void dl_cfg_print(const dl_cfg_entry *t, size_t n, const void *obj, FILE *f);
/* Names match with '-' and '_' taken as the same character. */
const dl_cfg_entry *dl_cfg_find(const dl_cfg_entry *t, size_t n, const char *name);
/* The entry's unit: e->unit, else from the name's suffix (_ms ms, _s s,
 * _per_s 1/s, _mb MiB, _kb KiB, _gb GiB, _bytes bytes, _mbit Mbit/s); "" if none. */
const char *dl_cfg_unit(const dl_cfg_entry *e);
/* Value of an entry formatted as text into buf. */
void dl_cfg_format(const dl_cfg_entry *e, const void *obj, char *buf, size_t cap);

/* A reload's plan (SIGHUP), pure: `next` is the config parsed afresh
 * (defaults, then the file, then the flags given at start); `out`, a copy of
 * the running config `cur` on entry, takes every reloadable entry's value
 * from `next` and keeps the running value of every other one. what[i] (n
 * entries) says, per entry: DL_CFG_APPLY a reloadable value that changes,
 * DL_CFG_IGNORE a restart-only value that `next` changes (not taken), else
 * DL_CFG_KEEP. Values compare as dl_cfg_format text. Returns the number of
 * DL_CFG_APPLY entries. The caller validates `out` as a whole before
 * applying anything, and its running config becomes `out` only once applied. */
enum { DL_CFG_KEEP = 0, DL_CFG_APPLY = 1, DL_CFG_IGNORE = 2 };
int dl_cfg_reload_plan(const dl_cfg_entry *t, size_t n, const void *cur, const void *next, void *out,
                       unsigned char *what);
/* "name a -> b, name2 c -> d" for the entries with what[i] == kind, values of
 * `a` then `b`, into buf (empty when none); returns how many. */
int dl_cfg_diff(const dl_cfg_entry *t, size_t n, const unsigned char *what, int kind, const void *a, const void *b,
                char *buf, size_t cap);

/* The INI line reader behind dl_cfg_load_ini, shared with other INI formats
 * (chaos scenarios): '#' or ';' outside quotes starts a comment; a value in
 * double quotes keeps its spaces, '#' and ';' (escapes \" \\ \n \t \r). */
typedef struct {
    FILE *f;
    const char *path;
    int line; /* number of the line last read */
    char buf[1024];
} dl_ini;
enum { DL_INI_END = 0, DL_INI_SECTION = 1, DL_INI_KEY = 2 };
int dl_ini_open(dl_ini *r, const char *path); /* DL_EIO naming the path */
/* The next line that holds something: DL_INI_SECTION with *a = the header's
 * text inside the brackets (trimmed), DL_INI_KEY with *a = key and *b =
 * value (trimmed, unquoted), DL_INI_END; or a negative code whose message
 * starts "path:line: ". *a and *b point into r->buf until the next call. */
int dl_ini_next(dl_ini *r, char **a, char **b);
void dl_ini_close(dl_ini *r);

#endif
