/* dloco: the operator command. check (offline store verification), status
 * (versions, merges, ledger, learners), eval (validation loss of the global
 * model in a store), plan (a model's fragments), export (tools/export.c: the global model as a model file).
 * Read-only on the store: safe while a synchronizer runs. */
#include "core/clock.h"
#include "core/config.h"
#include "core/err.h"
#include "core/json.h"
#include "core/log.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/shard.h"
#include "learner/data.h"
#include "learner/evaluate.h"
#include "learner/gpt.h"
#include "proto/auth.h"
#include "storage/store.h"
#include "tools/export.h"
#include "tools/status.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, int rc)
{
    fprintf(stderr, "dloco: %s: %s%s%s\n", what, dl_strerror(rc), dl_errmsg()[0] ? ": " : "", dl_errmsg());
    return 2;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dloco COMMAND STORE [options]\n"
               "  check  STORE                 verify a store offline (exit 1 on the first violation)\n"
               "  status ADDR|STORE [--json] [--watch [SECONDS]]\n"
               "                               learners, fragments, token ledger, global validation loss: of a\n"
               "                               running synchronizer (ADDR = HOST:PORT of its --metrics) or of a\n"
               "                               store (run, epoch, store sizes, versions, merges too);\n"
               "                               --json one document (docs/OPERATING.md), --watch refreshes\n"
               "  records STORE                a header line, then one line per merge contribution: fragment version\n"
               "                               learner decision staleness tokens weight epoch=E\n"
               "  eval   STORE [--data PATH] [--data_format auto|text|shards] [--batch B] [--val_batches N]\n"
               "         [--val_frac F] [--json]"
               "                               validation loss of the store's global model; --dump_seqs FILE\n"
               "                               also writes the token sequences it evaluated (int32, docs/OPERATING.md);\n"
               "                               --json one object: run_id, fragments, total_version, val_loss, batches,\n"
               "                               batch, seq_len\n"
               "  export STORE [--format safetensors|llmc|hf] [--force] OUT\n"
               "                               the store's global model as a model file (docs/OPERATING.md)\n"
               "  keygen PREFIX                write a new CURVE key pair: PREFIX.key (0600, keep secret) and\n"
               "                               PREFIX.pub (0644); prints the public key and an allowlist line\n"
               "  plan   [--n_layer L] [--n_head NH] [--n_embd C] [--seq_len T] [--vocab V] [--fragments P]\n"
               "         [--shards S]\n"
               "                               the fragment plan of a model: sizes, balance, fingerprint, and\n"
               "                               each fragment's blocks (name, or name[rows) of a split tensor)\n");
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
    printf("model: L=%d NH=%d C=%d T=%d V=%d, init seed %llu\n", run.model.n_layer, run.model.n_head, run.model.n_embd,
           run.model.seq_len, run.model.vocab, (unsigned long long)run.seed);
    /* live: what the current state occupies; file: what it has grown to
     * (LMDB never shrinks it); the difference is free pages commits reuse */
    dl_store_stats st;
    if (!dl_store_get_stats(s, &st))
        printf("store: file %.1f MB, live %.1f MB (params + momentum %.1f MB), free %.1f MB, map %.0f MiB, "
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
    if (dl_store_get_eval(s, &ev) == 0)
        printf("global validation loss %.4f at total version %llu (%u sequences, %.0f s ago)\n", ev.loss,
               (unsigned long long)ev.version, ev.seqs, (double)(dl_wallclock_ns() - ev.wallclock_ns) * 1e-9);
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
    {"data", DL_CFG_STR, F(data), 0, 0, "/usr/share/games/fortunes", NULL, 0, "data the run trained on"},
    {"data_format", DL_CFG_ENUM, F(data_format), 0, 0, "auto", "auto|text|shards", 0,
     "auto: .bin = llm.c token shards, else text, which then needs the store's vocab to be 256; text: bytes "
     "whatever the vocab (>= 256)"},
    {"batch", DL_CFG_INT, F(batch), 1, 4096, "16", NULL, 0, "sequences per evaluation batch"},
    {"val_batches", DL_CFG_INT, F(val_batches), 1, 100000, "16", NULL, 0, "evaluation batches"},
    {"val_frac", DL_CFG_FLOAT, F(val_frac), 0.0, 0.5, "0.05", NULL, 0, "validation fraction the learners used"},
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
    /* the synchronizer's periodic evaluation runs the same code (learner/evaluate.h) */
    dl_evaluate_opts eo = {.data = ec.data, .data_format = ec.data_format, .val_frac = ec.val_frac, .batch = (int)ec.batch,
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
        dl_json_w_int(&w, "batches", (long long)ec.val_batches);
        dl_json_w_int(&w, "batch", (long long)ec.batch);
        dl_json_w_int(&w, "seq_len", m.seq_len);
        dl_json_w_close(&w, '}');
        putchar('\n');
    } else {
        printf("global model: run %s, %d fragments at total version %llu, val loss %.4f (%lld batches of %d x %d)\n",
               run.run_id, P, (unsigned long long)vsum, loss, (long long)ec.val_batches, (int)ec.batch, m.seq_len);
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
} plan_cfg;

static const dl_cfg_entry plan_table[] = {
    DL_MODEL_CFG_ROWS(plan_cfg, model, "256", "model: vocabulary (V)"),
    {"shards", DL_CFG_INT, offsetof(plan_cfg, shards), 1, 4096, "1", NULL, 0,
     "also show the bytes each of this many synchronizer shards owns (fragment p belongs to shard p % shards)"},
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
    if ((rc = dl_model_config_from(&pc.model, &m)) || (rc = dl_model_plan_open(&m, (int)pc.model.fragments, &plan)))
        return fail("plan", rc);
    int P = dl_plan_P(plan), nt = dl_plan_ntensors(plan), nsplit = 0;
    size_t total = dl_plan_total_numel(plan), lo = (size_t)-1, hi = 0;
    for (int i = 0; i < nt; i++) nsplit += dl_plan_tensor_nblocks(plan, i) > 1;
    for (int p = 0; p < P; p++) {
        size_t n = dl_plan_fragment_numel(plan, p);
        lo = n < lo ? n : lo;
        hi = n > hi ? n : hi;
    }
    printf("model L=%d NH=%d C=%d T=%d V=%d (Vp=%d), P=%d: %zu floats (%.3f MB) in %d tensors, %d blocks, %d split\n",
           m.n_layer, m.n_head, m.n_embd, m.seq_len, m.vocab, m.padded_vocab, P, total, total * 4 / 1e6, nt,
           dl_plan_nblocks(plan), nsplit);
    printf("fingerprint %016llx; fragments %.3f..%.3f MB, max/min %.5f, max/mean %.5f\n",
           (unsigned long long)dl_model_fingerprint(&m, plan), lo * 4 / 1e6, hi * 4 / 1e6, (double)hi / (double)lo,
           dl_plan_imbalance(plan));
    for (int p = 0; p < P; p++) {
        int ns;
        const dl_plan_span *sp = dl_plan_fragment_spans(plan, p, &ns);
        printf("fragment %d: %zu floats (%.3f MB), %d blocks:", p, dl_plan_fragment_numel(plan, p),
               dl_plan_fragment_numel(plan, p) * 4 / 1e6, ns);
        for (int k = 0; k < ns; k++) {
            const dl_tensor *t = dl_plan_tensor(plan, sp[k].tensor);
            size_t w = t->ndim == 2 ? (size_t)t->shape[1] : 1;
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

/* A new key pair for a learner or the synchronizer. The allowlist line uses
 * the file name as the learner id when it is one, so `dloco keygen keys/l3`
 * prints a line ready for the synchronizer's allowlist. */
static int cmd_keygen(const char *prefix)
{
    dl_auth_keypair kp;
    int rc = dl_auth_keygen(prefix, &kp);
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
    dl_log_set_level(DL_LOG_WARN);
    dl_log_set_name("dloco");
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
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
    fprintf(stderr, "dloco: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
