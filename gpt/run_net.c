/* dloco-learner networked (the default): the trainer over the learner library (include/dloco/learner.h) --
 * the recovery file, the library's handle and parameter interface, join, the training loop that pushes
 * fragments to dloco-sync and adopts its global ones, the final flush and the summary (docs/PROTOCOL.md). */
#include "gpt/main_int.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/clock.h"
#include "core/codec.h"
#include "core/err.h"
#include "core/event.h"
#include "core/log.h"
#include "core/model.h"
#include "core/plan.h"
#include "gpt/dynh.h"
#include "gpt/gpa.h"
#include "gpt/pushtiming.h"
#include "gpt/recovery.h"
#include "kernels/codec.h"
#include "learner/comms.h"
#include "learner/learner_int.h"
#include "learner/metrics.h"
#include "learner/node.h"
#ifdef DLOCO_HAVE_CUDA
#include "gpt/gpt_cuda.h"
#include "gpt/xfer_cuda.h"
#endif

static int resumed_from_recovery;

/* Sleep s seconds (none when s <= 0), cut short by a stop. */
static void sleep_s(double s)
{
    if (s <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && !dl_main_stop) {}
}

/* The recovery file of a networked learner (gpt/recovery.h): its path from
 * --recovery / --state_dir / --id, then a resume from it when it is this
 * learner's. *out stays NULL when there is none (off, a default id, adam_fleet on a GPU). */
static int open_recovery(const learner_cfg *cfg, int id_given, dl_trainer *tr, dl_recovery **out)
{
    *out = NULL;
    char path[2 * DL_CFG_STRLEN + 32];
    if (!strcmp(cfg->recovery, "off")) return 0;
    if (cfg->adam_fleet != 0.0 && dl_trainer_device(tr) == DL_DEVICE_CUDA) {
        printf("recovery: off (a run with adam_fleet on a GPU cannot resume its optimizer state yet)\n");
        return 0;
    }
    if (cfg->recovery[0]) snprintf(path, sizeof path, "%s", cfg->recovery);
    else if (!id_given) {
        printf("recovery: off (no --id: a restart under the default id %s would not find it again)\n", cfg->id);
        return 0;
    } else {
        if (cfg->state_dir[0] && mkdir(cfg->state_dir, 0755) != 0 && errno != EEXIST)
            return dl_err(DL_EIO, "option state_dir: cannot create %s: %s", cfg->state_dir, strerror(errno));
        snprintf(path, sizeof path, "%s%sdloco-%s.recovery", cfg->state_dir, cfg->state_dir[0] ? "/" : "", cfg->id);
    }
    dl_recovery_opts o = {.path = path,
                          .every_s = cfg->recovery_every_s,
                          .budget = cfg->recovery_budget,
                          .every_steps = cfg->recovery_every_steps,
                          .max_step = cfg->steps,
                          .run_tag = dl_recovery_tag(cfg->run_id, cfg->id),
                          .id = cfg->id};
    DL_TRY(dl_recovery_open(&o, out));
    int rc = dl_recovery_prepare(*out, tr);
    if (rc) {
        dl_recovery_close(out);
        return dl_err(rc, "recovery file %s: %s (or give --recovery off)", path, dl_errmsg());
    }
    char why[1024];
    if (dl_recovery_load(*out, tr, why, sizeof why)) {
        resumed_from_recovery = 1;
        printf("recovery: resumed at step %lld (learning-rate schedule, optimizer state, data position) from %s%s\n",
               (long long)dl_trainer_steps_done(tr), path, cfg->resume[0] ? " (not --resume: this file is newer)" : "");
    } else if (why[0]) {
        printf("recovery: %s not used (%s); starting fresh\n", path, why);
    } else {
        if (cfg->recovery_budget > 0 && cfg->recovery_every_s > 0)
            printf("recovery: %s (written as often as %g%% of the time allows, every %g to %g s, or %lld steps, and at "
                   "the finish; none yet: starting fresh)\n", path, 100 * cfg->recovery_budget, DL_RECOVERY_MIN_S,
                   cfg->recovery_every_s, (long long)cfg->recovery_every_steps);
        else
            printf("recovery: %s (written every %g s or %lld steps and at the finish; none yet: starting fresh)\n",
                   path, cfg->recovery_every_s, (long long)cfg->recovery_every_steps);
    }
    return 0;
}

/* dl_recovery_copy_fn over the library handle */
static int learner_state_copy(void *ctx, void **buf, size_t *cap, size_t *len)
{
    return dl_learner_state_copy(ctx, buf, cap, len);
}

/* The library's handle over this trainer, join, the training loop with its pushes and adopts, the final
 * flush, the recovery file's finish and the summary. Returns the exit code. */
static int train(const learner_cfg *cfg, dl_trainer *tr, const dl_train_cfg *tc, const char *hello_device,
                 FILE *losslog, dl_recovery *rec)
{
    const dl_model_config *mc = dl_trainer_model_cfg(tr);
    int rc;
    dl_pushtiming tmg;
    if ((rc = dl_pushtiming_prepare(cfg, (int)cfg->model.fragments, &tmg))) {
        dl_pushtiming_finish(&tmg, 0);
        return dl_main_fail("setting up the sync timing", rc);
    }
    /* The learner library (include/dloco/learner.h) with this GPT-2 as its manifest: its Hello and fingerprint
     * are the ones this program always sent. */
    dloco_gpt2_config g2 = {.n_layer = mc->n_layer, .n_head = mc->n_head, .n_embd = mc->n_embd,
                            .seq_len = mc->seq_len, .vocab = mc->vocab};
    int nt = dloco_learner_gpt2_manifest(&g2, NULL, 0);
    dloco_tensor *man = nt > 0 ? dl_try_calloc((size_t)nt, sizeof *man) : NULL;
    if (!man || dloco_learner_gpt2_manifest(&g2, man, nt) != nt) {
        free(man);
        dl_pushtiming_finish(&tmg, 0);
        return dl_main_fail("describing the model", nt < 0 ? nt : DL_ENOMEM);
    }
    dloco_learner_opts lo;
    dloco_learner_opts_init(&lo);
    lo.connect = cfg->connect;
    lo.run_id = cfg->run_id;
    lo.learner_id = cfg->id;
    lo.fragments = (int32_t)cfg->model.fragments;
    lo.tensors = man;
    lo.n_tensors = nt;
    lo.max_tokens_per_step = (uint64_t)tc->batch * (uint64_t)mc->seq_len;
    lo.gpt2 = &g2;
    lo.device = hello_device;
    dl_learner_netcfg net;
    dl_options_net_rows(cfg, &net);
    /* the library's own state beside the recovery file: restored at join when the trainer resumed at its step */
    if (rec) snprintf(net.state_path, sizeof net.state_path, "%s", dl_recovery_learner_path(rec));
    /* The node reaches theta through a parameter interface: the host buffer
     * directly on the cpu (the library's contiguous binding); on a GPU the
     * fragment copies of xfer_cuda.c, whose pushes complete one step later so
     * the copy overlaps the next step; with gpa, x (an adopt moves y with it). */
    dl_node_model *gpa_model = NULL;
    const dl_node_model *model = NULL;
#ifdef DLOCO_HAVE_CUDA
    dl_gptc_xfer *xfer = NULL;
#endif
    dloco_learner *lib = NULL;
    dl_plan *plan = NULL; /* the parameter interfaces' plan: the library's, built the same way */
    rc = dl_model_plan_open(mc, (int)cfg->model.fragments, &plan);
    if (rc) {
        free(man);
        dl_pushtiming_finish(&tmg, 0);
        return dl_main_fail("building the fragment plan (option fragments)", rc);
    }
    if (dl_trainer_gpa_y(tr) &&
        (rc = dl_gpa_node_model_open(plan, dl_gpt_params(dl_trainer_model(tr)), dl_trainer_gpa_y(tr), &gpa_model)))
        rc = dl_main_fail("setting up the gpa parameter interface", rc);
    model = gpa_model;
#ifdef DLOCO_HAVE_CUDA
    if (!rc && dl_trainer_device(tr) == DL_DEVICE_CUDA) {
        if ((rc = dl_gptc_xfer_open(dl_trainer_gptc(tr), plan, &xfer))) rc = dl_main_fail("setting up the GPU fragment copies", rc);
        else model = dl_gptc_xfer_model(xfer);
    }
#endif
    dl_learner_ext ext = {.net = &net,
                          .model = model,
                          .due = tmg.on ? dl_pushtiming_due : NULL,
                          .due_ctx = &tmg,
                          .byzantine = cfg->byz_on,
                          .byzantine_scale = cfg->byz_scale,
                          .hello_batch = (uint32_t)tc->batch,
                          .start_step = dl_trainer_steps_done(tr)};
    if (!rc && (rc = dl_learner_open_ext(&lo, &ext, &lib))) rc = dl_main_fail("bad configuration", rc);
    if (!rc && rec) dl_recovery_set_learner(rec, learner_state_copy, dl_learner_state_write, lib);
    free(man);
    if (!rc && !model &&
        (rc = dloco_learner_bind_contiguous(lib, dl_gpt_params(dl_trainer_model(tr)), dl_trainer_num_params(tr))))
        rc = dl_main_fail("binding the parameters", rc);
    dl_lmet *lmet = NULL; /* --metrics: opened first, so a bad address stops before joining */
    if (!rc && (rc = dl_lmet_open(cfg->metrics, cfg->id, &lmet))) rc = dl_main_fail("starting", rc);
    if (rc) {
        dloco_learner_close(&lib);
        dl_gpa_node_model_close(&gpa_model);
#ifdef DLOCO_HAVE_CUDA
        dl_gptc_xfer_close(&xfer);
#endif
        dl_pushtiming_finish(&tmg, 0);
        dl_plan_close(&plan);
        return rc;
    }
    uint64_t fp = dloco_learner_fingerprint(lib);
    int S = 1;
    for (const char *c = cfg->connect; *c; c++) S += *c == ',';
    dl_main_catch_signals(lib);

    int64_t tok_per_step = (int64_t)tc->batch * mc->seq_len;
    printf("dloco-learner %s: GPT L=%d NH=%d C=%d T=%d V=%d, %zu parameters, B=%d, %d threads\n", cfg->id,
           mc->n_layer, mc->n_head, mc->n_embd, mc->seq_len, mc->vocab, dl_trainer_num_params(tr), tc->batch,
           omp_get_max_threads());
    char pdesc[128];
    printf("synchronizer %s, run %s, P=%d fragments (imbalance %.3f), fingerprint %016llx, adopt %s, adam_fleet %g, "
           "push %s\n",
           cfg->connect, cfg->run_id, dl_plan_P(plan), dl_plan_imbalance(plan), (unsigned long long)fp, cfg->adopt,
           cfg->adam_fleet, dl_options_push_codec_desc(cfg, pdesc, sizeof pdesc));
    fflush(stdout);
    char ev_dev[200], ev_ep[DL_CFG_STRLEN + 8];
    dl_event("learner_start",
             "id=%s mode=networked device=%s params=%zu fragments=%d fingerprint=%016llx endpoint=%s shards=%d "
             "push_codec=%s push_block=%u push_topk=%u push_rounding=%s error_feedback=%d", cfg->id,
             dl_event_str(hello_device, ev_dev, sizeof ev_dev), dl_trainer_num_params(tr), dl_plan_P(plan),
             (unsigned long long)fp, dl_event_str(cfg->connect, ev_ep, sizeof ev_ep), S, dl_codec_name(cfg->pcodec.id),
             cfg->pcodec.block, cfg->pcodec.topk, cfg->push_rounding,
             cfg->error_feedback && cfg->pcodec.id != DL_CODEC_FP32);
    if (cfg->byz_on) {
        char ev_mode[DL_CFG_STRLEN + 8];
        DL_WARN("BYZANTINE MODE '%s': every delta this learner pushes is corrupted on purpose (multiplied by %g); "
                "for robustness benchmarks only, never in a real run", cfg->byzantine, cfg->byz_scale);
        dl_event("byzantine", "id=%s mode=%s scale=%.17g", cfg->id,
                 dl_event_str(cfg->byzantine, ev_mode, sizeof ev_mode), cfg->byz_scale);
    }
    if (cfg->server_key[0]) printf("CURVE: encrypted and authenticated connection to the synchronizer\n");

    int exit_code = 0;
    double t_run = dl_clock_s();
    rc = dloco_learner_join(lib, (int)cfg->connect_timeout_ms);
    /* the library's node, mailbox and sessions (learner/learner_int.h), for what this program reports */
    dl_node *node = dl_learner_node(lib);
    dl_mailbox *mb = dl_learner_mailbox(lib);
    dl_comms **comms = NULL;
    dl_learner_sessions(lib, &comms);
    int64_t step = dl_trainer_steps_done(tr); /* a resumed trainer goes on from its step */
    double last_train = NAN;
    int flush_left = 0;
    if (rc == DLOCO_EREFUSED) {
        fprintf(stderr, "dloco-learner: %s\n", dloco_learner_errmsg(lib));
        exit_code = 3;
    } else if (rc == DLOCO_ESTOPPED) {
        printf("stopped by signal before training\n"); /* the library said Bye */
    } else if (rc) {
        fprintf(stderr, "dloco-learner: joining the synchronizer at %s: %s: %s\n", cfg->connect,
                dloco_learner_strerror(rc), dloco_learner_errmsg(lib));
        exit_code = 2;
    } else {
        printf("joined: holding all %d fragments of the global model, H=%u\n", dl_plan_P(plan), dl_mailbox_h(mb));
        if (tmg.on && (rc = dl_pushtiming_start(&tmg, dl_plan_P(plan), dl_mailbox_h(mb) > 0 ? (int)dl_mailbox_h(mb) : 1))) {
            dl_main_fail("starting the sync timing", rc);
            exit_code = 2;
        }
        {
            dl_node_stats ns;
            dl_node_get_stats(node, &ns);
            dl_event("ready", "id=%s fragments=%d fetched=%llu h=%u wait_s=%.3f", cfg->id, dl_plan_P(plan),
                     (unsigned long long)ns.adopted, dl_mailbox_h(mb), dl_clock_s() - t_run);
        }
        fflush(stdout);
        double t_win = dl_clock_s(), train_sum = 0.0, sps = 0.0;
        /* the step rate heartbeats report (the synchronizer predicts each
         * push from it: synchronizer/policy.h): an EWMA of the step time,
         * updated every step, so the first pushes are predicted too */
        double step_ewma = 0.0;
        int64_t win_steps = 0;
        /* --dynamic_h (gpt/dynh.h; checked by check_hetero) */
        dl_dynh dynh;
        dl_dynh_init(&dynh, !strcmp(cfg->dynamic_h, "speed") ? DL_DYNH_SPEED : DL_DYNH_OFF, (int)cfg->dynamic_h_min,
                     (int)cfg->dynamic_h_max);
        while (!exit_code && step < cfg->steps && !dl_main_stop) {
            float norm = 0.0f;
            double t_step = dl_clock_s(), loss = NAN;
            rc = dl_trainer_step(tr, &loss, &norm);
            step = dl_trainer_steps_done(tr);
            if (rc && rc != DL_ERANGE) {
                dl_main_fail("training step", rc);
                exit_code = 2;
                break;
            }
            /* a straggler on purpose: stretch each step to 1/throttle of its time */
            if (cfg->throttle < 1.0) sleep_s((dl_clock_s() - t_step) * (1.0 / cfg->throttle - 1.0));
            /* a set speed: each step takes at least step_ms_min */
            if (cfg->step_ms_min > 0) sleep_s(cfg->step_ms_min * 1e-3 - (dl_clock_s() - t_step));
            if (rc == DL_ERANGE || !isfinite(loss)) {
                fprintf(stderr,
                        "dloco-learner: training loss became %f (gradient norm %f) at step %lld; stopping (lower --lr?)\n",
                        loss, norm, (long long)step);
                exit_code = 3;
                break;
            }
            if (losslog) fprintf(losslog, "%lld %a\n", (long long)step, loss);
            dl_lmet_step(lmet, dl_clock_s() - t_step, loss, (uint64_t)step, (uint64_t)(step * tok_per_step));
            if (dl_lmet_due(lmet)) {
                dl_comms_stats mcs;
                dl_node_stats mns;
                dl_learner_comms_stats(lib, &mcs);
                dl_node_get_stats(node, &mns);
                dl_lmet_publish(lmet, &mcs, &mns, sps * (double)tok_per_step);
            }
            last_train = loss;
            train_sum += loss;
            win_steps++;
            /* H comes from the (last) Welcome; a re-hello may change it. */
            int H = (int)dl_mailbox_h(mb);
            /* wall seconds behind this step (throttle included): Push.compute_s */
            double compute_s = dl_clock_s() - t_step;
            step_ewma = step_ewma > 0 ? 0.8 * step_ewma + 0.2 * compute_s : compute_s;
            /* progress first: a push of this step must never report more than the
             * learner has reported processing (the ledger's overclaim check) */
            dl_pushtiming_step(&tmg, step, loss);
            /* dynamic H: the schedule step and H of this push cycle (plain: the step and the Welcome's H) */
            int64_t sched = step;
            if (H < 1) H = 1;
            if (dynh.mode != DL_DYNH_OFF) {
                double fleet = 0, own = step_ewma > 0 ? 1.0 / step_ewma : 0.0;
                for (int k = 0; k < S && !(fleet > 0); k++) fleet = dl_comms_fleet_sps(comms[k]);
                int base = H, changed;
                sched = dl_dynh_step(&dynh, step, base, own, fleet, &H, &changed);
                if (changed)
                    dl_event("dynamic_h", "id=%s step=%lld h=%d base_h=%d steps_per_s=%.6g fleet_steps_per_s=%.6g",
                             cfg->id, (long long)step, H, base, own, fleet);
            }
            /* the library's step: progress first (a push of this step must never report more than the
             * learner has reported processing: the ledger's overclaim check), pushes due, adopts, and
             * under sync / sync-elastic the barrier (node.h "Barrier") */
            rc = dl_learner_step_sched(lib, sched, H, (uint64_t)tok_per_step, loss, compute_s, NULL);
            char msg[640];
            int st = dl_mailbox_state(mb, msg, sizeof msg); /* REFUSED or FAILED when any session is */
            if (rc == DLOCO_EREFUSED || st == DL_COMMS_REFUSED) {
                fprintf(stderr, "dloco-learner: %s\n", msg);
                exit_code = 3;
                break;
            }
            if (rc == DLOCO_ENET || st == DL_COMMS_FAILED) {
                fprintf(stderr, "dloco-learner: connection failed: %s\n", msg);
                exit_code = 2;
                break;
            }
            if (rc < 0) {
                fprintf(stderr, "dloco-learner: pushing or adopting fragments: %s: %s\n", dloco_learner_strerror(rc),
                        dloco_learner_errmsg(lib));
                exit_code = 2;
                break;
            }
            if (rec) dl_recovery_step(rec, tr); /* a copy when due; the writer thread writes it */
            int do_val = cfg->local_eval && ((cfg->val_every && step % cfg->val_every == 0) || step == cfg->steps);
            if (step % cfg->log_every == 0 || do_val || step == cfg->steps) {
                double dt = dl_clock_s() - t_win;
                sps = (double)win_steps / dt;
                dl_comms_stats cs;
                dl_node_stats ns;
                dl_learner_comms_stats(lib, &cs);
                dl_node_get_stats(node, &ns);
                printf("step %6lld/%lld | train %.4f | ", (long long)step, (long long)cfg->steps,
                       train_sum / (double)win_steps);
                double lv = NAN;
                if (do_val && dl_trainer_eval(tr, &lv) == 0) printf("local val %.4f | ", lv);
                else if (do_val) printf("local val failed (%s) | ", dl_errmsg());
                printf("%7.0f tok/s | %7.1f ms/step | pushes %llu | adopted %llu | ", sps * (double)tok_per_step,
                       1e3 * dt / (double)win_steps, (unsigned long long)cs.pushes,
                       (unsigned long long)(ns.adopted - ns.rebased));
                if (cs.staleness_n) printf("staleness %.2f | ", (double)cs.staleness_sum / (double)cs.staleness_n);
                else printf("staleness  -   | ");
                /* sync lag: the most steps a fragment has trained past its adopted base;
                 * pending: pushes sent without a final decision yet (as /metrics) */
                uint64_t decided = cs.accepted + cs.dropped_stale + cs.rejected;
                printf("lag %llu steps | pending %llu | ", (unsigned long long)ns.steps_behind_max,
                       (unsigned long long)(cs.pushes > decided ? cs.pushes - decided : 0));
                printf("sent %.2f MB | recv %.2f MB\n", (double)cs.bytes_sent * 1e-6, (double)cs.bytes_recv * 1e-6);
                fflush(stdout);
                dl_event("step", "id=%s step=%lld loss=%.17g tokens=%lld pushes=%llu coalesced=%llu lr=%.9g", cfg->id,
                         (long long)step, train_sum / (double)win_steps, (long long)(step * tok_per_step),
                         (unsigned long long)cs.pushes, (unsigned long long)cs.coalesced,
                         (double)dl_trainer_lr_at(tr, step));
                t_win = dl_clock_s();
                train_sum = 0.0;
                win_steps = 0;
            }
        }
        if (dl_main_stop) printf("stopped by signal at step %lld\n", (long long)step);
        if (exit_code == 0 && cfg->final_flush) {
            flush_left = dloco_learner_finish(lib, (int)cfg->flush_timeout_ms, dl_main_stop ? "signal" : "done");
            if (flush_left < 0) {
                fprintf(stderr, "dloco-learner: final flush: %s: %s\n", dloco_learner_strerror(flush_left),
                        dloco_learner_errmsg(lib));
                exit_code = 2;
            }
        } else if (exit_code == 0) {
            /* the scheduled pushes of the last step still go (a deferred one is not posted yet) */
            if ((rc = dl_node_complete(node)) < 0) exit_code = dl_main_fail("last pushes", rc);
            dl_mailbox_bye(mb, dl_main_stop ? "signal (no flush)" : "done (no flush)", (uint64_t)step);
        }
        else if (mb && dl_mailbox_state(mb, NULL, 0) != DL_COMMS_REFUSED)
            dl_mailbox_bye(mb, "failed", (uint64_t)step); /* diverged: push nothing more, just leave */
    }
    double wall = dl_clock_s() - t_run;
    if (rec) {
        /* a clean finish (a signal included: a preempted learner) leaves its newest state; a failure keeps the
         * last periodic one (a diverged model is not worth resuming) */
        if (exit_code == 0 && step >= cfg->steps) {
            /* every step trained: nothing to resume, and a later start under this id is a new run */
            if ((rc = dl_recovery_remove(rec))) DL_WARN("%s", dl_errmsg());
        } else if (exit_code == 0 && (rc = dl_recovery_finish(rec, tr))) {
            DL_WARN("recovery file not written at the finish: %s", dl_errmsg());
        }
        dl_recovery_stats rs;
        dl_recovery_get_stats(rec, &rs);
        uint64_t copies = rs.writes + rs.failed;
        dl_event("recovery_summary",
                 "id=%s writes=%llu skipped=%llu failed=%llu last_step=%lld copy_ms_mean=%.3f copy_ms_max=%.3f "
                 "write_ms_mean=%.3f removed=%d",
                 cfg->id, (unsigned long long)rs.writes, (unsigned long long)rs.skipped, (unsigned long long)rs.failed,
                 (long long)rs.last_step, copies ? rs.copy_s_sum * 1e3 / (double)copies : 0.0, rs.copy_s_max * 1e3,
                 rs.writes ? rs.write_s_sum * 1e3 / (double)rs.writes : 0.0, rs.removed);
        if (rs.removed) printf("recovery: every step trained; the recovery file is removed\n");
        if (rs.writes)
            printf("recovery: %llu files written, the last at step %lld; copying the state cost %.2f ms per write "
                   "(at most %.2f) on the training thread\n", (unsigned long long)rs.writes, (long long)rs.last_step,
                   copies ? rs.copy_s_sum * 1e3 / (double)copies : 0.0, rs.copy_s_max * 1e3);
    }
    if (exit_code == 0 && cfg->checkpoint[0]) {
        if ((rc = dl_trainer_save(tr, cfg->checkpoint))) exit_code = dl_main_fail("saving checkpoint", rc);
        else {
            char ev_path[DL_CFG_STRLEN + 8];
            printf("checkpoint: %s (step %lld, local parameters)\n", cfg->checkpoint, (long long)step);
            dl_event("checkpoint", "id=%s path=%s step=%lld", cfg->id,
                     dl_event_str(cfg->checkpoint, ev_path, sizeof ev_path), (long long)step);
        }
    }
    for (int k = 0; comms && k < S; k++) dl_comms_stop(comms[k]); /* joins the comms threads; lets the Byes leave */
    dl_comms_stats cs;
    dl_node_stats ns;
    dl_learner_comms_stats(lib, &cs);
    memset(&ns, 0, sizeof ns);
    if (node) dl_node_get_stats(node, &ns);
    if (lmet) {
        dl_lmet_publish(lmet, &cs, &ns, 0);
        dl_lmet_close(&lmet);
    }
    char epochs[DL_MAILBOX_MAX_SESSIONS * 21 + 1] = "";
    for (int k = 0, o = 0; k < S; k++) {
        dl_comms_stats ks = {0};
        if (comms && comms[k]) dl_comms_get_stats(comms[k], &ks);
        o += snprintf(epochs + o, sizeof epochs - (size_t)o, "%s%llu", k ? "," : "", (unsigned long long)ks.epoch);
    }
    if (node) dl_node_get_stats(node, &ns);
    uint64_t decided = cs.accepted + cs.dropped_stale + cs.rejected;
    /* acks_pending: MERGED_PENDING acks received; undecided: pushes sent
     * without a final decision (accepted, dropped_stale, rejected) at exit,
     * which includes pushes the synchronizer replaced by a newer push of the
     * same fragment in the same open round */
    char summary[1536];
    snprintf(summary, sizeof summary, "id=%s steps=%lld tokens=%lld pushes=%llu coalesced=%llu acks_pending=%llu "
           "accepted=%llu dropped_stale=%llu rejected=%llu undecided=%llu updates_adopted=%llu rebased=%llu "
           "updates_superseded=%llu updates_ignored=%llu discarded=%llu flush_unanswered=%d bytes_sent=%llu "
           "bytes_received=%llu epoch=%llu held=%llu held_due=%llu hold_released=%llu discarded_tokens=%llu wall_s=%.3f "
           "final_train_loss=%.6f updates_refused=%llu welcomes_refused=%llu socket_rebuilds=%llu busy=%llu "
           "chunks_sent=%llu chunks_recv=%llu chunks_dropped=%llu pushes_stopped=%llu shards=%d epochs=%s",
           cfg->id, (long long)step, (long long)(step * tok_per_step), (unsigned long long)cs.pushes,
           (unsigned long long)cs.coalesced, (unsigned long long)cs.acks_pending, (unsigned long long)cs.accepted,
           (unsigned long long)cs.dropped_stale, (unsigned long long)cs.rejected,
           (unsigned long long)(cs.pushes > decided ? cs.pushes - decided : 0),
           (unsigned long long)(ns.adopted - ns.rebased), (unsigned long long)ns.rebased,
           (unsigned long long)cs.superseded, (unsigned long long)ns.ignored, (unsigned long long)cs.discarded,
           flush_left, (unsigned long long)cs.bytes_sent, (unsigned long long)cs.bytes_recv,
           (unsigned long long)cs.epoch, (unsigned long long)ns.held, (unsigned long long)ns.held_due,
           (unsigned long long)ns.hold_released, (unsigned long long)ns.discarded_tokens, wall,
           last_train, (unsigned long long)(cs.updates_refused + ns.refused), (unsigned long long)cs.welcomes_refused,
           (unsigned long long)cs.rebuilds, (unsigned long long)cs.busy, (unsigned long long)cs.chunks_sent,
           (unsigned long long)cs.chunks_recv, (unsigned long long)cs.chunks_dropped,
           (unsigned long long)cs.pushes_stopped, S, epochs);
    /* fields added after exit_code go after it in the event (docs/EVENTS.md) */
    char later[320];
    snprintf(later, sizeof later,
             "barrier_waits=%llu barrier_wait_s=%.3f push_codec=%s push_bytes=%llu updates_delta=%llu "
             "updates_delta_missed=%llu",
             (unsigned long long)ns.barrier_waits, ns.barrier_wait_s, dl_codec_name(cfg->pcodec.id),
             (unsigned long long)cs.push_bytes, (unsigned long long)cs.updates_delta,
             (unsigned long long)cs.updates_delta_missed);
    dl_pushtiming_finish(&tmg, step);
    printf("learner-summary: %s %s\n", summary, later);
    dl_event("learner_summary", "%s exit_code=%d %s", summary, exit_code, later);
    fflush(stdout);
    dl_main_catch_signals(NULL);
    dloco_learner_close(&lib);
    dl_gpa_node_model_close(&gpa_model);
#ifdef DLOCO_HAVE_CUDA
    dl_gptc_xfer_close(&xfer);
#endif
    dl_plan_close(&plan);
    return exit_code;
}

int dl_run_net(const learner_cfg *cfg, int id_given, dl_trainer *tr, const dl_train_cfg *tc, const dl_data *data,
               const char *hello_device)
{
    int rc;
    if (cfg->resume[0] && (rc = dl_trainer_resume_optimizer(tr, cfg->resume))) return dl_main_fail("resuming", rc);
    dl_recovery *rec = NULL;
    if ((rc = open_recovery(cfg, id_given, tr, &rec))) return dl_main_fail("bad configuration", rc);
    dl_main_print_data(cfg, data, tc->model.vocab);
    if (cfg->resume[0] && !resumed_from_recovery)
        printf("resumed the step (%lld) and AdamW state of %s\n", (long long)dl_trainer_steps_done(tr), cfg->resume);
    FILE *ll = NULL;
    if (cfg->loss_log[0] && !(ll = fopen(cfg->loss_log, "a"))) {
        dl_recovery_close(&rec);
        return dl_main_fail("opening loss_log", dl_err(DL_EIO, "%s", cfg->loss_log));
    }
    if (ll) setvbuf(ll, NULL, _IOLBF, 0);
    rc = train(cfg, tr, tc, hello_device, ll, rec);
    dl_recovery_close(&rec);
    if (ll) fclose(ll);
    return rc;
}
