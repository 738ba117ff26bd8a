/* dloco export STORE [--format safetensors|llmc|hf] [--force] OUT: the
 * store's global model as a model file (storage/modelfile.h). */
#ifndef DL_TOOLS_EXPORT_H
#define DL_TOOLS_EXPORT_H

/* argv[0] is the command's name; the rest are options and OUT. Returns the
 * process exit code (0, or 2 with the reason on stderr). */
int dl_export_cmd(const char *dir, int argc, char **argv);

#endif
