/* core/fileio.h - whole-file reads and atomic writes of files and directories.
 *
 * Atomic file: the bytes go to a temporary file in the same directory
 * (PATH.tmp-XXXXXX), which is fsync'ed, renamed over PATH, and the directory
 * is fsync'ed.  Readers see the old file or the complete new one, never a
 * half-written one; on any failure the temporary is removed.
 *
 * Atomic directory: build the contents in DIR.tmp-XXXXXX (par_adir_begin),
 * then par_adir_commit renames it over DIR (an existing DIR is swapped out
 * with renameat2(RENAME_EXCHANGE) where the kernel has it, else moved aside,
 * and then removed; only a directory parity wrote is ever replaced, see
 * core/outdir.h).  par_adir_abort removes the temporary tree.  Commit
 * fsyncs the temporary directory itself, not the files in it: write those
 * with par_file_write_atomic / par_afile / par_st_writer, which fsync.
 */
#ifndef PAR_CORE_FILEIO_H
#define PAR_CORE_FILEIO_H

#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/status.h"

/* Opens path for reading after checking, on the descriptor, that it is a
 * regular file: a FIFO, directory, socket or device is refused with a
 * message naming what it is (the open itself never blocks).  *fd (close it)
 * and *size (bytes; NULL is fine) are set only on success.  Every reader of
 * user files goes through here. */
par_status par_file_open_read(const char *path, int *fd, int64_t *size);

/* Reads a whole regular file into a par_malloc'd buffer of `tag`, followed by
 * one extra NUL byte (not counted in *len).  *data and *len are set only on
 * success; the caller frees *data with par_free. */
par_status par_file_read(const char *path, par_tag tag, void **data, size_t *len);
/* The whole file mapped read-only into memory (private, populated: for
 * files read once from the page cache, as the comparator reads two golden
 * sets, this spares the copy and the fresh buffer's page faults of
 * par_file_read).  *len = 0 and *data = NULL for an empty file (nothing
 * mapped).  Unmapped by par_file_unmap(data, len). */
par_status par_file_map(const char *path, void **data, size_t *len);
void par_file_unmap(void *data, size_t len);

/* Writes n bytes to path atomically (see above). */
par_status par_file_write_atomic(const char *path, const void *data, size_t n);

/* Streaming form of the same: open, write pieces, commit (or abort). */
typedef struct par_afile par_afile;
par_status par_afile_open(const char *path, par_afile **out);
par_status par_afile_write(par_afile *f, const void *data, size_t n);
/* n bytes at byte `offset` of the file (pwrite: the pieces in any order; a
 * streamed safetensors file writes each tensor where its header puts it). */
par_status par_afile_pwrite(par_afile *f, const void *data, size_t n, uint64_t offset);
/* fsync, rename over the target, fsync the directory.  Frees f whatever
 * happens; on failure the temporary file is removed. */
par_status par_afile_commit(par_afile *f);
/* Removes the temporary file and frees f (NULL is fine). */
void par_afile_abort(par_afile *f);

/* Durability of the atomic writes above: on (fsync) by default.  Off, a
 * file is still written to a temporary and renamed (readers never see half a
 * file), but neither it nor its directory is fsync'ed: after an OS crash it
 * may be lost.  For scratch output only (the matrix's cell sets, removed
 * when they pass: src/matrix).  Process-wide; returns the previous setting. */
int par_file_set_durable(int on);

/* Creates DIR.tmp-XXXXXX next to dir; *tmp receives its path (par_malloc'd,
 * tag IO), set only on success. */
par_status par_adir_begin(const char *dir, char **tmp);
/* fsyncs tmp, renames it over dir (replacing an existing dir), fsyncs the
 * parent, removes the replaced tree.  Frees tmp whatever happens; on failure
 * the temporary tree is removed and an existing dir is left as it was. */
par_status par_adir_commit(char *tmp, const char *dir);
/* Removes the temporary tree and frees tmp (NULL is fine). */
void par_adir_abort(char *tmp);

/* Removes a file or a directory tree (symlinks are removed, not followed).
 * A path that does not exist is not an error. */
par_status par_remove_tree(const char *path);

/* 1 if path names a directory, 0 otherwise (including when it is missing). */
int par_path_is_dir(const char *path);
/* 1 if path exists (any kind), else 0. */
int par_path_exists(const char *path);
/* Parent directory of path ("." when it has none), par_malloc'd (tag IO);
 * NULL when out of memory. */
char *par__path_parent(const char *path);
/* "dir/name" in a par_malloc'd string (tag IO), or NULL when out of memory. */
char *par_path_join(const char *dir, const char *name);

#endif
