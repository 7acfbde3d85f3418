/* cli/fingerprint.c - the configuration of a run as "key=value" lines. */
#include "cli/fingerprint.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/fileio.h"
#include "core/sha256.h"
#include "model/config.h"
#include "parallel/ckpt/ckpt.h"
#include "parity_config.h"

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} text;

static void add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = 1;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t nc = 2 * t->cap + (size_t)n + 1;
        char *b = realloc(t->buf, nc);
        if (!b) {
            t->oom = 1;
            return;
        }
        t->buf = b;
        t->cap = nc;
    }
}

/* sha256 of a file, or a note why there is none. */
static void add_file_hash(text *t, const char *key, const char *path)
{
    char hex[PAR_SHA256_HEX];
    if (par_sha256_file(path, hex) == PAR_OK)
        add(t, "%s=%s\n", key, hex);
    else
        add(t, "%s=(unreadable)\n", key);
}

static void add_config(text *t, const par_config *cfg)
{
    static const char *const sec[] = {"model", "batch", "train"};
    for (int i = 0; par_config_key_name(i); i++) {
        char v[2048];
        if (par_config_get(cfg, par_config_key_name(i), v, sizeof v) != PAR_OK)
            snprintf(v, sizeof v, "(too long)");
        add(t, "%s.%s=%s\n", sec[par_config_key_section(i)], par_config_key_name(i), v);
    }
}

static void add_layout(text *t, const par_layout *l)
{
    add(t, "layout.sizes=tp %lld pp %lld vpp %lld cp %lld ep %lld etp %lld\n", (long long)l->tp, (long long)l->pp,
        (long long)l->vpp, (long long)l->cp, (long long)l->ep, (long long)l->etp);
    add(t, "layout.world=%lld\nlayout.micro_batch=%lld\nlayout.global_batch=%lld\n", (long long)l->world,
        (long long)l->micro_batch, (long long)l->global_batch);
    add(t, "layout.distributed_optimizer=%d\n", l->distributed_optimizer);
    add(t, "layout.pp_layout=%s\nlayout.schedule=%s\n", l->pp_layout[0] ? l->pp_layout : "(none)",
        l->schedule[0] ? l->schedule : "(default)");
}

char *par_run_fingerprint(const par_run_opts *o, const char *moe_dispatch, const par_net_args *na)
{
    text t = {0};
    add(&t, "build.version=%s\nbuild.compiler=%s\nbuild.mpi=%d\n", PARITY_VERSION, __VERSION__, HAVE_MPI);
    add(&t, "run.precision=f%d\nrun.steps=%lld\nrun.seed=%llu\nrun.backend=%s\nrun.moe_dispatch=%s\n", o->precision,
        (long long)o->steps, (unsigned long long)o->seed, par_backend_name(o->backend), moe_dispatch);
    add(&t, "run.preset=%s\n", o->cfg.preset);
    add_config(&t, &o->cfg);
    add_layout(&t, &o->layout);
    if (o->data_path)
        add_file_hash(&t, "data.file_sha256", o->data_path);
    else
        add(&t, "data.source=%s%s\n", o->fixture ? "fixture " : "generator", o->fixture ? o->fixture : "");
    add(&t, "ckpt.save=%d\nckpt.save_interval=%lld\n", o->save_dir != NULL, (long long)o->save_interval);
    if (o->load) {
        char *meta = par_path_join(par_ckpt_dir(o->load), PAR_CKPT_META);
        if (meta)
            add_file_hash(&t, "ckpt.load_metadata_sha256", meta);
        par_free(meta);
    } else {
        add(&t, "ckpt.load=(none)\n");
    }
    add(&t, "net.topology=%s\nnet.gpus_per_node=%lld\nnet.nvlink_gbps=%.17g\nnet.ib_gbps=%.17g\n",
        na->topology ? na->topology : "(none)", (long long)na->gpus_per_node, na->nvlink_gbps, na->ib_gbps);
    if (t.oom) {
        free(t.buf);
        par_err(PAR_ENOMEM, "run: out of memory for the configuration fingerprint");
        return NULL;
    }
    return t.buf;
}
