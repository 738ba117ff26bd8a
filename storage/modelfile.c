/* Model files (storage/modelfile.h): format names, the writer of every
 * format (written to a temporary, renamed into place atomically), and the
 * reader, which maps the file and hands it to its format's reader.
 * storage/modelfile_int.h lists the files. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* renameat2 */
#endif
#include "storage/modelfile_int.h"

#include "core/err.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int dl_modelfile_format_parse(const char *s, int *out)
{
    if (!strcmp(s, "safetensors")) *out = DL_MODELFILE_SAFETENSORS;
    else if (!strcmp(s, "hf")) *out = DL_MODELFILE_HF;
    else if (!strcmp(s, "llmc")) *out = DL_MODELFILE_LLMC;
    else return dl_err(DL_EINVAL, "format '%s' is not one of safetensors|llmc|hf", s);
    return 0;
}

const char *dl_modelfile_format_name(int f)
{
    return f == DL_MODELFILE_SAFETENSORS ? "safetensors" : f == DL_MODELFILE_HF ? "hf" : f == DL_MODELFILE_LLMC ? "llmc" : "?";
}

/* ---------------------------------------------------------------- writing */

int dl_modelfile_w_flush(writer *w)
{
    const char *p = w->buf;
    size_t left = w->used;
    while (left) {
        ssize_t k = write(w->fd, p, left);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return dl_err(DL_EIO, "write %s: %s", w->path, k < 0 ? strerror(errno) : "short write");
        p += k;
        left -= (size_t)k;
    }
    w->done += w->used;
    w->used = 0;
    if (w->progress && w->total > (64u << 20) && w->done >= w->next_report) {
        fprintf(w->progress, "export: %s %.0f%% (%.1f of %.1f MB)\n", w->label ? w->label : w->path, 100.0 * (double)w->done / (double)w->total,
                w->done / 1e6, w->total / 1e6);
        fflush(w->progress);
        w->next_report += w->total / 10;
    }
    return 0;
}

int dl_modelfile_w_bytes(writer *w, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        size_t k = sizeof w->buf - w->used;
        if (k > n) k = n;
        memcpy(w->buf + w->used, p, k);
        w->used += k;
        p += k;
        n -= k;
        if (w->used == sizeof w->buf) DL_TRY(dl_modelfile_w_flush(w));
    }
    return 0;
}

int dl_modelfile_w_piece(writer *w, const piece *pc)
{
    if (!pc->src) {
        static const float zeros[1024];
        for (size_t left = pc->n; left;) {
            size_t k = left < 1024 ? left : 1024;
            DL_TRY(dl_modelfile_w_bytes(w, zeros, k * sizeof(float)));
            left -= k;
        }
        return 0;
    }
    if (!pc->transpose) return dl_modelfile_w_bytes(w, pc->src, pc->n * sizeof(float));
    /* src is [rows, cols]; the output is [cols, rows] */
    float row[1024];
    for (size_t c = 0; c < pc->cols; c++)
        for (size_t r0 = 0; r0 < pc->rows; r0 += 1024) {
            size_t k = pc->rows - r0 < 1024 ? pc->rows - r0 : 1024;
            for (size_t i = 0; i < k; i++) row[i] = pc->src[(r0 + i) * pc->cols + c];
            DL_TRY(dl_modelfile_w_bytes(w, row, k * sizeof(float)));
        }
    return 0;
}

/* Create path exclusively, for writing. */
int dl_modelfile_create(const char *path, int *fd)
{
    *fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (*fd < 0) return dl_err(DL_EIO, "cannot create %s: %s", path, strerror(errno));
    return 0;
}

int dl_modelfile_finish(int fd, const char *path)
{
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return dl_err(DL_EIO, "fsync %s: %s", path, strerror(e));
    }
    if (close(fd) != 0) return dl_err(DL_EIO, "close %s: %s", path, strerror(errno));
    return 0;
}

void dl_modelfile_fsync_dir(const char *path)
{
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s", path);
    int fd = open(dirname(tmp), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int dl_modelfile_mismatch(const char *path, const dl_model_config *f, const dl_model_config *c)
{
    char nh[16];
    if (f->n_head > 0) snprintf(nh, sizeof nh, "%d", f->n_head);
    else snprintf(nh, sizeof nh, "?");
    return dl_err(DL_EMISMATCH, "%s: checkpoint is L=%d NH=%s C=%d V=%d T=%d, this run is L=%d NH=%d C=%d V=%d T=%d",
                  path, f->n_layer, nh, f->n_embd, f->vocab, f->seq_len, c->n_layer, c->n_head, c->n_embd, c->vocab,
                  c->seq_len);
}

int dl_modelfile_same_model(const dl_model_config *f, const dl_model_config *c)
{
    return f->n_layer == c->n_layer && f->n_head == c->n_head && f->n_embd == c->n_embd && f->vocab == c->vocab &&
           f->seq_len == c->seq_len;
}

int dl_modelfile_write(const char *path, int format, const dl_model_config *cfg_in, const float *params,
                       const dl_modelfile_meta *meta, int force, FILE *progress)
{
    dl_model_config cfg = *cfg_in;
    DL_TRY(dl_model_config_check(&cfg));
    if (format != DL_MODELFILE_SAFETENSORS && format != DL_MODELFILE_HF && format != DL_MODELFILE_LLMC)
        return dl_err(DL_EINVAL, "unknown model file format %d", format);
    struct stat st;
    int exists = lstat(path, &st) == 0;
    if (exists && !force) return dl_err(DL_EINVAL, "%s exists (use --force to replace it)", path);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return dl_err(DL_EINVAL, "path too long: %s", path);
    /* a temporary of this pid is a crashed earlier writer's (pids are unique among the living) */
    struct stat ts;
    if (lstat(tmp, &ts) == 0) {
        if (S_ISDIR(ts.st_mode)) dl_modelfile_remove_hf_dir(tmp);
        else unlink(tmp);
    }
    int rc = 0;
    if (format == DL_MODELFILE_HF) {
        char f[4200];
        if (mkdir(tmp, 0755) != 0) return dl_err(DL_EIO, "cannot create directory %s: %s", tmp, strerror(errno));
        snprintf(f, sizeof f, "%s/model.safetensors", tmp);
        rc = dl_modelfile_write_st(f, &cfg, params, meta, 1, progress, path);
        snprintf(f, sizeof f, "%s/config.json", tmp);
        if (!rc) rc = dl_modelfile_write_hf_config(f, &cfg);
        if (!rc) dl_modelfile_fsync_dir(f);
        if (rc) {
            dl_modelfile_remove_hf_dir(tmp);
            return rc;
        }
    } else {
        rc = format == DL_MODELFILE_LLMC ? dl_modelfile_write_llmc(tmp, &cfg, params, progress, path)
                                         : dl_modelfile_write_st(tmp, &cfg, params, meta, 0, progress, path);
        if (rc) {
            unlink(tmp);
            return rc;
        }
    }
    /* into place: never over something that appeared meanwhile unless forced */
    int e = 0;
    if (!exists) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) != 0) e = errno;
        if ((e == EINVAL || e == ENOSYS) && lstat(path, &st) != 0) {
            /* a filesystem without RENAME_NOREPLACE: checked just before, not atomically */
            e = rename(tmp, path) == 0 ? 0 : errno;
        }
    } else if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) == 0) {
        /* the old one is at tmp now */
        if (S_ISDIR(st.st_mode)) {
            dl_modelfile_remove_hf_dir(tmp);
            if (access(tmp, F_OK) == 0 && progress)
                fprintf(progress, "export: the replaced directory held other files; it is kept as %s\n", tmp);
        } else {
            unlink(tmp);
        }
    } else {
        e = errno;
    }
    if (e) {
        if (format == DL_MODELFILE_HF) dl_modelfile_remove_hf_dir(tmp);
        else unlink(tmp);
        if (e == EEXIST) return dl_err(DL_EINVAL, "%s exists (use --force to replace it)", path);
        return dl_err(DL_EIO, "rename %s -> %s: %s", tmp, path, strerror(e));
    }
    dl_modelfile_fsync_dir(path);
    return 0;
}

/* ---------------------------------------------------------------- reading */

int dl_modelfile_read(const char *path_in, const dl_model_config *cfg_in, float *params, dl_modelfile_info *info)
{
    dl_model_config cfg = *cfg_in;
    DL_TRY(dl_model_config_check(&cfg));
    if (info) memset(info, 0, sizeof *info);
    char path[4200];
    struct stat st;
    if (stat(path_in, &st) != 0) return dl_err(DL_EIO, "cannot open %s: %s", path_in, strerror(errno));
    if (S_ISDIR(st.st_mode)) snprintf(path, sizeof path, "%s/model.safetensors", path_in);
    else snprintf(path, sizeof path, "%s", path_in);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us */
    if (fd < 0) return dl_err(DL_EIO, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dl_err(DL_EIO, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        close(fd);
        return dl_err(DL_ETRUNC, "%s: %llu bytes: not a model file", path, (unsigned long long)size);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return dl_err(DL_EIO, "mmap %s: %s", path, strerror(errno));
    const unsigned char *m = map;
    int32_t magic;
    memcpy(&magic, m, 4);
    int rc = magic == LLMC_MAGIC ? dl_modelfile_read_llmc(path, m, size, &cfg, params, info)
                                 : dl_modelfile_read_st(path, m, size, &cfg, params, info);
    munmap(map, (size_t)size);
    return rc;
}

