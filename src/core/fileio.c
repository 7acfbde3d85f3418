#define _GNU_SOURCE /* renameat2 / RENAME_EXCHANGE where glibc has them */
#include "core/fileio.h"
#include "core/outdir.h"
#include "core/outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ---------------------------------------------------------- */

char *par_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    int slash = a > 0 && dir[a - 1] != '/';
    char *p = par_malloc(a + (size_t)slash + b + 1, PAR_TAG_IO);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    if (slash)
        p[a] = '/';
    memcpy(p + a + slash, name, b + 1);
    return p;
}

/* Parent directory of path in a par_malloc'd string ("." when none). */
char *par__path_parent(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') /* ignore trailing slashes */
        n--;
    while (n > 0 && path[n - 1] != '/')
        n--;
    while (n > 1 && path[n - 1] == '/')
        n--;
    if (n == 0)
        return par_strdup(".", PAR_TAG_IO);
    char *p = par_malloc(n + 1, PAR_TAG_IO);
    if (!p)
        return NULL;
    memcpy(p, path, n);
    p[n] = '\0';
    return p;
}

/* path + suffix ("...XXXXXX") in a par_malloc'd buffer, trailing '/' dropped. */
static char *with_suffix(const char *path, const char *suffix)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t s = strlen(suffix);
    char *p = par_malloc(n + s + 1, PAR_TAG_IO);
    if (!p)
        return NULL;
    memcpy(p, path, n);
    memcpy(p + n, suffix, s + 1);
    return p;
}

static _Atomic int durable = 1; /* par_file_set_durable */

int par_file_set_durable(int on) { return atomic_exchange(&durable, on ? 1 : 0); }

static par_status fsync_dir(const char *dir)
{
    if (!atomic_load(&durable))
        return PAR_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return par_err(PAR_EIO, "%s: cannot open directory to fsync it: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    /* Some file systems refuse fsync on directories; that is not a failure. */
    if (rc != 0 && e != EINVAL && e != ENOTSUP)
        return par_err(PAR_EIO, "%s: fsync of the directory failed: %s", dir, strerror(e));
    return PAR_OK;
}

static par_status fsync_parent(const char *path)
{
    char *d = par__path_parent(path);
    if (!d)
        return par_err(PAR_ENOMEM, "%s: out of memory", path);
    par_status st = fsync_dir(d);
    par_free(d);
    return st;
}

int par_path_is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int par_path_exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* ---- opening files to read ------------------------------------------- */

static const char *file_kind(mode_t m)
{
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISFIFO(m))
        return "a FIFO (named pipe)";
    if (S_ISSOCK(m))
        return "a socket";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    return "of another kind";
}

par_status par_file_open_read(const char *path, int *fd_out, int64_t *size)
{
    /* O_NONBLOCK: opening a FIFO without a writer must not block; the file
     * type is checked on the descriptor itself (no stat/open race). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return par_err(errno == ENOENT ? PAR_ENOTFOUND : PAR_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        par_status st = par_err(PAR_EIO, "%s: fstat failed: %s", path, strerror(errno));
        close(fd);
        return st;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return par_err(PAR_EIO, "%s: is %s, not a regular file (parity reads only regular files)", path,
                       file_kind(sb.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    if (size)
        *size = (int64_t)sb.st_size;
    return PAR_OK;
}

/* ---- whole-file read -------------------------------------------------- */

par_status par_file_map(const char *path, void **data, size_t *len)
{
    int fd;
    int64_t fsize;
    par_status st = par_file_open_read(path, &fd, &fsize);
    if (st)
        return st;
    if ((unsigned long long)fsize >= (unsigned long long)SIZE_MAX) {
        close(fd);
        return par_err(PAR_ERANGE, "%s: %lld bytes do not fit in memory", path, (long long)fsize);
    }
    void *p = NULL;
    if (fsize > 0) {
        p = mmap(NULL, (size_t)fsize, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return par_err(PAR_EIO, "%s: mmap of %lld bytes failed: %s", path, (long long)fsize, strerror(e));
        }
    }
    close(fd);
    *data = p;
    *len = (size_t)fsize;
    return PAR_OK;
}

void par_file_unmap(void *data, size_t len)
{
    if (data && len)
        (void)munmap(data, len);
}

par_status par_file_read(const char *path, par_tag tag, void **data, size_t *len)
{
    int fd;
    int64_t fsize;
    par_status st = par_file_open_read(path, &fd, &fsize);
    if (st)
        return st;
    struct stat sb;
    sb.st_size = (off_t)fsize;
    if ((unsigned long long)sb.st_size >= (unsigned long long)SIZE_MAX) {
        st = par_err(PAR_ERANGE, "%s: %lld bytes do not fit in memory", path, (long long)sb.st_size);
        goto fail_close;
    }
    size_t n = (size_t)sb.st_size;
    char *buf = par_malloc(n + 1, tag);
    if (!buf) {
        st = par_err(PAR_ENOMEM, "%s: cannot allocate %zu bytes to read it", path, n);
        goto fail_close;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            st = par_err(PAR_EIO, "%s: read failed at byte %zu: %s", path, got, strerror(errno));
            goto fail_free_buf;
        }
        if (r == 0) {
            st = par_err(PAR_EIO, "%s: file shrank while reading (%zu of %zu bytes)", path, got, n);
            goto fail_free_buf;
        }
        got += (size_t)r;
    }
    buf[n] = '\0';
    close(fd);
    *data = buf;
    *len = n;
    return PAR_OK;

fail_free_buf:
    par_free(buf);
fail_close:
    close(fd);
    return st;
}

/* ---- atomic file ------------------------------------------------------ */

struct par_afile {
    int fd;
    int slot;   /* in the table of live temporaries (core/outdir.h) */
    char *path; /* target */
    char *tmp;  /* temporary in the same directory */
};

par_status par_afile_open(const char *path, par_afile **out)
{
    par_afile *f = par_calloc(1, sizeof *f, PAR_TAG_IO);
    if (!f)
        return par_err(PAR_ENOMEM, "%s: out of memory", path);
    f->fd = -1;
    f->path = par_strdup(path, PAR_TAG_IO);
    f->tmp = with_suffix(path, ".tmp-XXXXXX");
    if (!f->path || !f->tmp) {
        par_free(f->path);
        par_free(f->tmp);
        par_free(f);
        return par_err(PAR_ENOMEM, "%s: out of memory", path);
    }
    f->fd = mkstemp(f->tmp);
    if (f->fd < 0) {
        par_status st = par_err(PAR_EIO, "%s: cannot create a temporary file next to it (%s): %s", path, f->tmp,
                                strerror(errno));
        par_free(f->path);
        par_free(f->tmp);
        par_free(f);
        return st;
    }
    (void)fchmod(f->fd, 0644); /* mkstemp makes 0600 */
    f->slot = par__tmp_register(f->tmp, 0);
    *out = f;
    return PAR_OK;
}

par_status par_afile_write(par_afile *f, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        size_t k = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t w = write(f->fd, p, k);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return par_err(PAR_EIO, "%s: write to %s failed: %s", f->path, f->tmp, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return PAR_OK;
}

par_status par_afile_pwrite(par_afile *f, const void *data, size_t n, uint64_t offset)
{
    const char *p = data;
    while (n) {
        size_t k = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t w = pwrite(f->fd, p, k, (off_t)offset);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return par_err(PAR_EIO, "%s: write to %s at byte %llu failed: %s", f->path, f->tmp,
                           (unsigned long long)offset, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
        offset += (uint64_t)w;
    }
    return PAR_OK;
}

static void afile_free(par_afile *f)
{
    par__tmp_unregister(f->slot);
    par_free(f->path);
    par_free(f->tmp);
    par_free(f);
}

void par_afile_abort(par_afile *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    par__tmp_unregister(f->slot);
    f->slot = -1;
    unlink(f->tmp);
    afile_free(f);
}

par_status par_afile_commit(par_afile *f)
{
    par_status st = PAR_OK;
    if (atomic_load(&durable) && fsync(f->fd) != 0) {
        st = par_err(PAR_EIO, "%s: fsync of %s failed: %s", f->path, f->tmp, strerror(errno));
        goto fail_abort;
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        st = par_err(PAR_EIO, "%s: close of %s failed: %s", f->path, f->tmp, strerror(errno));
        goto fail_abort;
    }
    if ((st = par__outfile_commit_check(f->path)))
        goto fail_abort;
    if (rename(f->tmp, f->path) != 0) {
        st = par_err(PAR_EIO, "%s: rename from %s failed: %s", f->path, f->tmp, strerror(errno));
        goto fail_abort;
    }
    st = fsync_parent(f->path);
    afile_free(f);
    return st;

fail_abort:
    par_afile_abort(f);
    return st;
}

par_status par_file_write_atomic(const char *path, const void *data, size_t n)
{
    par_afile *f;
    par_status st = par_afile_open(path, &f);
    if (st)
        return st;
    st = par_afile_write(f, data, n);
    if (st) {
        par_afile_abort(f);
        return st;
    }
    return par_afile_commit(f);
}

/* ---- trees ------------------------------------------------------------ */

static par_status remove_tree_at(const char *path, int depth)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT)
            return PAR_OK;
        return par_err(PAR_EIO, "%s: lstat failed: %s", path, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return par_err(PAR_EIO, "%s: unlink failed: %s", path, strerror(errno));
        return PAR_OK;
    }
    if (depth > 64)
        return par_err(PAR_ERANGE, "%s: directory nesting deeper than 64", path);
    DIR *d = opendir(path);
    if (!d)
        return par_err(PAR_EIO, "%s: opendir failed: %s", path, strerror(errno));
    par_status st = PAR_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char *c = par_path_join(path, e->d_name);
        if (!c) {
            st = par_err(PAR_ENOMEM, "%s: out of memory", path);
            break;
        }
        st = remove_tree_at(c, depth + 1);
        par_free(c);
        if (st)
            break;
    }
    closedir(d);
    if (!st && rmdir(path) != 0)
        st = par_err(PAR_EIO, "%s: rmdir failed: %s", path, strerror(errno));
    return st;
}

par_status par_remove_tree(const char *path) { return remove_tree_at(path, 0); }

/* ---- atomic directory ------------------------------------------------- */

par_status par_adir_begin(const char *dir, char **tmp)
{
    char *t = with_suffix(dir, ".tmp-XXXXXX");
    if (!t)
        return par_err(PAR_ENOMEM, "%s: out of memory", dir);
    par__tmp_sweep(dir); /* temporaries of this DIR left by processes that are gone */
    if (!mkdtemp(t)) {
        par_status st = par_err(PAR_EIO, "%s: cannot create a temporary directory next to it: %s", dir,
                                strerror(errno));
        par_free(t);
        return st;
    }
    (void)chmod(t, 0755); /* mkdtemp makes 0700 */
    par__tmp_register(t, 1);
    par_status st = par__tmp_mark(t);
    if (st) {
        par_adir_abort(t);
        return st;
    }
    *tmp = t;
    return PAR_OK;
}

void par_adir_abort(char *tmp)
{
    if (!tmp)
        return;
    (void)par_remove_tree(tmp);
    par__tmp_unregister(par__tmp_find(tmp));
    par_free(tmp);
}

par_status par_adir_commit(char *tmp, const char *dir)
{
    int slot = par__tmp_find(tmp);
    par__tmp_unmark(tmp);
    /* parity replaces only a directory it wrote (core/outdir.h) */
    par_status st = par_outdir_replaceable(dir, PAR_OUT_ANY, "replacing");
    if (!st)
        st = fsync_dir(tmp);
    if (st)
        goto fail_abort;
    struct stat sb;
    if (lstat(dir, &sb) != 0) {
        if (errno != ENOENT) {
            st = par_err(PAR_EIO, "%s: lstat failed: %s", dir, strerror(errno));
            goto fail_abort;
        }
        if (rename(tmp, dir) != 0) {
            st = par_err(PAR_EIO, "%s: rename from %s failed: %s", dir, tmp, strerror(errno));
            goto fail_abort;
        }
        st = fsync_parent(dir);
        par__tmp_unregister(slot);
        par_free(tmp);
        return st;
    }
    if (!S_ISDIR(sb.st_mode)) {
        st = par_err(PAR_EIO, "%s: exists and is not a directory; not replacing it", dir);
        goto fail_abort;
    }
#if defined(RENAME_EXCHANGE)
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        /* tmp now holds the old tree */
        st = fsync_parent(dir);
        par_status st2 = par_remove_tree(tmp);
        par__tmp_unregister(slot);
        par_free(tmp);
        return st ? st : st2;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
        st = par_err(PAR_EIO, "%s: exchange with %s failed: %s", dir, tmp, strerror(errno));
        goto fail_abort;
    }
#endif
    {
        /* Fallback: move the old tree aside onto an empty placeholder, move
         * the new one in, remove the old one.  There is a short window in
         * which dir does not exist. */
        char *old = with_suffix(dir, ".old-XXXXXX");
        if (!old) {
            st = par_err(PAR_ENOMEM, "%s: out of memory", dir);
            goto fail_abort;
        }
        if (!mkdtemp(old)) {
            st = par_err(PAR_EIO, "%s: cannot create a placeholder directory: %s", dir, strerror(errno));
            par_free(old);
            goto fail_abort;
        }
        if (rename(dir, old) != 0) {
            st = par_err(PAR_EIO, "%s: cannot move the old directory aside to %s: %s", dir, old, strerror(errno));
            rmdir(old);
            par_free(old);
            goto fail_abort;
        }
        if (rename(tmp, dir) != 0) {
            st = par_err(PAR_EIO, "%s: rename from %s failed: %s", dir, tmp, strerror(errno));
            (void)rename(old, dir); /* put the old one back */
            par_free(old);
            goto fail_abort;
        }
        st = fsync_parent(dir);
        par_status st2 = par_remove_tree(old);
        par_free(old);
        par__tmp_unregister(slot);
        par_free(tmp);
        return st ? st : st2;
    }

fail_abort:
    par_adir_abort(tmp);
    return st;
}
