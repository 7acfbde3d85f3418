/* cli/matrix_mpi.c - the matrix's MPI layout runner: one `mpiexec parity
 * run` job per layout run (see cli/matrix_mpi.h). */
#include "cli/matrix_mpi.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/json.h"
#include "core/status.h"
#include "kernels/recipe.h"

#define MAX_ARGS 72
#define ARG_CAP 1100

/* The argument vector of one job. */
typedef struct {
    char a[MAX_ARGS][ARG_CAP];
    char *argv[MAX_ARGS + 1];
    int n;
} argvec;

static void arg(argvec *v, const char *s)
{
    if (v->n < MAX_ARGS)
        snprintf(v->a[v->n++], ARG_CAP, "%s", s);
}

static void arg_pair(argvec *v, const char *flag, const char *value)
{
    char f[80];
    snprintf(f, sizeof f, "--%s", flag);
    arg(v, f);
    if (value)
        arg(v, value);
}

/* par_cell_layout_args's callback: every flag but --world-size (given). */
static void add_flag(const char *flag, const char *value, void *ud)
{
    if (strcmp(flag, "world-size"))
        arg_pair(ud, flag, value);
}

static void arg_int(argvec *v, const char *flag, long long x)
{
    char b[32];
    snprintf(b, sizeof b, "%lld", x);
    arg_pair(v, flag, b);
}

static void build_argv(const par_layout_job *job, const par_mpi_runner *r, int64_t procs, const char *summary,
                       argvec *v)
{
    char np[32];
    snprintf(np, sizeof np, "%lld", (long long)procs);
    v->n = 0;
    arg(v, r->mpiexec ? r->mpiexec : "mpiexec");
    arg(v, "-n");
    arg(v, np);
    arg(v, r->self_exe);
    arg(v, "run");
    arg_pair(v, "preset", job->preset);
    arg_pair(v, "backend", "mpi");
    arg_int(v, "ranks-per-process", (long long)(job->world / procs));
    arg_int(v, "world-size", (long long)job->world);
    arg_int(v, "steps", (long long)job->steps);
    arg_int(v, "seed", (long long)job->seed);
    if (job->fixture)
        arg_pair(v, "fixture", job->fixture); /* the directory through PARITY_FIXTURES_DIR */
    if (job->data_path)
        arg_pair(v, "data", job->data_path);
    if (job->precision == 32)
        arg_pair(v, "precision", "f32");
    if (job->cfg && job->cfg->bitwise) /* the mode and the casts are the cell's, not config keys */
        arg(v, "--bitwise");
    if (job->cfg && job->cfg->recipe)
        arg_pair(v, "recipe", par_recipe_name((par_recipe)job->cfg->recipe));
    for (int i = 0; i < job->n_sets; i++)
        arg_pair(v, "set", job->sets[i]);
    par_cell_layout_args(job->layout, add_flag, v);
    arg_pair(v, "topology", "reference");
    arg(v, "--quiet");
    arg_pair(v, "summary", summary);
    if (job->dump_dir)
        arg_pair(v, "dump", job->dump_dir);
    if (job->save_dir)
        arg_pair(v, "save", job->save_dir);
    if (job->load_dir)
        arg_pair(v, "load", job->load_dir);
    for (int i = 0; i < v->n; i++)
        v->argv[i] = v->a[i];
    v->argv[v->n] = NULL;
}

/* The last lines of a log, flattened into one line (a failing run's reason). */
static void log_tail(const char *log, char *buf, size_t n)
{
    buf[0] = 0;
    FILE *f = fopen(log, "r");
    if (!f)
        return;
    char lines[3][400] = {{0}}, line[400];
    int k = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0])
            snprintf(lines[k++ % 3], sizeof lines[0], "%s", line);
    }
    fclose(f);
    for (int i = k > 3 ? k - 3 : 0; i < k; i++) {
        size_t o = strlen(buf);
        snprintf(buf + o, n - o, "%s%s", o ? " / " : "", lines[i % 3]);
    }
}

/* Runs argv with stdout and stderr into log; the wait status. */
static par_status spawn(char *const *argv, const char *log, const char *fixtures_dir, int *status)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return par_err(PAR_EIO, "matrix: fork for %s: %s", argv[0], strerror(errno));
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        setenv("PARITY_FIXTURES_DIR", fixtures_dir, 1);
        execvp(argv[0], argv);
        fprintf(stderr, "matrix: cannot start %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
    return PAR_OK;
}

par_status par_mpi_run_layout(const par_layout_job *job, void *ud, cJSON **summary)
{
    par_mpi_runner r = *(const par_mpi_runner *)ud;
    char self[1024];
    if (!r.self_exe) {
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        self[k > 0 ? k : 0] = 0;
        r.self_exe = self;
    }
    int64_t p = r.mpi_procs > 0 ? r.mpi_procs : 8;
    if (p > job->world)
        p = job->world;
    while (p > 1 && job->world % p)
        p--;
    char log[1100], sum[1100];
    snprintf(log, sizeof log, "%s/%s.log", job->work_dir, job->tag);
    snprintf(sum, sizeof sum, "%s/%s-summary.json", job->work_dir, job->tag);
    argvec *v = par_malloc(sizeof *v, PAR_TAG_MISC);
    if (!v)
        return par_err(PAR_ENOMEM, "matrix: out of memory");
    build_argv(job, &r, p, sum, v);
    int st = 0;
    par_status s = spawn(v->argv, log, job->fixtures_dir, &st);
    if (!s && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
        char tail[600];
        log_tail(log, tail, sizeof tail);
        s = par_err(PAR_EIO, "matrix: `%s -n %lld parity run --backend mpi` (world %lld) %s %d (log %s): %s",
                    v->argv[0], (long long)p, (long long)job->world, WIFEXITED(st) ? "exited" : "killed by signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), log, tail);
    }
    par_free(v);
    return s ? s : par_json_read_file(sum, summary);
}
