/* tests/common/parity_exec.h - runs the parity binary from a Criterion test
 * (tests/cli): finds BUILD/parity next to the test binary and execs it with
 * its output into a log file. */
#ifndef PAR_TESTS_PARITY_EXEC_H
#define PAR_TESTS_PARITY_EXEC_H

#include <criterion/criterion.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* BUILD/tests/cli/test_cli_X -> BUILD/parity */
static inline void parity_bin(char *buf, size_t n)
{
    char self[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert(k > 0, "readlink /proc/self/exe");
    self[k] = 0;
    for (int i = 0; i < 3; i++) {
        char *s = strrchr(self, '/');
        cr_assert(s);
        *s = 0;
    }
    int len = snprintf(buf, n, "%s/parity", self);
    cr_assert(len > 0 && (size_t)len < n, "path too long");
    cr_assert(access(buf, X_OK) == 0, "no parity binary at %s", buf);
}

/* Runs `parity A... B...` (two NULL-terminated lists, either may be NULL)
 * with stdout and stderr into log; the exit status. */
static inline int parity_exec(const char *log, const char *const *a, const char *const *b)
{
    char bin[PATH_MAX];
    parity_bin(bin, sizeof bin);
    const char *argv[64] = {bin};
    int n = 1;
    for (int i = 0; a && a[i] && n < 62; i++)
        argv[n++] = a[i];
    for (int i = 0; b && b[i] && n < 62; i++)
        argv[n++] = b[i];
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork failed");
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(127);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    cr_assert(waitpid(pid, &st, 0) == pid);
    cr_assert(WIFEXITED(st), "parity did not exit normally");
    return WEXITSTATUS(st);
}

#endif
