/* io: what parity may replace (core/outdir.h), reading only regular files
 * (core/fileio.h par_file_open_read), temporaries and their sweep.  Issue 13
 * items 4, 5, 7. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/outdir.h"
#include "core/status.h"
#include "io_test_util.h"

static void quiet(void) { par_err_set_quiet(1); }
static void no_leak(void) { cr_expect_eq(par_alloc_live_total(), 0, "leaked %lld bytes", (long long)par_alloc_live_total()); }

TestSuite(outdir, .init = quiet, .fini = no_leak);

static void put(const char *dir, const char *name, const char *text)
{
    char *p = par_path_join(dir, name);
    cr_assert_eq(par_file_write_atomic(p, text, strlen(text)), PAR_OK, "%s", par_last_error());
    par_free(p);
}

Test(outdir, only_parity_directories_are_replaceable)
{
    char *dir = io_tmpdir();
    char *d = par_path_join(dir, "d");
    cr_expect_eq(par_outdir_replaceable(d, PAR_OUT_GOLDEN, "--out"), PAR_OK, "missing: %s", par_last_error());
    mkdir(d, 0755);
    cr_expect_eq(par_outdir_replaceable(d, PAR_OUT_GOLDEN, "--out"), PAR_OK, "empty: %s", par_last_error());
    put(d, "notes.txt", "precious");
    cr_expect_eq(par_outdir_replaceable(d, PAR_OUT_ANY, "--out"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "was not written by parity"), "%s", par_last_error());
    /* a manifest of another tool is not a marker */
    put(d, "manifest.json", "{\"format\": \"something-else\", \"files\": {\"notes.txt\": \"0\"}}");
    cr_expect_eq(par_outdir_replaceable(d, PAR_OUT_ANY, "--out"), PAR_EINVAL);
    /* a golden set listing notes.txt is parity's; listing nothing is not enough */
    put(d, "manifest.json", "{\"format\": \"parity-golden\", \"files\": {}}");
    cr_expect_eq(par_outdir_replaceable(d, PAR_OUT_GOLDEN, "--out"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "holds 'notes.txt', which parity did not write"), "%s", par_last_error());
    put(d, "manifest.json", "{\"format\": \"parity-golden\", \"files\": {\"notes.txt\": \"0\"}}");
    cr_expect_eq(par_outdir_replaceable(d, PAR_OUT_GOLDEN, "--out"), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_outdir_replaceable(d, PAR_OUT_ANY, "--out"), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_outdir_replaceable(d, PAR_OUT_CKPT, "--save"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "is a parity golden set, not a checkpoint"), "%s", par_last_error());
    /* a subdirectory is never parity's */
    char *sub = par_path_join(d, "sub");
    mkdir(sub, 0755);
    cr_expect_eq(par_outdir_replaceable(d, PAR_OUT_GOLDEN, "--out"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "'sub'"), "%s", par_last_error());
    rmdir(sub);
    /* a checkpoint: metadata.json + SHA256SUMS + listed shards */
    char *c = par_path_join(dir, "c");
    mkdir(c, 0755);
    put(c, "metadata.json", "{\"format\": \"parity-ckpt\", \"files\": {\"rank-00000.safetensors\": \"0\"}}");
    put(c, "SHA256SUMS", "x");
    put(c, "rank-00000.safetensors", "x");
    cr_expect_eq(par_outdir_replaceable(c, PAR_OUT_CKPT, "--save"), PAR_OK, "%s", par_last_error());
    put(c, "rank-00001.safetensors", "x");
    cr_expect_eq(par_outdir_replaceable(c, PAR_OUT_CKPT, "--save"), PAR_EINVAL);
    /* not a directory */
    char *f = par_path_join(dir, "file");
    put(dir, "file", "x");
    cr_expect_eq(par_outdir_replaceable(f, PAR_OUT_ANY, "--dump"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "exists and is not a directory"), "%s", par_last_error());
    /* the same path spelled two ways */
    char two[4200];
    snprintf(two, sizeof two, "%s/./d/", dir);
    cr_expect(par_outdir_same(d, two));
    cr_expect(!par_outdir_same(d, c));
    par_free(sub);
    par_free(d);
    par_free(c);
    par_free(f);
    io_rmtree(dir);
}

Test(outdir, fifo_and_directory_are_refused_without_blocking)
{
    char *dir = io_tmpdir();
    char *p = par_path_join(dir, "fifo");
    cr_assert_eq(mkfifo(p, 0644), 0);
    int fd;
    cr_expect_eq(par_file_open_read(p, &fd, NULL), PAR_EIO); /* returns at once: no writer needed */
    cr_expect(strstr(par_last_error(), "is a FIFO"), "%s", par_last_error());
    void *buf;
    size_t n;
    cr_expect_eq(par_file_read(p, PAR_TAG_IO, &buf, &n), PAR_EIO);
    cr_expect_eq(par_file_read(dir, PAR_TAG_IO, &buf, &n), PAR_EIO);
    cr_expect(strstr(par_last_error(), "is a directory"), "%s", par_last_error());
    cr_expect_eq(par_file_read("/nonexistent/parity", PAR_TAG_IO, &buf, &n), PAR_ENOTFOUND);
    par_free(p);
    io_rmtree(dir);
}

Test(outdir, stale_temporaries_of_dead_processes_are_swept)
{
    char *dir = io_tmpdir();
    char *d = par_path_join(dir, "set");
    /* a child begins a directory and dies without cleaning up */
    pid_t pid = fork();
    if (pid == 0) {
        char *tmp;
        _exit(par_adir_begin(d, &tmp) == PAR_OK ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    cr_expect_eq(io_count_entries(dir, ".tmp-"), 1);
    /* a foreign directory of the same pattern (no marker) is left alone */
    char foreign[4200];
    snprintf(foreign, sizeof foreign, "%s/set.tmp-ABCDEF", dir);
    mkdir(foreign, 0755);
    char *tmp;
    cr_assert_eq(par_adir_begin(d, &tmp), PAR_OK, "%s", par_last_error());
    cr_expect_eq(io_count_entries(dir, ".tmp-"), 2, "the dead child's temporary is swept, ours and the foreign stay");
    cr_expect(par_path_is_dir(foreign));
    char *mark = par_path_join(tmp, ".parity-tmp");
    cr_expect(par_path_exists(mark), "a temporary carries its marker");
    cr_expect_eq(par_adir_commit(tmp, d), PAR_OK, "%s", par_last_error());
    cr_expect(!par_path_exists(mark));
    char *committed = par_path_join(d, ".parity-tmp");
    cr_expect(!par_path_exists(committed), "the marker is not committed");
    par_free(committed);
    par_free(mark);
    par_free(d);
    io_rmtree(dir);
}

Test(outdir, a_signal_removes_live_temporaries)
{
    char *dir = io_tmpdir();
    char *d = par_path_join(dir, "set");
    pid_t pid = fork();
    if (pid == 0) {
        par_tmp_install_signal_cleanup();
        char *tmp;
        if (par_adir_begin(d, &tmp) != PAR_OK)
            _exit(1);
        char *x = par_path_join(tmp, "params.0.safetensors");
        par_file_write_atomic(x, "xx", 2);
        par_afile *f;
        char *y = par_path_join(dir, "loose.json");
        par_afile_open(y, &f); /* a live temporary file too */
        raise(SIGTERM);
        _exit(2); /* not reached */
    }
    int status;
    waitpid(pid, &status, 0);
    cr_expect(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "the signal still ends the process");
    cr_expect_eq(io_count_entries(dir, ".tmp-"), 0, "no temporary left");
    par_free(d);
    io_rmtree(dir);
}
