/* A networked learner's saved node state (dl_node_state_copy / _restore: bases, versions,
 * counters, error feedback residuals, with a checksum) and its push journal beside it. */
#include "learner/node.h"
#include "learner/node_int.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/err.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/plan.h"
#include "learner/ef.h"
#include "learner/mailbox.h"

/* The push journal (node.h): fragment p's state changed in a way a saved
 * state must not carry across. A failed write is warned once: the next
 * restore then carries what it should not only if the kill follows. */
void dl_node_journal_bump(dl_node *n, int p)
{
    nfrag *f = &n->f[p];
    f->journal++;
    if (n->jfd < 0) return;
    if (pwrite(n->jfd, &f->journal, sizeof f->journal, (off_t)(DL_NODE_JOURNAL_HEAD + 8 * (size_t)p)) !=
        (ssize_t)sizeof f->journal) {
        DL_WARN("node: push journal not written (%s): a restart will not carry unpushed progress",
                strerror(errno));
        n->jfd = -1;
    }
}

/* A saved state, host byte order (it is read back on the machine that
 * wrote it): head, P fragment records, the bases in fragment order, the
 * error feedback residuals of the fragments whose record says so (format 2;
 * format 1 has none), and the XXH64 of all that. */
#define STATE_MAGIC 0x534e4c44u /* "DLNS" */
#define STATE_FORMAT 2u
#define JOURNAL_MAGIC 0x4a4e4c44u /* "DLNJ" */

typedef struct {
    uint32_t magic, format;
    uint64_t fingerprint, tag, step, total_numel;
    uint32_t P, adopt;
} state_head;

typedef struct {
    uint32_t carry;      /* theta_p - base_p is unpushed progress (0: a push since the adopt, not keep) */
    uint32_t pushed;     /* a push on this version left since its adopt (it may have merged) */
    uint32_t queued;     /* a push posted and still queued (not left): carried with it, unless claimed after */
    uint32_t residual;   /* format 2: p's error feedback residual follows the bases (format 1: always 0) */
    uint64_t claims;     /* pushes of p claimed so far (the journal's claim counter) */
    uint64_t version, steps, tokens, journal;
    double loss, compute_s;
} state_frag;

void dl_node_set_ef(dl_node *n, int p, struct dl_ef *ef)
{
    assert(n && p >= 0 && p < n->P);
    n->f[p].ef = ef;
}

/* The fixed part: everything but the residuals and the checksum. */
static size_t state_fixed(const dl_node *n)
{
    return sizeof(state_head) + (size_t)n->P * sizeof(state_frag) + dl_plan_total_numel(n->plan) * sizeof(float);
}

size_t dl_node_state_bytes(const dl_node *n)
{
    size_t r = 0;
    for (int p = 0; p < n->P; p++) r += n->f[p].ef ? n->f[p].numel * sizeof(float) : 0;
    return state_fixed(n) + r + sizeof(uint64_t);
}

size_t dl_node_state_max_bytes(const dl_node *n)
{
    return state_fixed(n) + dl_plan_total_numel(n->plan) * sizeof(float) + sizeof(uint64_t);
}

int dl_node_state_copy(const dl_node *n, uint64_t fingerprint, uint64_t tag, uint64_t step, void *buf, size_t *len)
{
    uint8_t *b = buf;
    state_head h = {.magic = STATE_MAGIC, .format = STATE_FORMAT, .fingerprint = fingerprint, .tag = tag,
                    .step = step, .total_numel = dl_plan_total_numel(n->plan), .P = (uint32_t)n->P,
                    .adopt = (uint32_t)n->adopt};
    memcpy(b, &h, sizeof h);
    state_frag *sf = (state_frag *)(b + sizeof h);
    float *bases = (float *)(b + sizeof h + (size_t)n->P * sizeof(state_frag));
    uint8_t *res = b + state_fixed(n);
    for (int p = 0; p < n->P; p++) {
        const nfrag *f = &n->f[p];
        /* a push still queued never left: its progress is the learner's, carried with the rest unless the
         * journal's claim counter says it left after the save */
        int queued = f->flight == FLIGHT_POSTED && dl_mailbox_queued(n->mb, p);
        state_frag r = {.version = f->version, .journal = f->journal, .queued = (uint32_t)queued,
                        .claims = dl_mailbox_claims_total(n->mb, p),
                        .pushed = !queued && (f->tokens_posted > 0 || f->flight == FLIGHT_POSTED)};
        /* keep: the progress since the push (ref_p) is unpushed, the push
         * itself the synchronizer's; an absorbed push is ref_p - base_p, out of theta */
        const float *from = f->base;
        if (f->held && queued) {
            r.carry = 1;
            r.steps = f->steps;
            r.tokens = f->tokens;
            r.loss = f->loss;
            r.compute_s = f->compute_s;
        } else if (f->held && n->adopt == DL_ADOPT_KEEP) {
            if (f->flight != FLIGHT_ABSORBED) from = f->ref;
            r.carry = 1;
            r.steps = f->steps - f->steps_ref;
            r.tokens = f->tokens - f->tokens_ref;
            r.loss = f->loss - f->loss_ref;
            r.compute_s = f->compute_s - f->compute_ref;
        } else if (f->held && f->tokens_posted == 0) {
            r.carry = 1;
            r.steps = f->steps;
            r.tokens = f->tokens;
            r.loss = f->loss;
            r.compute_s = f->compute_s;
        }
        if (!f->held) r.carry = 0, r.version = UINT64_MAX;
        /* the residual the session would start from now (learner/ef.h): what the accepted pushes owe */
        if (f->held && f->ef && dl_ef_snapshot(f->ef, p, (float *)res)) {
            r.residual = 1;
            res += f->numel * sizeof(float);
        }
        memcpy(&sf[p], &r, sizeof r);
        memcpy(bases, from, f->numel * sizeof(float));
        bases += f->numel;
    }
    size_t body = (size_t)(res - b);
    uint64_t sum = dl_hash64(b, body, 0);
    memcpy(b + body, &sum, sizeof sum);
    *len = body + sizeof sum;
    return 0;
}

int dl_node_state_restore(dl_node *n, const void *buf, size_t len, uint64_t fingerprint, uint64_t tag, uint64_t step,
                          const uint64_t *journal, int journal_n, dl_node_restored *out)
{
    const uint8_t *b = buf;
    memset(out, 0, sizeof *out);
    size_t fixed = state_fixed(n);
    state_head h;
    if (len < sizeof h) return dl_err(DL_ETRUNC, "learner state: %zu bytes, shorter than its head", len);
    memcpy(&h, b, sizeof h);
    if (h.magic != STATE_MAGIC) return dl_err(DL_EFORMAT, "learner state: not a dloco learner state (bad magic)");
    if (h.format < 1 || h.format > STATE_FORMAT)
        return dl_err(DL_EFORMAT, "learner state: format %u, this learner reads 1 to %u (written by a newer dloco? "
                                  "start this learner without it)", h.format, STATE_FORMAT);
    if (h.fingerprint != fingerprint || h.P != (uint32_t)n->P || h.total_numel != dl_plan_total_numel(n->plan))
        return dl_err(DL_EMISMATCH, "learner state: of another model (fingerprint %016llx, P=%u) than this one "
                                    "(%016llx, P=%d)", (unsigned long long)h.fingerprint, h.P,
                      (unsigned long long)fingerprint, n->P);
    if (len < fixed + sizeof(uint64_t))
        return dl_err(DL_ETRUNC, "learner state: %zu bytes, this model's has at least %zu", len,
                      fixed + sizeof(uint64_t));
    /* the residuals' length follows from the records: read them before the checksum, bounded by the file */
    const state_frag *sf0 = (const state_frag *)(b + sizeof h);
    size_t want = fixed + sizeof(uint64_t);
    for (int p = 0; p < n->P; p++) {
        state_frag r;
        memcpy(&r, &sf0[p], sizeof r);
        if (r.residual > 1 || (h.format < 2 && r.residual))
            return dl_err(DL_ERANGE, "learner state: fragment %d: residual flag %u", p, r.residual);
        if (r.residual) want += n->f[p].numel * sizeof(float);
    }
    if (len != want) return dl_err(DL_ETRUNC, "learner state: %zu bytes, its records say %zu", len, want);
    uint64_t sum;
    memcpy(&sum, b + want - sizeof sum, sizeof sum);
    if (dl_hash64(b, want - sizeof sum, 0) != sum) return dl_err(DL_ECORRUPT, "learner state: checksum mismatch");
    if (h.tag != tag) return dl_err(DL_EMISMATCH, "learner state: of another run or learner id");
    if (h.step != step)
        return dl_err(DL_EMISMATCH, "learner state: saved at step %llu, but the learner resumes at step %llu (its "
                                    "parameters were saved at another step)",
                      (unsigned long long)h.step, (unsigned long long)step);
    const float *bases = (const float *)(b + sizeof h + (size_t)n->P * sizeof(state_frag));
    for (int p = 0; p < n->P; p++) {
        state_frag r;
        memcpy(&r, &sf0[p], sizeof r);
        if (r.version == UINT64_MAX) return dl_err(DL_ERANGE, "learner state: fragment %d was never held", p);
        if (r.carry > 1 || r.pushed > 1 || r.queued > 1 || r.steps > step || r.tokens < r.steps || (r.steps == 0 && r.tokens) ||
            !isfinite(r.loss) || !(r.compute_s >= 0 && isfinite(r.compute_s)))
            return dl_err(DL_ERANGE, "learner state: fragment %d: counters no learner at step %llu can hold", p,
                          (unsigned long long)step);
    }
    /* bases and residuals are contiguous floats up to the checksum */
    size_t nf = (want - sizeof(uint64_t) - sizeof h - (size_t)n->P * sizeof(state_frag)) / sizeof(float);
    for (size_t i = 0; i < nf; i++) {
        float v;
        memcpy(&v, (const uint8_t *)bases + i * sizeof v, sizeof v);
        if (!isfinite(v)) return dl_err(DL_ERANGE, "learner state: a base or residual value is not finite");
    }
    out->format = (int)h.format;
    const uint8_t *res = b + fixed;
    for (int p = 0; p < n->P; p++) {
        nfrag *f = &n->f[p];
        state_frag r;
        memcpy(&r, &sf0[p], sizeof r);
        /* journal: [P] node counters, then [P] claim counters */
        int same = journal && p < journal_n && journal[p] == r.journal;
        int nc = n->P + p;
        if (r.queued) same &= journal && nc < journal_n && journal[nc] == r.claims;
        f->journal = journal && p < journal_n && journal[p] > r.journal ? journal[p] : r.journal;
        f->claims0 = journal && nc < journal_n && journal[nc] > r.claims ? journal[nc] : r.claims;
        if (r.carry && same) {
            memcpy(f->base, bases, f->numel * sizeof(float));
            f->steps = r.steps;
            f->tokens = r.tokens;
            f->loss = r.loss;
            f->compute_s = r.compute_s;
            out->carried += r.tokens;
            dl_mailbox_set_carried(n->mb, p, r.tokens);
        } else {
            /* pushed or thrown away since the save (or not separable): its
             * progress is the synchronizer's account; measure from theta now */
            const float *theta;
            DL_TRY(dl_node_read_now(n, p, &theta));
            memcpy(f->base, theta, f->numel * sizeof(float));
            f->steps = f->tokens = 0;
            f->loss = f->compute_s = 0.0;
        }
        /* the residual as saved while nothing moved it since (the journal agrees); a push after the save
         * carried it on (what that push's residual was, the file does not know): it starts at zero then */
        if (r.residual) {
            int kept = 0;
            if (same && f->ef) {
                int rc = dl_ef_restore(f->ef, p, (const float *)res);
                if (rc < 0) return rc;
                kept = rc;
            }
            if (kept) out->residuals++;
            else out->residuals_dropped++;
            res += f->numel * sizeof(float);
        }
        bases += f->numel;
        if (f->ref) memcpy(f->ref, f->base, f->numel * sizeof(float));
        f->steps_ref = f->tokens_ref = f->tokens_posted = 0;
        f->loss_ref = f->compute_ref = 0.0;
        f->flight = FLIGHT_NONE;
        f->owed = f->owed_final = f->pending = 0;
        f->version = r.version;
        f->held = 1;
        dl_mailbox_set_held(n->mb, p, r.version);
    }
    return 0;
}

int dl_node_set_journal(dl_node *n, int fd, uint64_t tag)
{
    n->jfd = -1;
    if (fd < 0) return 0;
    size_t len = DL_NODE_JOURNAL_HEAD + 8 * (size_t)n->P;
    uint8_t *b = dl_try_calloc(1, len);
    if (!b) return dl_err(DL_ENOMEM, "push journal: out of memory");
    uint32_t head[2] = {JOURNAL_MAGIC, (uint32_t)n->P};
    memcpy(b, head, sizeof head);
    memcpy(b + 8, &tag, sizeof tag);
    for (int p = 0; p < n->P; p++) memcpy(b + DL_NODE_JOURNAL_HEAD + 8 * (size_t)p, &n->f[p].journal, 8);
    ssize_t w = pwrite(fd, b, len, 0);
    free(b);
    if (w != (ssize_t)len) return dl_err(DL_EIO, "push journal: cannot write: %s", strerror(errno));
    n->jfd = fd;
    uint64_t *base = dl_try_calloc((size_t)n->P, sizeof *base);
    if (!base) return dl_err(DL_ENOMEM, "push journal: out of memory");
    for (int p = 0; p < n->P; p++) base[p] = n->f[p].claims0;
    dl_mailbox_set_claims_journal(n->mb, fd, (int64_t)len, base);
    free(base);
    return 0;
}

int dl_node_journal_read(const char *path, uint64_t tag, uint64_t *out, int P)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    uint8_t head[DL_NODE_JOURNAL_HEAD];
    int k = 0;
    uint32_t magic, p32;
    uint64_t t;
    if (pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head) {
        memcpy(&magic, head, 4);
        memcpy(&p32, head + 4, 4);
        memcpy(&t, head + 8, 8);
        if (magic == JOURNAL_MAGIC && p32 == (uint32_t)P && t == tag)
            while (k < 2 * P && pread(fd, &out[k], 8, (off_t)(DL_NODE_JOURNAL_HEAD + 8 * (size_t)k)) == 8) k++;
    }
    close(fd);
    return k;
}
