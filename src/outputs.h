// outputs.h — every file a run reads or writes, named by its flag, and the one check every
// output goes through before step 1 (before any data is read or anything is trained or
// written; only --init-from's file is read first, for the model's flags).
//
// A run writes its checkpoint (--checkpoint PATH, and PATH.best, the best so far), an export
// (--export OUT), the diagnostics directory and its CSVs (--diagnostics DIR) and a pipeline's
// trace (--pipeline-trace FILE). It reads --text, --init-from, and --checkpoint when it
// resumes, samples or exports. outputs_check refuses, in one line naming the flag and the
// path, an output that (links resolved)
//   - is one of the run's inputs, or another of its outputs, however spelled;
//   - exists and is not a regular file (a directory where a file goes, a device, a pipe, a
//     socket), or, for the directory, exists and is not a directory;
//   - exists and is not a file of its own kind: a checkpoint replaces only a checkpoint, an
//     export only an earlier export, a trace only an earlier trace (an empty file is new to
//     a checkpoint and a trace), and no output replaces a checkpoint but the run's own
//     --checkpoint;
//   - lies in a folder the run cannot write (a missing folder, a read-only one; for the
//     --diagnostics directory, which the run makes, its nearest existing folder).
// Only once every output passes does it remove what saves killed midway left
// (PATH.tmp.<pid> of a process that no longer exists). A writer added later adds its entry to
// run_paths and nothing else.
#ifndef ATTNRES_OUTPUTS_H
#define ATTNRES_OUTPUTS_H

#include <stddef.h>
#include "options.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    PATH_INPUT,       // read by the run: never replaced
    PATH_CHECKPOINT,  // --checkpoint PATH and PATH.best
    PATH_EXPORT,      // --export OUT
    PATH_TRACE,       // --pipeline-trace FILE
    PATH_CSV,         // a --diagnostics CSV, inside the directory
    PATH_DIRECTORY,   // --diagnostics DIR
} PathKind;

#define RUN_PATHS_MAX 16
#define RUN_PATH_MAX 4200

typedef struct {
    PathKind kind;
    const char* flag;        // "--checkpoint", ...
    const char* given;       // the flag's value as given
    char path[RUN_PATH_MAX]; // the file itself (given, or given + ".best", DIR/train.csv)
    char what[2 * RUN_PATH_MAX];  // it, in a message: "the --text file PATH"
    int too_long;            // path did not fit: refused
} RunPath;

// The files and folders of the run that o describes, inputs first; returns their number
int run_paths(const Options* o, RunPath* paths);
// The check above over paths[0 .. n). 0, or -1 with one line in err.
int outputs_check(const RunPath* paths, int n, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
