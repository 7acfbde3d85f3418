/* core/outdir.c - ownership of output directories, live temporaries and
 * their removal on signals, the sweep of stale temporaries (outdir.h). */
#define _GNU_SOURCE
#include "core/outdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"

/* ---- which directories parity wrote ------------------------------------------- */

typedef struct {
    par_out_kind kind;
    const char *marker; /* file naming the kind                              */
    const char *outer;  /* object of the marker holding "format" (NULL: top) */
    const char *format; /* its "format" string                               */
    const char *noun;
    const char *extra;  /* one more file it may hold                         */
    int listed;         /* 1: every entry must be in the marker's "files"    */
} kind_def;

/* The exports (`parity export hf|batch`, src/cli/cmd_export.c) keep no file
 * list: their marker alone says parity wrote them. */
static const kind_def kinds[] = {
    {PAR_OUT_GOLDEN, "manifest.json", NULL, "parity-golden", "golden set", NULL, 1},
    {PAR_OUT_CKPT, "metadata.json", NULL, "parity-ckpt", "checkpoint", "SHA256SUMS", 1},
    {PAR_OUT_EXPORT, "config.json", "parity", "parity-hf-export", "HF export", NULL, 0},
    {PAR_OUT_EXPORT, "batch.json", NULL, "parity-batch", "batch export", NULL, 0},
};
#define N_KINDS ((int)(sizeof kinds / sizeof kinds[0]))

static const char *kind_noun(par_out_kind k)
{
    for (int i = 0; i < N_KINDS; i++)
        if (kinds[i].kind == k)
            return kinds[i].noun;
    return "parity directory";
}

static int is_regular(const char *dir, const char *name)
{
    char *p = par_path_join(dir, name);
    struct stat sb;
    int r = p && lstat(p, &sb) == 0 && S_ISREG(sb.st_mode);
    par_free(p);
    return r;
}

/* The marker of dir: its kind index and parsed JSON (*root), or -1. */
static int read_marker(const char *dir, cJSON **root)
{
    for (int i = 0; i < N_KINDS; i++) {
        if (!is_regular(dir, kinds[i].marker))
            continue;
        char *p = par_path_join(dir, kinds[i].marker);
        void *text = NULL;
        size_t len = 0;
        cJSON *j = NULL;
        if (p && par_file_read(p, PAR_TAG_IO, &text, &len) == PAR_OK)
            j = cJSON_ParseWithLength(text, len); /* not JSON: not a marker (no message) */
        par_free(text);
        par_free(p);
        const cJSON *o = j && kinds[i].outer ? par_json_obj(j, kinds[i].outer) : j;
        const char *f = o ? par_json_str(o, "format") : NULL;
        if (f && !strcmp(f, kinds[i].format)) {
            *root = j;
            return i;
        }
        cJSON_Delete(j);
    }
    return -1;
}

/* Every entry of dir is the marker, the kind's extra file, or listed in the
 * marker's "files"; *bad receives the first that is not. */
static par_status check_entries(const char *dir, const kind_def *k, const cJSON *files, const char *what)
{
    DIR *d = opendir(dir);
    if (!d)
        return par_err(PAR_EIO, "%s %s: cannot list the directory: %s", what, dir, strerror(errno));
    par_status st = PAR_OK;
    struct dirent *e;
    while (!st && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, ".."))
            continue;
        int listed = !strcmp(n, k->marker) || (k->extra && !strcmp(n, k->extra)) ||
                     (cJSON_IsObject(files) && cJSON_GetObjectItemCaseSensitive(files, n));
        if (!listed || !is_regular(dir, n))
            st = par_err(PAR_EINVAL,
                         "%s %s: the directory holds '%s', which parity did not write (%s %s); parity replaces a %s "
                         "only when it holds nothing but the files its %s lists: move '%s' away or give "
                         "another directory",
                         what, dir, n, listed ? "not a regular file, though named in" : "not listed in",
                         k->marker, k->noun, k->marker, n);
    }
    closedir(d);
    return st;
}

static int dir_is_empty(const char *dir, par_status *st, const char *what)
{
    DIR *d = opendir(dir);
    if (!d) {
        *st = par_err(PAR_EIO, "%s %s: cannot list the directory: %s", what, dir, strerror(errno));
        return 0;
    }
    int empty = 1;
    struct dirent *e;
    while (empty && (e = readdir(d)) != NULL)
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    *st = PAR_OK;
    return empty;
}

par_status par_outdir_replaceable(const char *dir, par_out_kind kind, const char *what)
{
    struct stat sb;
    if (lstat(dir, &sb) != 0) {
        if (errno == ENOENT)
            return PAR_OK;
        return par_err(PAR_EIO, "%s %s: cannot stat it: %s", what, dir, strerror(errno));
    }
    if (S_ISLNK(sb.st_mode))
        return par_err(PAR_EINVAL, "%s %s: is a symbolic link; parity replaces only a directory it wrote (give the "
                                   "real path or a new directory)", what, dir);
    if (!S_ISDIR(sb.st_mode))
        return par_err(PAR_EINVAL, "%s %s: exists and is not a directory; not replacing it", what, dir);
    par_status st;
    if (dir_is_empty(dir, &st, what) || st)
        return st;
    cJSON *root = NULL;
    int ki = read_marker(dir, &root);
    if (ki < 0)
        return par_err(PAR_EINVAL,
                       "%s %s: the directory exists, is not empty and was not written by parity (it holds no "
                       "golden-set manifest.json nor checkpoint metadata.json nor an export's marker); parity never "
                       "deletes what it did not write: give a new or empty directory",
                       what, dir);
    if (kind != PAR_OUT_ANY && kinds[ki].kind != kind) {
        cJSON_Delete(root);
        return par_err(PAR_EINVAL, "%s %s: the directory is a parity %s, not a %s; parity replaces a directory only "
                                   "with one of the same kind: give another directory",
                       what, dir, kinds[ki].noun, kind_noun(kind));
    }
    if (kinds[ki].listed)
        st = check_entries(dir, &kinds[ki], cJSON_GetObjectItemCaseSensitive(root, "files"), what);
    cJSON_Delete(root);
    return st;
}

par_status par_outdir_check(const char *path, par_out_kind kind, const char *what)
{
    if (!path || !*path)
        return par_err(PAR_EINVAL, "%s: the path is empty", what);
    struct stat sb;
    int exists = lstat(path, &sb) == 0;
    par_status st = PAR_OK;
    if (kind == PAR_OUT_FILE) {
        if (exists && !S_ISREG(sb.st_mode))
            return par_err(PAR_EINVAL, "%s %s: exists and is %s; not replacing it", what, path,
                           S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file");
    } else if ((st = par_outdir_replaceable(path, kind, what))) {
        return st;
    }
    char *parent = par__path_parent(path);
    if (!parent)
        return par_err(PAR_ENOMEM, "%s %s: out of memory", what, path);
    if (!par_path_is_dir(parent))
        st = par_err(PAR_EINVAL, "%s %s: the parent directory %s does not exist", what, path, parent);
    else if (access(parent, W_OK | X_OK) != 0)
        st = par_err(PAR_EINVAL, "%s %s: cannot write in the parent directory %s: %s", what, path, parent,
                     strerror(errno));
    else if (exists && kind != PAR_OUT_FILE && S_ISDIR(sb.st_mode) && access(path, W_OK | X_OK) != 0)
        st = par_err(PAR_EINVAL, "%s %s: cannot replace the directory's files: %s", what, path, strerror(errno));
    par_free(parent);
    return st;
}

/* realpath(parent) + "/" + last component, or a copy of p. */
static char *canonical(const char *p)
{
    char *parent = par__path_parent(p);
    if (!parent)
        return NULL;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && p[b - 1] != '/')
        b--;
    char *rp = realpath(parent, NULL);
    par_free(parent);
    char name[NAME_MAX + 1];
    snprintf(name, sizeof name, "%.*s", (int)(n - b), p + b);
    char *out = rp ? par_path_join(rp, name) : par_strdup(p, PAR_TAG_IO);
    free(rp);
    return out;
}

int par_outdir_same(const char *a, const char *b)
{
    if (!a || !b)
        return 0;
    char *ca = canonical(a), *cb = canonical(b);
    int same = ca && cb && !strcmp(ca, cb);
    par_free(ca);
    par_free(cb);
    return same;
}

/* ---- live temporaries and signals -------------------------------------------- */

#define TMP_SLOTS 64

typedef struct {
    atomic_int state; /* 0 free, 1 being filled, 2 live */
    int is_dir;
    char path[PATH_MAX];
} tmp_slot;

static tmp_slot slots[TMP_SLOTS];

int par__tmp_register(const char *path, int is_dir)
{
    if (!path || strlen(path) >= PATH_MAX)
        return -1;
    for (int i = 0; i < TMP_SLOTS; i++) {
        int expect = 0;
        if (atomic_compare_exchange_strong(&slots[i].state, &expect, 1)) {
            strcpy(slots[i].path, path);
            slots[i].is_dir = is_dir;
            atomic_store(&slots[i].state, 2);
            return i;
        }
    }
    return -1;
}

void par__tmp_unregister(int slot)
{
    if (slot >= 0 && slot < TMP_SLOTS)
        atomic_store(&slots[slot].state, 0);
}

int par__tmp_find(const char *path)
{
    for (int i = 0; path && i < TMP_SLOTS; i++)
        if (atomic_load(&slots[i].state) == 2 && !strcmp(slots[i].path, path))
            return i;
    return -1;
}

/* Async-signal-safe pieces: raw getdents64, unlinkat, write. */
struct ldirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static void rm_tree_at(int dfd, const char *name, int depth)
{
    if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
        return;
    if ((errno != EISDIR && errno != EPERM) || depth > 8)
        return;
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[2048] __attribute__((aligned(8)));
    for (int pass = 0; pass < 4; pass++) { /* a writer may still add files: a few passes */
        lseek(fd, 0, SEEK_SET);
        long n;
        while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
            for (long off = 0; off < n;) {
                struct ldirent64 *d = (struct ldirent64 *)(buf + off);
                off += d->d_reclen;
                if (strcmp(d->d_name, ".") && strcmp(d->d_name, ".."))
                    rm_tree_at(fd, d->d_name, depth + 1);
            }
        }
        if (unlinkat(dfd, name, AT_REMOVEDIR) == 0)
            break;
    }
    close(fd);
}

static void say(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    ssize_t w = write(STDERR_FILENO, s, n);
    (void)w;
}

static struct sigaction old_act[65];
static atomic_int installed;

static void on_signal(int sig)
{
    int saved = errno;
    const char *name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
    for (int i = 0; i < TMP_SLOTS; i++) {
        int expect = 2;
        if (!atomic_compare_exchange_strong(&slots[i].state, &expect, 1))
            continue;
        if (slots[i].is_dir)
            rm_tree_at(AT_FDCWD, slots[i].path, 0);
        else
            unlink(slots[i].path);
        say("parity: ");
        say(name);
        say(": removed the temporary ");
        say(slots[i].path);
        say("\n");
        atomic_store(&slots[i].state, 0);
    }
    /* then the signal does what it did before (by default: end the process) */
    if (sig > 0 && sig < 65 && (old_act[sig].sa_flags & SA_SIGINFO) == 0 &&
        old_act[sig].sa_handler != SIG_DFL && old_act[sig].sa_handler != SIG_IGN) {
        old_act[sig].sa_handler(sig);
    } else {
        signal(sig, SIG_DFL);
        raise(sig);
    }
    errno = saved;
}

void par_tmp_install_signal_cleanup(void)
{
    if (atomic_exchange(&installed, 1))
        return;
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        /* a signal ignored on entry (nohup, a background job) stays ignored:
         * the process goes on and needs its temporaries */
        if (sigaction(sigs[i], NULL, &old_act[sigs[i]]) != 0 || old_act[sigs[i]].sa_handler == SIG_IGN)
            continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

/* ---- the marker of a temporary directory and the sweep ---------------------- */

#define TMP_MARKER ".parity-tmp"

par_status par__tmp_mark(const char *tmpdir)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char text[400];
    int n = snprintf(text, sizeof text, "parity temporary directory\nhost %s\npid %ld\n", host, (long)getpid());
    char *p = par_path_join(tmpdir, TMP_MARKER);
    if (!p)
        return par_err(PAR_ENOMEM, "%s: out of memory", tmpdir);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    par_status st = PAR_OK;
    if (fd < 0 || write(fd, text, (size_t)n) != n)
        st = par_err(PAR_EIO, "%s: cannot write the temporary's marker: %s", p, strerror(errno));
    if (fd >= 0)
        close(fd);
    par_free(p);
    return st;
}

void par__tmp_unmark(const char *tmpdir)
{
    char *p = par_path_join(tmpdir, TMP_MARKER);
    if (p)
        unlink(p);
    par_free(p);
}

/* 1 when the temporary at path was left by a process of this host that is gone. */
static int stale(const char *path, long *pid_out)
{
    char *p = par_path_join(path, TMP_MARKER);
    if (!p)
        return 0;
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    par_free(p);
    if (fd < 0)
        return 0;
    char text[400];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return 0;
    text[n] = '\0';
    char host[256] = "", mine[256] = "";
    long pid = 0;
    if (sscanf(text, "parity temporary directory\nhost %255s\npid %ld", host, &pid) != 2 || pid <= 0)
        return 0;
    gethostname(mine, sizeof mine - 1);
    if (strcmp(host, mine) || pid == (long)getpid())
        return 0;
    *pid_out = pid;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

void par__tmp_sweep(const char *dir)
{
    char *parent = par__path_parent(dir);
    if (!parent)
        return;
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    char prefix[NAME_MAX + 8];
    snprintf(prefix, sizeof prefix, "%.*s.tmp-", (int)(n - b), dir + b);
    size_t pl = strlen(prefix);
    DIR *d = opendir(parent);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, pl) || strlen(e->d_name) != pl + 6)
            continue;
        char *path = par_path_join(parent, e->d_name);
        long pid = 0;
        if (path && par_path_is_dir(path) && stale(path, &pid)) {
            if (par_remove_tree(path) == PAR_OK)
                PAR_LOG_W("removed the stale temporary directory %s (left by process %ld of this host, which no "
                          "longer runs)", path, pid);
            else
                PAR_LOG_W("could not remove the stale temporary directory %s: %s", path, par_last_error());
        }
        par_free(path);
    }
    if (d)
        closedir(d);
    par_free(parent);
}
