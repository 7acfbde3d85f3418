/* model/layout_record.c - a parallel layout as JSON: the one writer and its
 * reader (see model/layout_record.h). */
#include "model/layout_record.h"

#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "core/json.h"

/* The integer fields: their key, the short key of checkpoints written
 * before the one writer, where they live in a record. */
typedef struct {
    const char *key, *old;
    size_t off;
} int_key;

#define F(key, old, m) {key, old, offsetof(par_layout_record, m)}
static const int_key sizes[] = {
    F("world_size", "world_size", world),
    F("tensor_model_parallel_size", "tp", tp),
    F("pipeline_model_parallel_size", "pp", pp),
    F("virtual_pipeline_model_parallel_size", "vpp", vpp),
    F("context_parallel_size", "cp", cp),
    F("expert_model_parallel_size", "ep", ep),
    F("expert_tensor_parallel_size", "etp", etp),
};
static const int_key dp_sizes[] = {
    F("data_parallel_size", "da", da),
    F("expert_data_parallel_size", "de", de),
};
static const int_key batches[] = {
    F("micro_batch_size", "micro_batch", micro_batch),
    F("global_batch_size", "global_batch", global_batch),
};
#undef F
#define N_OF(a) (sizeof a / sizeof a[0])

static int64_t *field(par_layout_record *r, const int_key *k) { return (int64_t *)((char *)r + k->off); }
static int64_t value(const par_layout_record *r, const int_key *k)
{
    return *(const int64_t *)((const char *)r + k->off);
}

static int add_ints(cJSON *j, const par_layout_record *r, const int_key *k, size_t n)
{
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok = ok && cJSON_AddNumberToObject(j, k[i].key, (double)value(r, &k[i]));
    return ok;
}

/* backend, blas_core, host: the machine that produced a golden set. */
static int add_machine(cJSON *j, const par_layout_record *r)
{
    char host[256] = "unknown";
    if (gethostname(host, sizeof host - 1) != 0)
        strcpy(host, "unknown");
    host[sizeof host - 1] = 0;
    return cJSON_AddStringToObject(j, "backend", r->backend) &&
           cJSON_AddStringToObject(j, "blas_core", r->blas_core ? r->blas_core : "unknown") &&
           cJSON_AddStringToObject(j, "host", host);
}

cJSON *par_layout_record_json(const par_layout_record *r)
{
    cJSON *j = cJSON_CreateObject();
    int ok = j && add_ints(j, r, sizes, N_OF(sizes));
    if (ok && r->da > 0)
        ok = add_ints(j, r, dp_sizes, N_OF(dp_sizes));
    ok = ok && add_ints(j, r, batches, N_OF(batches)) &&
         cJSON_AddBoolToObject(j, "use_distributed_optimizer", r->distributed_optimizer != 0);
    if (ok && r->schedule)
        ok = cJSON_AddStringToObject(j, "pipeline_schedule", r->schedule) != NULL;
    if (ok && r->pp_layout && r->pp_layout[0])
        ok = cJSON_AddStringToObject(j, "pipeline_model_parallel_layout", r->pp_layout) != NULL;
    if (ok && r->backend)
        ok = add_machine(j, r);
    if (ok && r->sequence_parallel)
        ok = cJSON_AddBoolToObject(j, "sequence_parallel", 1) != NULL;
    if (!ok) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* o's member under key, else under old (NULL: neither). */
static const cJSON *member(const cJSON *o, const char *key, const char *old)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, key);
    return m ? m : cJSON_GetObjectItemCaseSensitive(o, old);
}

static par_status read_ints(const cJSON *o, const char *what, const int_key *k, size_t n, par_layout_record *r)
{
    for (size_t i = 0; i < n; i++) {
        const char *key = cJSON_GetObjectItemCaseSensitive(o, k[i].key) ? k[i].key : k[i].old;
        if (!par_json_int(o, key, field(r, &k[i])))
            return par_err(PAR_EFORMAT, "%s: layout.%s: missing or not an integer", what, k[i].key);
    }
    return PAR_OK;
}

/* A string member under key or old: "" when absent; *ok 0 when present but
 * not a string. */
static const char *read_str(const cJSON *o, const char *key, const char *old, int *ok)
{
    const cJSON *m = member(o, key, old);
    if (!m)
        return "";
    if (!cJSON_IsString(m))
        *ok = 0;
    return cJSON_IsString(m) ? m->valuestring : "";
}

par_status par_layout_record_read(const cJSON *o, const char *what, par_layout_record *r)
{
    par_layout_record v;
    memset(&v, 0, sizeof v);
    par_status st;
    if ((st = read_ints(o, what, sizes, N_OF(sizes), &v)) || (st = read_ints(o, what, dp_sizes, N_OF(dp_sizes), &v)) ||
        (st = read_ints(o, what, batches, N_OF(batches), &v)))
        return st;
    const cJSON *dopt = member(o, "use_distributed_optimizer", "distributed_optimizer");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(o, "sequence_parallel");
    int ok = cJSON_IsBool(dopt) && (!sp || cJSON_IsBool(sp));
    v.schedule = read_str(o, "pipeline_schedule", "schedule", &ok);
    v.pp_layout = read_str(o, "pipeline_model_parallel_layout", "pp_layout", &ok);
    if (!ok)
        return par_err(PAR_EFORMAT, "%s: layout: needs \"use_distributed_optimizer\" (bool); \"sequence_parallel\" "
                       "is a bool, \"pipeline_schedule\" and \"pipeline_model_parallel_layout\" strings", what);
    v.distributed_optimizer = cJSON_IsTrue(dopt);
    v.sequence_parallel = cJSON_IsTrue(sp);
    *r = v;
    return PAR_OK;
}
