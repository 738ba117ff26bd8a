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
} dl_cfg_entry;

/* Set every field to its default. Returns 0 or DL_EINVAL (bad table). */
int dl_cfg_defaults(const dl_cfg_entry *t, size_t n, void *obj);
/* Parse and validate one value. DL_EINVAL for an unknown name or bad value,
 * DL_ERANGE for out of bounds; dl_errmsg() names the option and the bounds. */
int dl_cfg_set(const dl_cfg_entry *t, size_t n, void *obj, const char *name, const char *value);
/* Load "key = value" lines; '#' and ';' start comments; "[section]" prefixes
 * keys with "section.". Errors carry path:line. */
int dl_cfg_load_ini(const dl_cfg_entry *t, size_t n, void *obj, const char *path);
/* Defaults, then --config FILE (if given), then flags. "--name value",
 * "--name=value", and a bare "--name" for BOOL. "-h"/"--help" returns 1
 * (caller prints usage and exits 0). Unknown or malformed flags: DL_EINVAL. */
int dl_cfg_parse_args(const dl_cfg_entry *t, size_t n, void *obj, int argc, char **argv);
void dl_cfg_usage(const dl_cfg_entry *t, size_t n, FILE *f);
/* One "name = value" line per entry (what the run actually uses). */
void dl_cfg_print(const dl_cfg_entry *t, size_t n, const void *obj, FILE *f);
const dl_cfg_entry *dl_cfg_find(const dl_cfg_entry *t, size_t n, const char *name);
/* Value of an entry formatted as text into buf. */
void dl_cfg_format(const dl_cfg_entry *e, const void *obj, char *buf, size_t cap);

#endif
