/* core/outfile.h - which single files parity may write over.
 *
 * The file outputs (run --summary, matrix --report .md / .json / .xml, compare
 * --json, plan --json, schedule --svg / --trace, run --trace, ckpt export
 * FILE) follow the rule of the output directories (core/outdir.h): parity
 * replaces a file only when it is missing or a file parity wrote, which it
 * recognises by the contents:
 *
 *   JSON with a top-level "format" of a single-file output
 *     ("parity-run-summary", "parity-matrix", "parity-compare",
 *     "parity-plan"), or a compare report of older builds (keys a, b,
 *     policy, policy_source, tensors);
 *   a Chrome trace (Perfetto) whose "otherData" says "generator": "parity",
 *     or one of the traces older builds wrote (run --trace's "otherData"
 *     {"network": ...}; schedule --trace's "rank 0" process-name prefix);
 *   an SVG holding the comment <!-- parity schedule --> or the schedule
 *     timeline's header of older builds;
 *   Markdown whose first line is "# parity matrix";
 *   JUnit XML whose root is <testsuites name="parity matrix" (matrix --report FILE.xml);
 *   safetensors whose __metadata__ "format" is "parity-ckpt-export".
 *
 * A golden set's or a checkpoint's own files (manifest.json, metadata.json,
 * params.K ...) are not single-file outputs: replacing one would break its
 * set, so they are refused like a foreign file.  A symbolic link is always
 * refused (a rename would replace the link, not what it names), and so is
 * anything that is not a regular file.  `overwrite` (the commands'
 * --overwrite) lifts only the content rule.
 *
 * par_outfile_guard records the path with its rule; par_afile_commit (core/
 * fileio.h) re-applies the rule to a recorded path at the last moment, just
 * before the rename, so a file that appeared during a long run is not lost.
 */
#ifndef PAR_CORE_OUTFILE_H
#define PAR_CORE_OUTFILE_H

#include "core/status.h"

/* PAR_OK when path may be replaced (see above); else PAR_EINVAL naming
 * `what` (a flag such as "--summary"), the path and the rule.  Touches
 * nothing. */
par_status par_outfile_replaceable(const char *path, int overwrite, const char *what);

/* The noun of the parity file path holds ("run summary", "matrix report
 * (Markdown)", ...), or NULL when it is none of them (or unreadable). */
const char *par_outfile_kind(const char *path);

/* par_outfile_replaceable, and on success records path (as given) so that
 * par__outfile_commit_check applies the same rule before the final rename.
 * A path recorded twice keeps its first rule. */
par_status par_outfile_guard(const char *path, int overwrite, const char *what);

/* PAR_OK when path is not recorded or still replaceable (called by
 * par_afile_commit before its rename). */
par_status par__outfile_commit_check(const char *path);

/* Forgets every recorded path (tests). */
void par__outfile_forget_all(void);

#endif
