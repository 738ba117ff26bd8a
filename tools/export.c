/* dloco export: the store's global model (one read snapshot of every
 * fragment's latest version) written as safetensors, an HF GPT-2 directory or
 * an llm.c checkpoint (storage/modelfile.h); a manifest run's as safetensors
 * of its own tensors (storage/tensorfile.h). Read-only on the store. */
#include "tools/export.h"

#include "core/config.h"
#include "core/err.h"
#include "core/manifest.h"
#include "core/model.h"
#include "core/plan.h"
#include "storage/modelfile.h"
#include "storage/store.h"
#include "storage/tensorfile.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char format[DL_CFG_STRLEN];
    int force;
    char tokenizer[DL_CFG_STRLEN];
} export_cfg;

#define F(x) offsetof(export_cfg, x)
static const dl_cfg_entry export_table[] = {
    {"format", DL_CFG_ENUM, F(format), 0, 0, "safetensors", "safetensors|llmc|hf", 0,
     "safetensors (dloco names), llmc (llm.c GPT-2 checkpoint) or hf (a Hugging Face GPT-2 directory)"},
    {"force", DL_CFG_BOOL, F(force), 0, 0, "false", NULL, 0, "replace an existing OUT"},
    {"tokenizer", DL_CFG_STR, F(tokenizer), 0, 0, "", NULL, 0,
     "hf: a SentencePiece tokenizer.model (tools/make_shards.py) to put next to the model, with a "
     "tokenizer_config.json; empty = none (the byte vocabulary of text runs has no tokenizer file)"},
};
#undef F
#define NROWS (sizeof export_table / sizeof export_table[0])

/* The tokenizer file is hostile input too: a regular file of sane size. */
#define TOKENIZER_MAX (64u << 20)

static int read_tokenizer(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return dl_err(DL_EIO, "tokenizer %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size > TOKENIZER_MAX) {
        fclose(f);
        return dl_err(DL_EFORMAT, "tokenizer %s: not a regular file of 1 byte to %u MiB (a SentencePiece "
                      "tokenizer.model from tools/make_shards.py)", path, TOKENIZER_MAX >> 20);
    }
    *len = (size_t)st.st_size;
    *buf = dl_xmalloc(*len);
    int ok = fread(*buf, 1, *len, f) == *len;
    fclose(f);
    if (!ok) {
        free(*buf);
        return dl_err(DL_EIO, "tokenizer %s: short read", path);
    }
    return 0;
}

/* `text` as OUT/name, through a temporary file and a rename. */
static int put_file(const char *out, const char *name, const void *text, size_t len)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", out, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return dl_err(DL_EIO, "cannot create %s: %s", tmp, strerror(errno));
    int ok = fwrite(text, 1, len, f) == len;
    ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return dl_err(DL_EIO, "cannot write %s: %s", path, strerror(errno));
    }
    return 0;
}

/* The tokenizer next to an HF export: tokenizer.model as given, and a config
 * naming the SentencePiece (Llama-style) tokenizer class and its specials as
 * tools/make_shards.py trains them (<unk> 0, <s> 1, </s> 2; none added). */
static int put_tokenizer(const char *out, int seq_len, const char *buf, size_t len)
{
    char cfg[1024];
    int n = snprintf(cfg, sizeof cfg,
                     "{\n  \"tokenizer_class\": \"LlamaTokenizer\",\n  \"model_max_length\": %d,\n"
                     "  \"unk_token\": \"<unk>\",\n  \"bos_token\": \"<s>\",\n  \"eos_token\": \"</s>\",\n"
                     "  \"add_bos_token\": false,\n  \"add_eos_token\": false,\n  \"add_prefix_space\": false,\n"
                     "  \"legacy\": false\n}\n",
                     seq_len);
    DL_TRY(put_file(out, "tokenizer.model", buf, len));
    return put_file(out, "tokenizer_config.json", cfg, (size_t)n);
}

static int fail(int rc)
{
    fprintf(stderr, "dloco export: %s%s%s\n", dl_strerror(rc), dl_errmsg()[0] ? ": " : "", dl_errmsg());
    return 2;
}

/* The global model of `dir` into a new buffer (dl_model_tensor_table's
 * layout, or a manifest run's: its tensors back to back), with the run and
 * the fragment versions, from ONE snapshot. */
static int read_global(dl_store *s, const dl_store_run *run, dl_plan *plan, float **out, uint64_t *versions)
{
    size_t numel = dl_plan_total_numel(plan);
    float *params = dl_try_malloc(numel * sizeof(float));
    if (!params)
        return dl_err(DL_ENOMEM, "the model's %zu floats (%.2f GB): out of memory", numel, numel * 4.0 / 1e9);
    /* the plan covers the whole buffer (wte's padded rows too): every float comes from the snapshot */
    dl_store_snap *snap = NULL;
    int rc = dl_store_snapshot_begin(s, &snap);
    for (uint32_t p = 0; !rc && p < run->n_fragments; p++) {
        const float *fp;
        size_t n;
        rc = dl_store_snapshot_fragment(snap, p, &versions[p], &fp, &n);
        if (!rc && n != dl_plan_fragment_numel(plan, (int)p))
            rc = dl_err(DL_ECORRUPT, "fragment %u holds %zu floats, the model's plan %zu", p, n,
                        dl_plan_fragment_numel(plan, (int)p));
        if (!rc) dl_plan_scatter(plan, (int)p, fp, params);
    }
    dl_store_snapshot_end(&snap);
    for (size_t i = 0; !rc && i < numel; i++)
        if (!isfinite(params[i])) rc = dl_err(DL_ECORRUPT, "parameter %zu of the global model is not finite", i);
    if (rc) {
        free(params);
        return rc;
    }
    *out = params;
    return 0;
}

int dl_export_cmd(const char *dir, int argc, char **argv)
{
    /* OUT is the one argument that is neither an option nor an option's value */
    char **av = dl_xcalloc((size_t)argc + 1, sizeof *av);
    int ac = 0;
    const char *out = NULL;
    av[ac++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "--", 2)) {
            av[ac++] = argv[i];
            int takes_value = !strchr(a, '=') && strcmp(a, "--force") && strcmp(a, "--help");
            if (takes_value && i + 1 < argc) av[ac++] = argv[++i];
        } else if (!out) {
            out = a;
        } else {
            free(av);
            return fail(dl_err(DL_EINVAL, "two outputs ('%s' and '%s'): usage dloco export STORE --format F OUT", out, a));
        }
    }
    export_cfg ec;
    static const dl_cfg_main preamble = {"dloco export",
                                         "usage: dloco export STORE [--format safetensors|llmc|hf] [--force] [--tokenizer FILE] OUT\n"};
    int rc, done = dl_cfg_main_parse(export_table, NROWS, &ec, &preamble, ac, av, &rc);
    free(av);
    if (done) return rc;
    if (!out) return fail(dl_err(DL_EINVAL, "no OUT: usage dloco export STORE --format F OUT"));
    /* OUT/ (a shell's completion of a directory) names OUT: the writer makes
     * its temporary next to OUT, which "OUT/" would put inside it */
    char out_buf[4096];
    size_t ol = strlen(out);
    if (ol > 1 && out[ol - 1] == '/' && ol < sizeof out_buf) {
        memcpy(out_buf, out, ol + 1);
        while (ol > 1 && out_buf[ol - 1] == '/') out_buf[--ol] = 0;
        out = out_buf;
    }
    int format;
    if ((rc = dl_modelfile_format_parse(ec.format, &format))) return fail(rc);
    char *tok = NULL;
    size_t tok_len = 0;
    if (ec.tokenizer[0] && strcmp(ec.format, "hf"))
        return fail(dl_err(DL_EINVAL, "--tokenizer goes with --format hf (a Hugging Face directory holds it)"));
    if (ec.tokenizer[0] && (rc = read_tokenizer(ec.tokenizer, &tok, &tok_len))) return fail(rc);

    dl_store_opts o = dl_store_opts_default();
    o.read_only = 1;
    dl_store *s = NULL;
    dl_plan *plan = NULL;
    float *params = NULL;
    uint64_t *versions = NULL;
    dl_store_run run;
    dl_store_shard lay = {0, 0};
    /* an empty store first (the checker would call it malformed) */
    if ((rc = dl_store_open(dir, &o, &s))) {
        if (rc == DL_ENOTFOUND) return fail(dl_err(rc, "%s: no store here", dir));
        return fail(rc);
    }
    rc = dl_store_get_run(s, &run);
    dl_store_close(&s);
    if (rc == DL_ENOTFOUND) return fail(dl_err(rc, "%s holds no run (an empty store): nothing to export", dir));
    /* a store that is not consistent is not exported (the checker opens it
     * on its own, while this process has it closed: an LMDB rule) */
    if ((rc = dl_store_check(dir, NULL))) {
        if (rc == DL_ENOTFOUND) return fail(dl_err(rc, "%s: no store here", dir));
        char why[512];
        snprintf(why, sizeof why, "%s", dl_errmsg());
        return fail(dl_err(rc, "%s fails dloco check (%s); not exporting", dir, why));
    }
    if ((rc = dl_store_open(dir, &o, &s))) return fail(rc);
    if ((rc = dl_store_get_run(s, &run))) goto done;
    if (dl_store_get_shard(s, &lay) == 0 && lay.shards > 1) {
        rc = dl_err(DL_EINVAL, "%s is shard %u of %u: it holds only its own fragments' progress; exporting a sharded "
                    "run is not supported", dir, lay.shard, lay.shards);
        goto done;
    }
    if (run.manifest && format != DL_MODELFILE_SAFETENSORS) {
        rc = dl_err(DL_EINVAL, "--format %s writes dloco's GPT-2 only, and run %s's model is described by a manifest "
                    "(%d tensors): use --format safetensors (the manifest's own names and shapes)",
                    dl_modelfile_format_name(format), run.run_id, dl_manifest_ntensors(run.manifest));
        goto done;
    }
    if ((rc = run.manifest ? dl_manifest_plan_open(run.manifest, (int)run.n_fragments, &plan)
                           : dl_model_plan_open(&run.model, (int)run.n_fragments, &plan)))
        goto done;
    if ((run.manifest ? dl_manifest_fingerprint(run.manifest, plan) : dl_model_fingerprint(&run.model, plan)) !=
        run.fingerprint) {
        rc = dl_err(DL_ECORRUPT, "the run's model does not match its fingerprint");
        goto done;
    }
    versions = dl_xcalloc(run.n_fragments, sizeof *versions);
    if ((rc = read_global(s, &run, plan, &params, versions))) goto done;
    uint64_t vsum = 0;
    for (uint32_t p = 0; p < run.n_fragments; p++) vsum += versions[p];
    if (run.manifest) {
        /* the manifest's own names and shapes; roles and order in __metadata__ */
        dl_tensorfile_meta tm = {.run_id = run.run_id, .fingerprint = run.fingerprint, .n_fragments = run.n_fragments,
                                 .versions = versions};
        if ((rc = dl_tensorfile_write(out, run.manifest, params, &tm, ec.force, stderr))) goto done;
        printf("exported run %s (a manifest of %d tensors, %zu floats, %u fragments at total version %llu) to %s as "
               "safetensors\n",
               run.run_id, dl_manifest_ntensors(run.manifest), dl_manifest_numel(run.manifest), run.n_fragments,
               (unsigned long long)vsum, out);
        goto done;
    }
    dl_modelfile_meta meta = {.run_id = run.run_id, .fingerprint = run.fingerprint, .n_fragments = run.n_fragments,
                              .versions = versions, .seed = run.seed};
    if ((rc = dl_modelfile_write(out, format, &run.model, params, &meta, ec.force, stderr))) goto done;
    if (tok && (rc = put_tokenizer(out, run.model.seq_len, tok, tok_len))) goto done;
    printf("exported run %s (L=%d NH=%d C=%d T=%d V=%d, %u fragments at total version %llu) to %s as %s\n", run.run_id,
           run.model.n_layer, run.model.n_head, run.model.n_embd, run.model.seq_len, run.model.vocab, run.n_fragments,
           (unsigned long long)vsum, out, dl_modelfile_format_name(format));
    if (tok) printf("tokenizer: %s copied to %s/tokenizer.model, with tokenizer_config.json\n", ec.tokenizer, out);
done:
    free(tok);
    free(params);
    free(versions);
    dl_plan_close(&plan);
    dl_store_close(&s);
    return rc ? fail(rc) : 0;
}
