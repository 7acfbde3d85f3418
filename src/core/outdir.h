/* core/outdir.h - what parity may write over, and its temporaries.
 *
 * parity never deletes or overwrites anything it did not write.  An output
 * directory (golden --out, run --dump, run --save, ckpt reshard DST) may be
 * replaced only when it is missing, empty, or a directory parity wrote: it
 * holds a parity marker file (manifest.json of a golden set, format
 * "parity-golden"; metadata.json of a checkpoint, format "parity-ckpt") and
 * nothing but the files that marker lists (plus SHA256SUMS of a
 * checkpoint); the exports of `parity export` (config.json "parity.format"
 * "parity-hf-export", batch.json "parity-batch") by their marker alone.  par_adir_commit enforces the rule for every kind;
 * par_outdir_check also checks the kind and the parent, and is what the CLI
 * runs on every output path before the first step.
 *
 * Temporaries (DIR.tmp-XXXXXX of par_adir_begin, FILE.tmp-XXXXXX of
 * par_afile) are recorded while they live, and par_tmp_install_signal_cleanup
 * makes SIGINT, SIGTERM and SIGHUP remove the live ones (async-signal-safe)
 * before the process dies of the signal.  A temporary directory carries a
 * marker (.parity-tmp: host and pid of its writer, removed at commit), so a
 * later par_adir_begin for the same DIR sweeps one left by a process that no
 * longer runs (kill -9, power loss) and logs it.
 */
#ifndef PAR_CORE_OUTDIR_H
#define PAR_CORE_OUTDIR_H

#include "core/status.h"

typedef enum {
    PAR_OUT_ANY = 0,  /* any parity-written directory (commit-time rule) */
    PAR_OUT_GOLDEN,   /* a golden set: manifest.json "parity-golden"     */
    PAR_OUT_CKPT,     /* a checkpoint: metadata.json "parity-ckpt"       */
    PAR_OUT_EXPORT,   /* `parity export hf|batch` output (its marker)    */
    PAR_OUT_FILE,     /* a file (par_outdir_check: no directory there)   */
} par_out_kind;

/* PAR_OK when dir may be replaced by a directory of `kind`: it does not
 * exist, is empty, or is a parity directory of that kind (PAR_OUT_ANY: of
 * any kind) holding only the files its marker lists.  Otherwise PAR_EINVAL
 * naming the rule and the first foreign entry; nothing is touched.  `what`
 * (a flag such as "--dump") starts the message. */
par_status par_outdir_replaceable(const char *dir, par_out_kind kind, const char *what);

/* Everything checkable before a run about an output path: for directories
 * par_outdir_replaceable; for a file that it is not a directory; for both
 * that the parent directory exists and is writable. */
par_status par_outdir_check(const char *path, par_out_kind kind, const char *what);

/* 1 when paths a and b name the same output (after resolving the parent
 * directories), else 0. */
int par_outdir_same(const char *a, const char *b);

/* ---- temporaries ----------------------------------------------------------- */

/* Records a live temporary (a directory tree when is_dir); returns its slot,
 * or -1 when the table is full (then it is not cleaned on a signal). */
int par__tmp_register(const char *path, int is_dir);
void par__tmp_unregister(int slot);
/* Slot of a registered path, or -1. */
int par__tmp_find(const char *path);

/* Installs the SIGINT / SIGTERM / SIGHUP handlers that remove the live
 * temporaries and then let the signal end the process (idempotent). */
void par_tmp_install_signal_cleanup(void);

/* Writes the marker into a new temporary directory. */
par_status par__tmp_mark(const char *tmpdir);
/* Removes the marker (before a commit). */
void par__tmp_unmark(const char *tmpdir);
/* Removes siblings DIR.tmp-XXXXXX of dir whose marker names this host and a
 * process that is gone; logs each one it removes.  Errors are logged, not
 * returned (a sweep never fails a save). */
void par__tmp_sweep(const char *dir);

#endif
