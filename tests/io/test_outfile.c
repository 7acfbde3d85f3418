/* io: which single files parity may write over (core/outfile.h), and the
 * rule applied again at the final rename of par_afile_commit.  Issue 34
 * item 1. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/outfile.h"
#include "core/status.h"
#include "io_test_util.h"

static void quiet(void) { par_err_set_quiet(1); }
static void done(void)
{
    par__outfile_forget_all();
    cr_expect_eq(par_alloc_live_total(), 0, "leaked %lld bytes", (long long)par_alloc_live_total());
}

TestSuite(outfile, .init = quiet, .fini = done);

static void put(const char *path, const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(text, 1, n, f), n);
    fclose(f);
}
#define PUT(p, s) put(p, s, strlen(s))

static char *slurp(const char *p)
{
    void *d = NULL;
    size_t n = 0;
    cr_assert_eq(par_file_read(p, PAR_TAG_IO, &d, &n), PAR_OK, "%s", par_last_error());
    return d;
}

Test(outfile, recognises_what_parity_writes)
{
    char *dir = io_tmpdir();
    char *f = par_path_join(dir, "f");
    static const char *const ours[] = {
        "{\"format\": \"parity-run-summary\", \"steps\": []}",
        "{\"x\": 1, \"format\": \"parity-matrix\"}",
        "{\"format\": \"parity-compare\"}",
        "{\"format\": \"parity-plan\"}",
        "{\"a\": \"g\", \"b\": \"h\", \"policy\": \"f64\", \"policy_source\": \"x\", \"tensors\": []}", /* older */
        "{\"displayTimeUnit\": \"ns\",\n \"otherData\": {\"generator\": \"parity\", \"network\": \"n\"},\n",
        "{\"displayTimeUnit\": \"ns\",\n \"otherData\": {\"network\": \"reference\"},\n \"traceEvents\": [",
        "# parity matrix\n\npreset ...\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"parity matrix\" tests=\"1\">\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"3\" "
        "height=\"4\">\n<!-- parity schedule -->\n",
    };
    for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++) {
        PUT(f, ours[i]);
        cr_expect(par_outfile_kind(f) != NULL, "not recognised: %s", ours[i]);
        cr_expect_eq(par_outfile_replaceable(f, 0, "--x"), PAR_OK, "%s: %s", ours[i], par_last_error());
    }
    static const char *const theirs[] = {
        "my readme\n",
        "{\"format\": \"parity-golden\", \"files\": {}}", /* a set's marker is no single-file output */
        "{\"format\": \"parity-ckpt\"}",
        "{\"format\": \"something-else\"}",
        "{\"displayTimeUnit\": \"ns\", \"traceEvents\": []}", /* another tool's trace */
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"3\">",
        "# parity matrices are fun\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"pytest\" tests=\"1\">\n", /* another tool's JUnit */
        "{\"format\": \"parity-run-summary\"", /* not JSON */
    };
    for (size_t i = 0; i < sizeof theirs / sizeof theirs[0]; i++) {
        PUT(f, theirs[i]);
        cr_expect_null(par_outfile_kind(f), "recognised: %s", theirs[i]);
        cr_expect_eq(par_outfile_replaceable(f, 0, "--x"), PAR_EINVAL, "%s", theirs[i]);
        cr_expect(strstr(par_last_error(), "was not written by parity"), "%s", par_last_error());
        cr_expect_eq(par_outfile_replaceable(f, 1, "--x"), PAR_OK, "--overwrite: %s", par_last_error());
    }
    /* safetensors: the export's metadata, not a golden file's */
    static const char *const hdr[2] = {"{\"__metadata__\":{\"format\":\"parity-ckpt-export\"}}",
                                       "{\"__metadata__\":{\"format\":\"parity-golden\"}}"};
    for (int k = 0; k < 2; k++) {
        char st[128] = {0};
        size_t n = strlen(hdr[k]);
        st[0] = (char)n;
        memcpy(st + 8, hdr[k], n);
        put(f, st, 8 + n);
        if (k == 0)
            cr_expect_str_eq(par_outfile_kind(f), "checkpoint export");
        else
            cr_expect_null(par_outfile_kind(f), "a golden file is no export");
    }
    par_free(f);
    io_rmtree(dir);
}

Test(outfile, links_and_non_files_are_refused_even_with_overwrite)
{
    char *dir = io_tmpdir();
    char *f = par_path_join(dir, "f"), *l = par_path_join(dir, "l");
    PUT(f, "{\"format\": \"parity-plan\"}");
    cr_assert_eq(symlink("f", l), 0);
    cr_expect_eq(par_outfile_replaceable(l, 1, "--json"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "is a symbolic link"), "%s", par_last_error());
    cr_expect_eq(par_outfile_replaceable(dir, 1, "--json"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "a directory"), "%s", par_last_error());
    PUT(f, "");
    cr_expect_eq(par_outfile_replaceable(f, 0, "--json"), PAR_OK, "an empty file holds nothing");
    par_free(f);
    par_free(l);
    io_rmtree(dir);
}

/* A file that appears (or is swapped for a link) between the check before the
 * run and the final rename is not replaced: par_afile_commit re-applies the
 * rule to the recorded path and removes its temporary. */
Test(outfile, the_rule_holds_at_the_final_rename)
{
    char *dir = io_tmpdir();
    char *f = par_path_join(dir, "out.json"), *g = par_path_join(dir, "other.json");
    cr_assert_eq(par_outfile_guard(f, 0, "--summary"), PAR_OK, "%s", par_last_error());
    PUT(f, "the user's file, made during the run");
    const char *ours = "{\"format\": \"parity-run-summary\"}";
    cr_expect_eq(par_file_write_atomic(f, ours, strlen(ours)), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "--summary"), "%s", par_last_error());
    char *t = slurp(f);
    cr_expect_str_eq(t, "the user's file, made during the run");
    par_free(t);
    unlink(f);
    cr_assert_eq(symlink("other.json", f), 0);
    cr_expect_eq(par_file_write_atomic(f, ours, strlen(ours)), PAR_EINVAL);
    struct stat sb;
    cr_expect(lstat(f, &sb) == 0 && S_ISLNK(sb.st_mode), "the link is still there");
    unlink(f);
    cr_expect_eq(par_file_write_atomic(f, ours, strlen(ours)), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_file_write_atomic(f, ours, strlen(ours)), PAR_OK, "its own file: %s", par_last_error());
    /* an unrecorded path keeps the plain atomic write (files inside a
     * temporary directory, ...) */
    PUT(g, "anything");
    cr_expect_eq(par_file_write_atomic(g, ours, strlen(ours)), PAR_OK, "%s", par_last_error());
    int left = 0;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp- >/dev/null", dir);
    left = system(cmd) == 0;
    cr_expect(!left, "a temporary is left in %s", dir);
    par_free(f);
    par_free(g);
    io_rmtree(dir);
}
