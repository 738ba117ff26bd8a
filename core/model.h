/* The model's description, shared by every program without its training
 * code: the GPT-2 config and its bounds, option rows, tensor table, seeded
 * init into a bare buffer, fragment plan, fingerprint and FLOP count. */
#ifndef DL_CORE_MODEL_H
#define DL_CORE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/tensor.h"

typedef struct {
    int n_layer;      /* L */
    int n_head;       /* NH; n_embd % n_head == 0 */
    int n_embd;       /* C */
    int seq_len;      /* T, maximum context (wpe rows) */
    int vocab;        /* V, real vocabulary */
    int padded_vocab; /* Vp >= V: wte rows, V rounded up to 64 (set by dl_model_config_check) */
} dl_model_config;

/* The one set of bounds: the option rows below and dl_model_config_check
 * both use them, so every program refuses the same values the same way. */
#define DL_MODEL_LAYER_MIN 1
#define DL_MODEL_LAYER_MAX 256
#define DL_MODEL_HEAD_MIN 1
#define DL_MODEL_HEAD_MAX 256
#define DL_MODEL_EMBD_MIN 8
#define DL_MODEL_EMBD_MAX 16384
#define DL_MODEL_SEQ_MIN 2
#define DL_MODEL_SEQ_MAX 65536
#define DL_MODEL_VOCAB_MIN 2
#define DL_MODEL_VOCAB_MAX 16777216 /* 2^24 */
#define DL_MODEL_FRAGMENTS_MIN 1
#define DL_MODEL_FRAGMENTS_MAX 4096

/* Validate a config against the bounds above (and n_embd % n_head == 0) and
 * fill padded_vocab. DL_EINVAL with a message otherwise. */
int dl_model_config_check(dl_model_config *cfg);

/* Tensor table of a config, without allocating a model: fills up to `cap`
 * entries, returns the count (2 + 12*L + 2). Total floats in *numel. */
int dl_model_tensor_table(const dl_model_config *cfg, dl_tensor *out, int cap, size_t *numel);

/* Views of block l's tensors in `base`, a buffer of the tensor table's layout (the parameters, the
 * gradients): how the CPU and the CUDA model both find a block's weights. */
typedef struct {
    float *ln1w, *ln1b;   /* ln_1 weight, bias [C] */
    float *qkvw, *qkvb;   /* attn.c_attn [3C, C], [3C] */
    float *projw, *projb; /* attn.c_proj [C, C], [C] */
    float *ln2w, *ln2b;   /* ln_2 weight, bias [C] */
    float *fcw, *fcb;     /* mlp.c_fc [4C, C], [4C] */
    float *fcpw, *fcpb;   /* mlp.c_proj [C, 4C], [C] */
} dl_model_block;
dl_model_block dl_model_block_of(const dl_tensor *tensors, float *base, int l);

/* What every GPT-2 model object (the CPU model, the CUDA model) starts from:
 * *cfg = the checked copy of `in` (padded vocabulary filled), a batch bound
 * B in [1, 65536], and the tensor table allocated (*tensors, free() it) with
 * its count and total floats. 0, or DL_EINVAL naming the bad value (nothing
 * allocated). */
int dl_model_shape(const dl_model_config *in, int B, dl_model_config *cfg, dl_tensor **tensors, int *ntensors,
                   size_t *nparams);

/* GPT-2 init from a seed into a bare buffer of dl_model_tensor_table's numel
 * floats: weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
 * biases 0, layernorm weights 1, padded wte rows 0. The learner's model and
 * the synchronizer's initial state both come from here. */
int dl_model_init_params(const dl_model_config *cfg, uint64_t seed, float *params);

/* The fragment plan of a model with P fragments (core/plan.h) and the run's
 * model fingerprint: dl_plan_fingerprint over (L, NH, C, T, V, Vp) as
 * little-endian int32 and the plan. Learner and synchronizer both compute it;
 * Hello carries it. */
struct dl_plan;
int dl_model_plan_open(const dl_model_config *cfg, int P, struct dl_plan **out);
uint64_t dl_model_fingerprint(const dl_model_config *cfg, const struct dl_plan *plan);

/* FLOPs of one training step (forward + backward) per token at context T:
 * 6*N_matmul + attention, for MFU figures. */
double dl_model_flops_per_token(const dl_model_config *cfg, int T);

/* ---- the model's options, as every program's config table holds them */

/* The parsed option values (int64 as the config table stores them); a
 * program embeds one of these in its config struct. */
typedef struct {
    int64_t n_layer, n_head, n_embd, seq_len, vocab;
    int64_t fragments; /* P: not part of dl_model_config, but of the fingerprint */
} dl_model_opts;

/* The dl_cfg_entry rows of the model options, for a program whose config
 * struct `type` embeds a dl_model_opts named `member`. Only the vocabulary's
 * default and help may differ per program (dloco-learner's 0 means "from the
 * data", which the synchronizer has not got), so the vocab row alone admits 0:
 * dl_model_config_from refuses it. */
#define DL_MODEL_CFG_ROWS(type, member, vocab_def, vocab_help)                                                  \
    {"n_layer", DL_CFG_INT, offsetof(type, member.n_layer), DL_MODEL_LAYER_MIN, DL_MODEL_LAYER_MAX, "4", NULL, 0, \
     "model: transformer blocks (L)"},                                                                           \
    {"n_head", DL_CFG_INT, offsetof(type, member.n_head), DL_MODEL_HEAD_MIN, DL_MODEL_HEAD_MAX, "4", NULL, 0,     \
     "model: attention heads (NH)"},                                                                             \
    {"n_embd", DL_CFG_INT, offsetof(type, member.n_embd), DL_MODEL_EMBD_MIN, DL_MODEL_EMBD_MAX, "128", NULL, 0,   \
     "model: channels (C)"},                                                                                     \
    {"seq_len", DL_CFG_INT, offsetof(type, member.seq_len), DL_MODEL_SEQ_MIN, DL_MODEL_SEQ_MAX, "128", NULL, 0,   \
     "model: context length (T)"},                                                                               \
    {"vocab", DL_CFG_INT, offsetof(type, member.vocab), 0, DL_MODEL_VOCAB_MAX, vocab_def, NULL, 0, vocab_help},   \
    {"fragments", DL_CFG_INT, offsetof(type, member.fragments), DL_MODEL_FRAGMENTS_MIN, DL_MODEL_FRAGMENTS_MAX,   \
     "4", NULL, 0, "P: parameter fragments (learners and synchronizer must agree: part of the fingerprint)"}

/* The checked config of parsed options (fragments is o->fragments as is,
 * bounds-checked here too). DL_ERANGE for a value out of the bounds above
 * (vocab 0 included: resolve it first), DL_EINVAL from dl_model_config_check;
 * dl_errmsg() names the option. */
int dl_model_config_from(const dl_model_opts *o, dl_model_config *out);

#endif
