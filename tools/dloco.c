/* dloco: the operator command. check (offline store verification), status
 * (versions, merges, ledger, learners), eval (validation loss of the global
 * model in a store), plan (a model's fragments), export (tools/export.c: the global model as a model file).
 * Read-only on the store: safe while a synchronizer runs. */
#include "core/clock.h"
#include "core/config.h"
#include "core/err.h"
#include "core/json.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/shard.h"
#include "kernels/blas_select.h"
#include "gpt/data.h"
#include "gpt/evaluate.h"
#include "gpt/gpt.h"
#include "proto/auth.h"
#include "storage/store.h"
#include "storage/tensorfile.h"
#include "tools/export.h"
#include "tools/status.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int fail(const char *what, int rc)
{
    fprintf(stderr, "dloco: %s: %s%s%s\n", what, dl_strerror(rc), dl_errmsg()[0] ? ": " : "", dl_errmsg());
    return 2;
}

/* One block per command: its synopsis, then what it does. */
static const struct {
    const char *name, *text;
} commands[] = {
    {"check", "  check  STORE                 verify a store offline (exit 1 on the first violation)\n"},
    {"status", "  status ADDR|STORE [--json] [--watch [SECONDS]]\n"
               "                               learners, fragments, token ledger, global validation loss: of a\n"
               "                               running synchronizer (ADDR = HOST:PORT of its --metrics) or of a\n"
               "                               store (run, epoch, store sizes, versions, merges too);\n"
               "                               --json one document (docs/OPERATING.md), --watch refreshes\n"},
    {"records", "  records STORE                a header line, then one line per merge contribution: fragment version\n"
                "                               learner decision staleness tokens weight epoch=E\n"},
    {"eval", "  eval   STORE [--data PATH] [--data_format auto|text|shards] [--batch B] [--val_batches N]\n"
             "         [--val_frac F] [--dump_seqs FILE] [--json]\n"
             "                               validation loss of the store's global model on --data, else on\n"
             "                               the data the run recorded (dloco-sync --eval_data), and names it;\n"
             "                               --json one object: run_id, fragments, total_version, val_loss, data,\n"
             "                               batches, batch, seq_len\n"},
    {"export", "  export STORE [--format safetensors|llmc|hf] [--force] [--tokenizer FILE] OUT\n"
               "                               the store's global model as a model file (docs/OPERATING.md);\n"
               "                               hf: --tokenizer puts a SentencePiece model next to it\n"},
    {"keygen", "  keygen PREFIX                write a new CURVE key pair: PREFIX.key (0600, keep secret) and\n"
               "                               PREFIX.pub (0644), making PREFIX's directory if it is missing;\n"
               "                               prints the public key and an allowlist line\n"},
    {"plan", "  plan   [--n_layer L] [--n_head NH] [--n_embd C] [--seq_len T] [--vocab V] [--fragments P]\n"
             "         [--shards S] [--manifest FILE]\n"
             "                               the fragment plan of a model (a GPT-2 config, or a manifest's):\n"
             "                               sizes, balance, fingerprint, and each fragment's blocks (name,\n"
             "                               or name[rows) of a split tensor)\n"},
    {"manifest", "  manifest FILE|STORE          a model's manifest as JSON (docs/OPERATING.md \"Manifest runs\"):\n"
                 "                               of a safetensors file (the one it carries, else one with roles\n"
                 "                               guessed, said on stderr: check them), a manifest JSON file, or\n"
                 "                               the run a store holds\n"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: dloco COMMAND STORE [options]   (dloco COMMAND --help: that command alone)\n");
    for (size_t i = 0; i < NCOMMANDS; i++) fputs(commands[i].text, f);
}

/* What the store cannot check alone: the run's typed model and P give the
 * plan, whose fingerprint and fragment sizes must be the recorded ones. */
static int check_model(const char *dir)
{
    dl_store_opts o = dl_store_opts_default();
    o.read_only = 1;
    dl_store *s = NULL;
    dl_plan *plan = NULL;
    dl_store_run run;
    int rc = dl_store_open(dir, &o, &s);
    if (!rc) rc = dl_store_get_run(s, &run);
    if (!rc && run.manifest) {
        /* a manifest run: its plan and fingerprint come from the manifest */
        rc = dl_manifest_plan_open(run.manifest, (int)run.n_fragments, &plan);
        if (!rc && dl_manifest_fingerprint(run.manifest, plan) != run.fingerprint)
            rc = dl_err(DL_ECORRUPT, "the run's manifest (%d tensors, P=%u) has fingerprint %016llx, the run records "
                        "%016llx", dl_manifest_ntensors(run.manifest), run.n_fragments,
                        (unsigned long long)dl_manifest_fingerprint(run.manifest, plan),
                        (unsigned long long)run.fingerprint);
        for (uint32_t p = 0; !rc && p < run.n_fragments; p++)
            if (dl_plan_fragment_numel(plan, (int)p) != run.numel[p])
                rc = dl_err(DL_ECORRUPT, "fragment %u: the manifest's plan has %zu floats, the run records %llu", p,
                            dl_plan_fragment_numel(plan, (int)p), (unsigned long long)run.numel[p]);
        if (!rc)
            printf("  model: a manifest of %d tensors (%zu floats): matches the fingerprint and fragment sizes\n",
                   dl_manifest_ntensors(run.manifest), dl_manifest_numel(run.manifest));
        dl_plan_close(&plan);
        dl_store_close(&s);
        return rc;
    }
    if (!rc) rc = dl_model_plan_open(&run.model, (int)run.n_fragments, &plan);
    if (!rc && dl_model_fingerprint(&run.model, plan) != run.fingerprint)
        rc = dl_err(DL_ECORRUPT, "the run's model (L=%d NH=%d C=%d T=%d V=%d, P=%u) has fingerprint %016llx, the run "
                    "records %016llx", run.model.n_layer, run.model.n_head, run.model.n_embd, run.model.seq_len,
                    run.model.vocab, run.n_fragments, (unsigned long long)dl_model_fingerprint(&run.model, plan),
                    (unsigned long long)run.fingerprint);
    for (uint32_t p = 0; !rc && p < run.n_fragments; p++)
        if (dl_plan_fragment_numel(plan, (int)p) != run.numel[p])
            rc = dl_err(DL_ECORRUPT, "fragment %u: the model's plan has %zu floats, the run records %llu", p,
                        dl_plan_fragment_numel(plan, (int)p), (unsigned long long)run.numel[p]);
    if (!rc)
        printf("  model: L=%d NH=%d C=%d T=%d V=%d, init seed %llu: matches the fingerprint and fragment sizes\n",
               run.model.n_layer, run.model.n_head, run.model.n_embd, run.model.seq_len, run.model.vocab,
               (unsigned long long)run.seed);
    dl_plan_close(&plan);
    dl_store_close(&s);
    return rc;
}

typedef struct {
    uint64_t records, contribs, merged, dropped, rejected;
    double stale_sum;
} merge_stats;

static int count_merge(const dl_merge_record *r, void *ctx)
{
    merge_stats *ms = ctx;
    ms->records++;
    for (uint32_t i = 0; i < r->n_contrib; i++) {
        ms->contribs++;
        if (r->contrib[i].decision == DL_MERGE_MERGED) {
            ms->merged++;
            ms->stale_sum += (double)r->contrib[i].staleness;
        } else if (r->contrib[i].decision == DL_MERGE_DROPPED_STALE) {
            ms->dropped++;
        } else {
            ms->rejected++;
        }
    }
    return 0;
}

static int print_learner(const dl_store_learner *l, void *ctx)
{
    (void)ctx;
    printf("learner %s: pushes %llu merged %llu dropped %llu rejected %llu tokens_applied %llu bytes_in %llu bytes_out "
           "%llu step %llu tokens %llu\n",
           l->id, (unsigned long long)l->pushes, (unsigned long long)l->merged, (unsigned long long)l->dropped,
           (unsigned long long)l->rejected, (unsigned long long)l->tokens_applied, (unsigned long long)l->bytes_in,
           (unsigned long long)l->bytes_out, (unsigned long long)l->step, (unsigned long long)l->tokens);
    return 0;
}

/* `dloco status STORE` as text (tools/status.c has the rest of status). */
int dl_status_store_text(const char *dir);
int dl_status_store_text(const char *dir)
{
    dl_store_opts o = dl_store_opts_default();
    o.read_only = 1;
    dl_store *s = NULL;
    int rc = dl_store_open(dir, &o, &s);
    if (rc) return fail("opening the store", rc);
    dl_store_run run;
    if ((rc = dl_store_get_run(s, &run))) {
        dl_store_close(&s);
        return fail("reading the run", rc);
    }
    uint64_t epoch = 0;
    dl_store_get_epoch(s, &epoch);
    printf("run %s: fingerprint %016llx, %u fragments, epoch %llu\n", run.run_id, (unsigned long long)run.fingerprint,
           run.n_fragments, (unsigned long long)epoch);
    if (run.manifest)
        printf("model: a manifest of %d tensors, %zu floats (dloco manifest %s prints it)\n",
               dl_manifest_ntensors(run.manifest), dl_manifest_numel(run.manifest), dir);
    else
        printf("model: L=%d NH=%d C=%d T=%d V=%d, init seed %llu\n", run.model.n_layer, run.model.n_head,
               run.model.n_embd, run.model.seq_len, run.model.vocab, (unsigned long long)run.seed);
    /* live: what the current state occupies; file: what it has grown to
     * (LMDB never shrinks it); the difference is free pages commits reuse */
    dl_store_stats st;
    if (!dl_store_get_stats(s, &st))
        printf("store: file %.1f MB, live %.1f MB (params and any momentum %.1f MB), free %.1f MB, map %.0f MiB, "
               "page %u B\n",
               st.file_bytes / 1e6, st.live_bytes / 1e6, st.state_bytes / 1e6, st.free_bytes / 1e6,
               st.map_size / 1048576.0, st.page_size);
    dl_store_shard lay;
    if (dl_store_get_shard(s, &lay) == 0 && lay.shards > 1)
        printf("shard %u of %u: fragments p with p %% %u == %u (the others stay at version 0 here)\n", lay.shard,
               lay.shards, lay.shards, lay.shard);
    merge_stats ms = {0};
    printf("versions:");
    for (uint32_t p = 0; p < run.n_fragments; p++) {
        uint64_t v = 0;
        dl_store_read_fragment(s, p, &v, NULL, NULL);
        printf(" %llu", (unsigned long long)v);
        dl_store_foreach_merge(s, p, 1, count_merge, &ms);
    }
    printf("\nmerges %llu: %llu contributions merged (mean staleness %.3f), %llu dropped stale, %llu rejected\n",
           (unsigned long long)ms.records, (unsigned long long)ms.merged, ms.merged ? ms.stale_sum / (double)ms.merged : 0.0,
           (unsigned long long)ms.dropped, (unsigned long long)ms.rejected);
    dl_store_ledger led;
    /* Each push reports the tokens behind one fragment's delta, so the ledger
     * counts fragment-tokens: a token a learner trained on appears once per
     * fragment. The one unit everywhere (check, status, metrics, events),
     * printed exact and named. */
    if (!dl_store_ledger_get(s, &led))
        printf("token ledger (fragment-tokens): applied %llu, dropped_stale %llu, rejected %llu, lost %llu, "
               "discarded %llu, outstanding %llu\n",
               (unsigned long long)led.tokens[DL_LEDGER_APPLIED],
               (unsigned long long)led.tokens[DL_LEDGER_DROPPED_STALE],
               (unsigned long long)led.tokens[DL_LEDGER_REJECTED], (unsigned long long)led.tokens[DL_LEDGER_LOST],
               (unsigned long long)led.tokens[DL_LEDGER_DISCARDED],
               (unsigned long long)led.tokens[DL_LEDGER_OUTSTANDING]);
    dl_store_foreach_learner(s, print_learner, NULL);
    for (uint32_t p = 0; p < run.n_fragments; p++) {
        uint64_t v = 0;
        dl_merge_record r;
        if (dl_store_read_fragment(s, p, &v, NULL, NULL) || !v || dl_store_get_merge(s, p, v, &r)) continue;
        uint32_t merged = 0;
        for (uint32_t i = 0; i < r.n_contrib; i++) merged += r.contrib[i].decision == DL_MERGE_MERGED;
        printf("fragment %u: version %llu, last merge %.1f s ago (epoch %llu), %u contributor(s)\n", p,
               (unsigned long long)v, (double)(dl_wallclock_ns() - r.wallclock_ns) * 1e-9,
               (unsigned long long)r.epoch, merged);
        dl_merge_record_free(&r);
    }
    dl_store_eval ev;
    dl_store_evaldata ed;
    if (dl_store_get_evaldata(s, &ed)) snprintf(ed.path, sizeof ed.path, "unrecorded data");
    if (dl_store_get_eval(s, &ev) == 0)
        printf("global validation loss %.4f on %s at total version %llu (%u sequences, %.0f s ago)\n", ev.loss,
               ed.path, (unsigned long long)ev.version, ev.seqs, (double)(dl_wallclock_ns() - ev.wallclock_ns) * 1e-9);
    dl_store_close(&s);
    return 0;
}

static int print_record(const dl_merge_record *r, void *ctx)
{
    uint32_t p = *(const uint32_t *)ctx;
    static const char *dec[] = {"merged", "dropped_stale", "rejected"};
    for (uint32_t i = 0; i < r->n_contrib; i++) {
        const dl_merge_contrib *c = &r->contrib[i];
        printf("%u %llu %s %s %llu %llu %.6f epoch=%llu\n", p, (unsigned long long)r->version, c->learner_id,
               c->decision >= 0 && c->decision <= 2 ? dec[c->decision] : "?", (unsigned long long)c->staleness,
               (unsigned long long)c->tokens, c->weight, (unsigned long long)r->epoch);
    }
    return 0;
}

static int cmd_records(const char *dir)
{
    dl_store_opts o = dl_store_opts_default();
    o.read_only = 1;
    dl_store *s = NULL;
    int rc = dl_store_open(dir, &o, &s);
    if (rc) return fail("opening the store", rc);
    uint32_t P = dl_store_n_fragments(s);
    /* one header line naming the columns print_record writes, then one line per contribution */
    printf("fragment version learner decision staleness tokens weight epoch\n");
    for (uint32_t p = 0; p < P && !rc; p++) rc = dl_store_foreach_merge(s, p, 1, print_record, &p);
    dl_store_close(&s);
    return rc < 0 ? fail("reading merge records", rc) : 0;
}

typedef struct {
    char data[DL_CFG_STRLEN];
    char data_format[DL_CFG_STRLEN];
    int64_t batch, val_batches;
    double val_frac;
    char dump_seqs[DL_CFG_STRLEN];
    int json;
} eval_cfg;

#define F(x) offsetof(eval_cfg, x)
static const dl_cfg_entry eval_table[] = {
    {"data", DL_CFG_STR, F(data), 0, 0, "", NULL, 0,
     "data to evaluate on (same vocab as the run); empty = the data the run recorded (dloco-sync --eval_data), "
     "else the bundled fortunes text"},
    {"data_format", DL_CFG_ENUM, F(data_format), 0, 0, "auto", "auto|text|shards", 0,
     "auto: .bin = llm.c token shards, else text, which then needs the store's vocab to be 256; text: bytes "
     "whatever the vocab (>= 256)"},
    {"batch", DL_CFG_INT, F(batch), 1, 4096, "16", NULL, 0, "sequences per evaluation batch"},
    {"val_batches", DL_CFG_INT, F(val_batches), 1, 100000, "16", NULL, 0, "evaluation batches"},
    {"val_frac", DL_CFG_FLOAT, F(val_frac), -1.0, 0.5, "-1", NULL, 0,
     "validation fraction the learners used; -1 = the one the run recorded with its data, else 0.05"},
    {"dump_seqs", DL_CFG_STR, F(dump_seqs), 0, 0, "", NULL, 0,
     "also write the evaluated sequences here: int32 LE header {0x51534c44, 1, batches, B, T, V, 0, 0}, then per "
     "sequence T inputs and T targets"},
    {"json", DL_CFG_BOOL, F(json), 0, 0, "false", NULL, 0,
     "print one JSON object (run_id, fragments, total_version, val_loss, batches, batch, seq_len) instead of the line"},
};
#undef F

static int cmd_eval(const char *dir, int argc, char **argv)
{
    eval_cfg ec;
    static const dl_cfg_main preamble = {"dloco eval"};
    int rc;
    if (dl_cfg_main_parse(eval_table, sizeof eval_table / sizeof eval_table[0], &ec, &preamble, argc, argv, &rc))
        return rc;
    dl_store_opts o = dl_store_opts_default();
    o.read_only = 1;
    dl_store *s = NULL;
    if ((rc = dl_store_open(dir, &o, &s))) return fail("opening the store", rc);
    dl_store_run run;
    dl_plan *plan = NULL;
    dl_evaluate *ev = NULL;
    if (dl_store_get_run(s, &run) == 0 && run.manifest) {
        rc = dl_err(DL_EINVAL, "run %s's model is described by a manifest (%d tensors), and dloco eval evaluates "
                    "dloco's GPT-2 only: evaluate an export (dloco export %s --format safetensors OUT) with the "
                    "model's own code", run.run_id, dl_manifest_ntensors(run.manifest), dir);
        dl_store_close(&s);
        return fail("eval", rc);
    }
    if ((rc = dl_store_get_run(s, &run)) || (rc = dl_model_plan_open(&run.model, (int)run.n_fragments, &plan))) {
        dl_store_close(&s);
        return fail("reading the run", rc);
    }
    const dl_model_config m = run.model;
    int P = (int)run.n_fragments;
    if (dl_model_fingerprint(&m, plan) != run.fingerprint) {
        dl_plan_close(&plan);
        dl_store_close(&s);
        return fail("reading the run", dl_err(DL_EMISMATCH, "model config in the store does not match its fingerprint"));
    }
    /* the data: --data, else the run's record, else the bundled corpus */
    dl_store_evaldata ed;
    int recorded = dl_store_get_evaldata(s, &ed) == 0;
    const char *data = ec.data[0] ? ec.data : recorded ? ed.path : "/usr/share/games/fortunes";
    const char *format = !ec.data[0] && recorded && !strcmp(ec.data_format, "auto") ? ed.format : ec.data_format;
    double val_frac = ec.val_frac >= 0 ? ec.val_frac : !ec.data[0] && recorded ? ed.val_frac : 0.05;
    const char *whence = ec.data[0] ? "--data" : recorded ? "the run's recorded evaluation data" : "the default";
    /* the synchronizer's periodic evaluation runs the same code (gpt/evaluate.h) */
    dl_evaluate_opts eo = {.data = data, .data_format = format, .val_frac = val_frac, .batch = (int)ec.batch,
                           .seqs = (int)(ec.batch * ec.val_batches)};
    uint64_t vsum = 0;
    double loss = 0;
    if ((rc = dl_evaluate_open(&m, &eo, &ev)) || (rc = dl_evaluate_load(ev, s, plan, &vsum)) ||
        (rc = dl_evaluate_run(ev, NULL, &loss)))
        goto out;
    if (ec.json) {
        /* for scripts: the loss at full precision (a diverged model's is null: JSON has no NaN) */
        dl_json_w w = {.f = stdout};
        dl_json_w_open(&w, NULL, '{', 1);
        dl_json_w_str(&w, "run_id", run.run_id);
        dl_json_w_int(&w, "fragments", P);
        dl_json_w_u64(&w, "total_version", vsum);
        dl_json_w_num(&w, "val_loss", loss);
        dl_json_w_str(&w, "data", data);
        dl_json_w_int(&w, "batches", (long long)ec.val_batches);
        dl_json_w_int(&w, "batch", (long long)ec.batch);
        dl_json_w_int(&w, "seq_len", m.seq_len);
        dl_json_w_close(&w, '}');
        putchar('\n');
    } else {
        printf("global model: run %s, %d fragments at total version %llu, val loss %.4f on %s (%s; %lld batches of %d "
               "x %d, val_frac %g)\n",
               run.run_id, P, (unsigned long long)vsum, loss, data, whence, (long long)ec.val_batches, (int)ec.batch,
               m.seq_len, val_frac);
    }
    if (ec.dump_seqs[0] && (rc = dl_evaluate_dump(ev, ec.dump_seqs))) goto out;
    if (ec.dump_seqs[0] && !ec.json)
        printf("eval: %d sequences of %d tokens written to %s; val_loss=%.9f\n", dl_evaluate_seqs(ev), m.seq_len,
               ec.dump_seqs, loss);
out:
    dl_evaluate_close(&ev);
    dl_plan_close(&plan);
    dl_store_close(&s);
    return rc ? fail("eval", rc) : 0;
}

typedef struct {
    dl_model_opts model;
    int64_t shards;
    char manifest[DL_CFG_STRLEN];
} plan_cfg;

static const dl_cfg_entry plan_table[] = {
    DL_MODEL_CFG_ROWS(plan_cfg, model, "256", "model: vocabulary (V)"),
    {"shards", DL_CFG_INT, offsetof(plan_cfg, shards), 1, 4096, "1", NULL, 0,
     "also show the bytes each of this many synchronizer shards owns (fragment p belongs to shard p % shards)"},
    {"manifest", DL_CFG_STR, offsetof(plan_cfg, manifest), 0, 0, "", NULL, 0,
     "the plan of this manifest's model (JSON, or a safetensors file carrying one) instead of a GPT-2 config"},
};

/* The plan every learner and the synchronizer of this model would build:
 * one line per fragment with its blocks in payload order. */
static int cmd_plan(int argc, char **argv)
{
    size_t nrows = sizeof plan_table / sizeof plan_table[0];
    plan_cfg pc;
    dl_model_config m;
    dl_plan *plan = NULL;
    static const dl_cfg_main preamble = {"dloco plan"};
    int rc;
    if (dl_cfg_main_parse(plan_table, nrows, &pc, &preamble, argc, argv, &rc)) return rc;
    dl_manifest *man = NULL;
    if (pc.manifest[0]) {
        int guessed = 0;
        rc = dl_tensorfile_guess_manifest(pc.manifest, &man, &guessed);
        if (rc == DL_EFORMAT || rc == DL_ETRUNC) rc = dl_manifest_load(pc.manifest, &man);
        if (!rc && guessed) rc = dl_err(DL_EINVAL, "%s carries no manifest", pc.manifest);
        if (!rc) rc = dl_manifest_plan_open(man, (int)pc.model.fragments, &plan);
        if (rc) {
            dl_manifest_close(&man);
            return fail("plan", rc);
        }
    } else if ((rc = dl_model_config_from(&pc.model, &m)) ||
               (rc = dl_model_plan_open(&m, (int)pc.model.fragments, &plan))) {
        return fail("plan", rc);
    }
    int P = dl_plan_P(plan), nt = dl_plan_ntensors(plan), nsplit = 0;
    size_t total = dl_plan_total_numel(plan), lo = (size_t)-1, hi = 0;
    for (int i = 0; i < nt; i++) nsplit += dl_plan_tensor_nblocks(plan, i) > 1;
    for (int p = 0; p < P; p++) {
        size_t n = dl_plan_fragment_numel(plan, p);
        lo = n < lo ? n : lo;
        hi = n > hi ? n : hi;
    }
    if (man)
        printf("model of manifest %s, P=%d: %zu floats (%.3f MB) in %d tensors, %d blocks, %d split\n", pc.manifest, P,
               total, total * 4 / 1e6, nt, dl_plan_nblocks(plan), nsplit);
    else
        printf("model L=%d NH=%d C=%d T=%d V=%d (Vp=%d), P=%d: %zu floats (%.3f MB) in %d tensors, %d blocks, %d split\n",
               m.n_layer, m.n_head, m.n_embd, m.seq_len, m.vocab, m.padded_vocab, P, total, total * 4 / 1e6, nt,
               dl_plan_nblocks(plan), nsplit);
    printf("fingerprint %016llx; fragments %.3f..%.3f MB, max/min %.5f, max/mean %.5f\n",
           (unsigned long long)(man ? dl_manifest_fingerprint(man, plan) : dl_model_fingerprint(&m, plan)),
           lo * 4 / 1e6, hi * 4 / 1e6, (double)hi / (double)lo, dl_plan_imbalance(plan));
    dl_manifest_close(&man);
    for (int p = 0; p < P; p++) {
        int ns;
        const dl_plan_span *sp = dl_plan_fragment_spans(plan, p, &ns);
        printf("fragment %d: %zu floats (%.3f MB), %d blocks:", p, dl_plan_fragment_numel(plan, p),
               dl_plan_fragment_numel(plan, p) * 4 / 1e6, ns);
        for (int k = 0; k < ns; k++) {
            const dl_tensor *t = dl_plan_tensor(plan, sp[k].tensor);
            size_t w = t->numel / (size_t)t->shape[0]; /* a row: shape[0] slices */
            if (sp[k].numel == t->numel) printf(" %s", t->name);
            else printf(" %s[%zu:%zu)", t->name, sp[k].start / w, (sp[k].start + sp[k].numel) / w);
        }
        printf("\n");
    }
    int S = (int)pc.shards;
    if (S > 1 && (rc = dl_shard_check(P, 0, S))) {
        dl_plan_close(&plan);
        return fail("plan", rc);
    }
    for (int k = 0; S > 1 && k < S; k++) {
        size_t n = 0;
        int nf = 0;
        for (int p = 0; p < P; p++)
            if (dl_shard_owns(p, k, S)) n += dl_plan_fragment_numel(plan, p), nf++;
        printf("shard %d of %d: %d fragments, %zu floats (%.3f MB), %.5f of the mean\n", k, S, nf, n, n * 4 / 1e6,
               (double)n * S / (double)total);
    }
    dl_plan_close(&plan);
    return 0;
}

/* Every missing directory above `path` (keys/sync: keys/), mode 0700: a
 * fresh clone has no keys/ and the keys are secrets. */
static int make_parent_dirs(const char *path)
{
    char dir[PATH_MAX];
    if ((size_t)snprintf(dir, sizeof dir, "%s", path) >= sizeof dir)
        return dl_err(DL_EINVAL, "key prefix is %zu bytes: too long for a path", strlen(path));
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = 0;
    for (char *p = dir + 1;; p++) {
        if (*p && *p != '/') continue;
        char c = *p;
        *p = 0;
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            return dl_err(DL_EIO, "cannot make directory %s for the keys: %s", dir, strerror(errno));
        if (!c) break;
        *p = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dl_err(DL_EIO, "%s is not a directory: give a key prefix inside a directory", dir);
    return 0;
}

/* The manifest a store's run records (a GPT-2 run's: its table, "gpt" set). */
static int store_manifest(const char *dir)
{
    dl_store_opts o = dl_store_opts_default();
    o.read_only = 1;
    dl_store *s = NULL;
    dl_store_run run;
    dl_manifest *own = NULL;
    char *js = NULL;
    int rc = dl_store_open(dir, &o, &s);
    if (!rc) rc = dl_store_get_run(s, &run);
    if (!rc && !run.manifest) rc = dl_manifest_from_gpt(&run.model, &own);
    if (!rc) rc = dl_manifest_to_json(run.manifest ? run.manifest : own, &js, NULL);
    if (!rc) fputs(js, stdout);
    free(js);
    dl_manifest_close(&own);
    dl_store_close(&s);
    return rc ? fail("manifest", rc) : 0;
}

/* A model's manifest as JSON on stdout: the one a safetensors file carries,
 * or one guessed from its tensors (said on stderr), or a manifest JSON file
 * checked and written back in the canonical form. */
static int cmd_manifest(const char *path)
{
    dl_manifest *m = NULL;
    int guessed = 0;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return store_manifest(path);
    /* a safetensors file first: its header is read, not its weights */
    int rc = dl_tensorfile_guess_manifest(path, &m, &guessed);
    if (rc == DL_EFORMAT || rc == DL_ETRUNC) rc = dl_manifest_load(path, &m);
    char *js = NULL;
    if (!rc) rc = dl_manifest_to_json(m, &js, NULL);
    if (rc) {
        dl_manifest_close(&m);
        return fail("manifest", rc);
    }
    fputs(js, stdout);
    if (guessed)
        fprintf(stderr, "dloco manifest: %s carries no manifest; roles guessed (embedding: 2-D tensors named like "
                        "an embedding; vector: 1-D; matrix: the rest), in the file's data order: check them\n",
                path);
    free(js);
    dl_manifest_close(&m);
    return 0;
}

/* A new key pair for a learner or the synchronizer. The allowlist line uses
 * the file name as the learner id when it is one, so `dloco keygen keys/l3`
 * prints a line ready for the synchronizer's allowlist. */
static int cmd_keygen(const char *prefix)
{
    dl_auth_keypair kp;
    int rc = make_parent_dirs(prefix);
    if (!rc) rc = dl_auth_keygen(prefix, &kp);
    if (rc) {
        fprintf(stderr, "dloco keygen: %s: %s\n", dl_strerror(rc), dl_errmsg());
        return 1;
    }
    const char *slash = strrchr(prefix, '/');
    const char *base = slash ? slash + 1 : prefix;
    printf("wrote %s.key (secret, mode 0600) and %s.pub (mode 0644)\n", prefix, prefix);
    printf("public key: %s\n", kp.public_z85);
    printf("allowlist line: %s %s\n", dl_auth_id_ok(base) ? base : "<learner_id>", kp.public_z85);
    explicit_bzero(&kp, sizeof kp);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "eval") && dl_blas_select(&argc, argv)) return 2; /* kernels/blas_select.h */
    dl_log_set_level(DL_LOG_WARN);
    dl_log_set_name("dloco");
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    /* dloco CMD --help: that command's block, and its options where it has a table */
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-h") && strcmp(argv[i], "--help")) continue;
        for (size_t c = 0; c < NCOMMANDS; c++) {
            if (strcmp(argv[1], commands[c].name)) continue;
            printf("usage: dloco %s", commands[c].text + 2);
            char *help[] = {argv[1], "--help"};
            if (!strcmp(argv[1], "eval")) return cmd_eval(NULL, 2, help);
            if (!strcmp(argv[1], "plan")) return cmd_plan(2, help);
            if (!strcmp(argv[1], "export")) return dl_export_cmd(NULL, 2, help);
            return 0;
        }
        break;
    }
    if (!strcmp(argv[1], "plan")) return cmd_plan(argc - 1, argv + 1);
    if (argc < 3) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1], *dir = argv[2];
    if (!strcmp(cmd, "check")) {
        int rc = dl_store_check(dir, stdout);
        if (!rc) rc = check_model(dir);
        if (rc) {
            fprintf(stderr, "dloco check: %s: %s\n", dl_strerror(rc), dl_errmsg());
            return 1;
        }
        return 0;
    }
    if (!strcmp(cmd, "status")) return dl_status_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "records")) return cmd_records(dir);
    if (!strcmp(cmd, "eval")) return cmd_eval(dir, argc - 2, argv + 2);
    if (!strcmp(cmd, "export")) return dl_export_cmd(dir, argc - 2, argv + 2);
    if (!strcmp(cmd, "keygen")) return cmd_keygen(dir);
    if (!strcmp(cmd, "manifest")) return cmd_manifest(dir);
    fprintf(stderr, "dloco: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
