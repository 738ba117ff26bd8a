/* Model files, the Hugging Face GPT-2 directory: its config.json written,
 * and read back for n_head (core/json.h's cursor); the directory removed. */
#include "storage/modelfile_int.h"

#include "core/err.h"
#include "core/json.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int dl_modelfile_write_hf_config(const char *path, const dl_model_config *cfg)
{
    dl_json_w b = {0};
    int V = cfg->vocab;
    dl_json_w_raw(&b,
        "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": %d,\n"
        "  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n"
        "  \"n_inner\": null,\n  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
        "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n  \"initializer_range\": 0.02,\n"
        "  \"scale_attn_weights\": true,\n  \"scale_attn_by_inverse_layer_idx\": false,\n"
        "  \"reorder_and_upcast_attn\": false,\n  \"tie_word_embeddings\": true,\n  \"use_cache\": true,\n"
        "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"torch_dtype\": \"float32\"\n}\n",
        V, cfg->seq_len, cfg->seq_len, cfg->n_embd, cfg->n_layer, cfg->n_head, V - 1, V - 1);
    int fd, rc = dl_modelfile_create(path, &fd);
    if (!rc) {
        writer *w = dl_xmalloc(sizeof *w);
        *w = (writer){.fd = fd, .path = path};
        rc = dl_modelfile_w_bytes(w, b.buf, b.len);
        if (!rc) rc = dl_modelfile_w_flush(w);
        free(w);
        if (rc) close(fd);
        else rc = dl_modelfile_finish(fd, path);
    }
    dl_json_w_free(&b);
    return rc;
}

void dl_modelfile_remove_hf_dir(const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    rmdir(dir);
}

/* n_head from a config.json beside the model (HF). -1 when there is none
 * or it has no n_head. */
int dl_modelfile_hf_n_head(const char *model_path, int64_t *out)
{
    *out = -1;
    char tmp[4300], p[4400];
    snprintf(tmp, sizeof tmp, "%s", model_path);
    snprintf(p, sizeof p, "%s/config.json", dirname(tmp));
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us */
    if (fd < 0) return 0;
    struct stat st;
    char *buf = NULL;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size > CONFIG_JSON_MAX) {
        rc = dl_err(DL_EFORMAT, "%s: not a regular file of at most %u bytes", p, CONFIG_JSON_MAX);
        goto out;
    }
    buf = dl_xmalloc((size_t)st.st_size);
    for (size_t got = 0; got < (size_t)st.st_size;) {
        ssize_t k = read(fd, buf + got, (size_t)st.st_size - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            rc = dl_err(DL_EIO, "read %s: %s", p, k < 0 ? strerror(errno) : "shorter than its size");
            goto out;
        }
        got += (size_t)k;
    }
    dl_json_cur j = {buf, buf + st.st_size, buf, p};
    if ((rc = dl_json_expect(&j, '{'))) goto out;
    if (dl_json_peek(&j) != '}')
        for (;;) {
            char key[64];
            int trunc;
            if ((rc = dl_json_string(&j, key, sizeof key, &trunc)) || (rc = dl_json_expect(&j, ':'))) goto out;
            if (!trunc && !strcmp(key, "n_head")) {
                uint64_t v;
                if ((rc = dl_json_uint(&j, &v))) goto out;
                if (v < DL_MODEL_HEAD_MIN || v > DL_MODEL_HEAD_MAX) {
                    rc = dl_err(DL_ERANGE, "%s: n_head %llu not in [%d, %d]", p, (unsigned long long)v,
                                DL_MODEL_HEAD_MIN, DL_MODEL_HEAD_MAX);
                    goto out;
                }
                *out = (int64_t)v;
            } else if ((rc = dl_json_skip(&j, 1))) {
                goto out;
            }
            int d = dl_json_peek(&j);
            if (d < 0) {
                rc = dl_json_fail(&j, "unexpected end");
                goto out;
            }
            j.p++;
            if (d == '}') break;
            if (d != ',') {
                rc = dl_json_fail(&j, "expected ',' or '}'");
                goto out;
            }
        }
out:
    free(buf);
    close(fd);
    return rc;
}

