// outputs.c — every file a run reads or writes, and the one check of its outputs (outputs.h).
#define _XOPEN_SOURCE 700  // stat, realpath
#include <errno.h>
#include <limits.h>  // PATH_MAX
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>  // access
#include "checkpoint.h"   // checkpoint_has_magic, checkpoint_temp_path, the stale temporaries
#include "diagnostics.h"  // the CSVs' names
#include "outputs.h"
#include "pipeline.h"     // the trace's header
#include "safetensors.h"  // safetensors_load: an earlier export
#include "util.h"        // ERROR_MAX

#define FAIL(...) do { snprintf(err, err_len, __VA_ARGS__); return -1; } while (0)

// ---- the table --------------------------------------------------------------------------
static RunPath* add_path(RunPath* paths, int* n, PathKind kind, const char* flag,
                         const char* given, const char* suffix) {
    RunPath* entry = &paths[(*n)++];
    entry->kind = kind;
    entry->flag = flag;
    entry->given = given;
    int len = snprintf(entry->path, sizeof(entry->path), "%s%s", given, suffix);
    entry->too_long = len < 0 || (size_t)len >= sizeof(entry->path);
    snprintf(entry->what, sizeof(entry->what), "the %s file %s", flag, entry->path);
    return entry;
}

int run_paths(const Options* o, RunPath* paths) {
    int n = 0;
    int exporting = o->export_path != NULL, trains = !exporting && !o->sample;
    // what the run reads
    if (o->text_path != NULL) { add_path(paths, &n, PATH_INPUT, "--text", o->text_path, ""); }
    if (o->init_from != NULL && trains) {
        add_path(paths, &n, PATH_INPUT, "--init-from", o->init_from, "");
    }
    if (o->checkpoint != NULL && (o->resume || !trains)) {
        RunPath* entry = add_path(paths, &n, PATH_INPUT, "--checkpoint", o->checkpoint, "");
        snprintf(entry->what, sizeof(entry->what), "the checkpoint it reads (--checkpoint %s)",
                 o->checkpoint);
    }
    if (o->checkpoint != NULL && exporting) {  // the best checkpoint, which it may read next
        RunPath* entry = add_path(paths, &n, PATH_INPUT, "--checkpoint", o->checkpoint, ".best");
        snprintf(entry->what, sizeof(entry->what), "the best checkpoint %s of --checkpoint %s",
                 entry->path, o->checkpoint);
    }
    // what it writes
    if (exporting) { add_path(paths, &n, PATH_EXPORT, "--export", o->export_path, ""); }
    if (!trains) { return n; }
    if (o->checkpoint != NULL) {
        add_path(paths, &n, PATH_CHECKPOINT, "--checkpoint", o->checkpoint, "");
        RunPath* best = add_path(paths, &n, PATH_CHECKPOINT, "--checkpoint", o->checkpoint, ".best");
        snprintf(best->what, sizeof(best->what), "the best checkpoint %s of --checkpoint %s",
                 best->path, o->checkpoint);
    }
    if (o->diagnostics != NULL) {
        RunPath* dir = add_path(paths, &n, PATH_DIRECTORY, "--diagnostics", o->diagnostics, "");
        snprintf(dir->what, sizeof(dir->what), "the --diagnostics directory %s", dir->path);
        const char* names[] = DIAGNOSTICS_FILES;
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            char suffix[64];
            snprintf(suffix, sizeof(suffix), "/%s", names[i]);
            add_path(paths, &n, PATH_CSV, "--diagnostics", o->diagnostics, suffix);
        }
    }
    if (o->pipeline_trace != NULL) {
        add_path(paths, &n, PATH_TRACE, "--pipeline-trace", o->pipeline_trace, "");
    }
    return n;
}

// ---- the check ----------------------------------------------------------------------------
// path made absolute from its folder's real path (symbolic links, "." and ".." resolved) and
// its last name, for a path that need not exist yet; the path as given when its folder does
// not exist either
static void folder_real_path(const char* path, char* out, size_t len) {
    char copy[PATH_MAX];
    snprintf(copy, sizeof(copy), "%s", path);
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') { copy[--n] = '\0'; }  // "dir/" names dir
    char* slash = strrchr(copy, '/');
    const char* name = slash ? slash + 1 : copy;
    const char* folder = slash == NULL ? "." : slash == copy ? "/" : copy;
    if (slash != NULL) { *slash = '\0'; }
    char real[PATH_MAX];
    if (realpath(folder, real) != NULL) {
        snprintf(out, len, "%s/%s", real, name);
    } else {
        snprintf(out, len, "%s", path);
    }
}

// Whether a and b name the same file, however spelled: the same device and inode when both
// exist; when neither does, the same name in the same real folder
static int same_file(const char* a, const char* b) {
    struct stat sa, sb;
    int a_exists = stat(a, &sa) == 0, b_exists = stat(b, &sb) == 0;
    if (a_exists || b_exists) {
        return a_exists && b_exists && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    }
    char ra[2 * PATH_MAX], rb[2 * PATH_MAX];
    folder_real_path(a, ra, sizeof(ra));
    folder_real_path(b, rb, sizeof(rb));
    return strcmp(ra, rb) == 0;
}

// "--flag PATH" or, for a file the flag names indirectly, "--flag GIVEN: PATH"
static void name_output(const RunPath* entry, char* out, size_t len) {
    if (strcmp(entry->path, entry->given) == 0) {
        snprintf(out, len, "%s %s", entry->flag, entry->path);
    } else {
        snprintf(out, len, "%s %s: %s", entry->flag, entry->given, entry->path);
    }
}

// 1 when the file's first line is `header`
static int starts_with_line(const char* path, const char* header) {
    FILE* f = fopen(path, "r");
    if (f == NULL) { return 0; }
    char line[256];
    int same = fgets(line, sizeof(line), f) != NULL && strcspn(line, "\n") == strlen(header) &&
               strncmp(line, header, strlen(header)) == 0;
    fclose(f);
    return same;
}

// An existing file at entry->path: of the kind entry replaces? (its stat in info)
static int check_existing(const RunPath* entry, const struct stat* info, const char* name,
                          char* err, size_t err_len) {
    if (entry->kind == PATH_DIRECTORY) {
        if (!S_ISDIR(info->st_mode)) { FAIL("%s is not a directory", name); }
        return 0;
    }
    if (S_ISDIR(info->st_mode)) { FAIL("%s is a directory, not a regular file", name); }
    if (!S_ISREG(info->st_mode)) {
        FAIL("%s is not a regular file (a device, a pipe or a socket): the run writes only "
             "regular files, and would replace it or hang on it", name);
    }
    int checkpoint = checkpoint_has_magic(entry->path);
    if (entry->kind == PATH_CHECKPOINT) {
        if (info->st_size > 0 && !checkpoint) {
            FAIL("%s exists and is not a checkpoint, the only file a checkpoint replaces", name);
        }
        return 0;
    }
    if (checkpoint) {
        FAIL("%s is a checkpoint, which the run would replace (%s)", name,
             entry->kind == PATH_EXPORT ? "an existing file is replaced only if it is an earlier export"
             : entry->kind == PATH_TRACE ? "an existing file is replaced only if it is an earlier trace"
             : "only --checkpoint replaces a checkpoint");
    }
    if (entry->kind == PATH_EXPORT) {  // an earlier export is any file --init-from reads
        ModelConfig config;
        float* params = NULL;
        char reason[ERROR_MAX];
        int earlier_export = safetensors_load(entry->path, &config, &params, reason, sizeof(reason)) == 0;
        free(params);
        if (!earlier_export) {
            FAIL("%s exists and is not an earlier export (a safetensors file of attnres.c), the "
                 "only file an export replaces", name);
        }
    }
    if (entry->kind == PATH_TRACE && info->st_size > 0 &&
        !starts_with_line(entry->path, PIPELINE_TRACE_HEADER)) {
        FAIL("%s exists and is not an earlier trace (its first line is not \"%s\"), the only "
             "file a trace replaces", name, PIPELINE_TRACE_HEADER);
    }
    return 0;
}

// The folder a path goes in can take a new file: PATH.tmp.<pid> is written and removed. A
// directory not made yet: its nearest existing folder must be a directory the run can write.
static int check_writable(const RunPath* entry, const char* name, char* err, size_t err_len) {
    struct stat info;
    if (entry->kind == PATH_CSV) { return 0; }  // the directory's check covers its files
    if (entry->kind == PATH_DIRECTORY) {
        char folder[RUN_PATH_MAX];
        snprintf(folder, sizeof(folder), "%s", entry->path);
        while (stat(folder, &info) != 0) {  // climb to the nearest folder that exists
            char* slash = strrchr(folder, '/');
            if (slash == NULL) { snprintf(folder, sizeof(folder), "."); break; }
            if (slash == folder) { folder[1] = '\0'; break; }
            *slash = '\0';
        }
        if (stat(folder, &info) != 0 || !S_ISDIR(info.st_mode) || access(folder, W_OK | X_OK) != 0) {
            FAIL("%s: cannot create or write the directory in %s", name, folder);
        }
        return 0;
    }
    char tmp[RUN_PATH_MAX + 32];
    if (checkpoint_temp_path(tmp, sizeof(tmp), entry->path) != 0) { FAIL("%s: the path is too long", name); }
    FILE* f = fopen(tmp, "wb");
    if (f == NULL) { FAIL("%s: cannot write %s: %s", name, tmp, strerror(errno)); }
    fclose(f);
    remove(tmp);
    return 0;
}

int outputs_check(const RunPath* paths, int n, char* err, size_t err_len) {
    for (int i = 0; i < n; i++) {
        const RunPath* entry = &paths[i];
        if (entry->kind == PATH_INPUT) { continue; }
        if (entry->too_long) { FAIL("%s %.200s...: the path is too long", entry->flag, entry->given); }
        char name[2 * RUN_PATH_MAX + 32];
        name_output(entry, name, sizeof(name));
        for (int j = 0; j < n; j++) {
            const RunPath* q = &paths[j];
            // a resumed checkpoint is the run's own: read, then replaced
            int own = q->kind == PATH_INPUT && strcmp(q->flag, entry->flag) == 0 &&
                      strcmp(q->path, entry->path) == 0 && entry->kind == PATH_CHECKPOINT;
            if (j == i || own || (q->kind != PATH_INPUT && j < i) || !same_file(entry->path, q->path)) {
                continue;
            }
            FAIL("%s is %s, which the run %s", name, q->what,
                 q->kind == PATH_INPUT ? "reads: it would be replaced" : "also writes");
        }
        struct stat info;
        if (stat(entry->path, &info) == 0 && check_existing(entry, &info, name, err, err_len) != 0) {
            return -1;
        }
        if (check_writable(entry, name, err, err_len) != 0) { return -1; }
    }
    for (int i = 0; i < n; i++) {  // every output passed: what killed saves left goes
        if (paths[i].kind != PATH_INPUT && paths[i].kind != PATH_DIRECTORY) {
            checkpoint_remove_stale_temps(paths[i].path);
        }
    }
    return 0;
}
