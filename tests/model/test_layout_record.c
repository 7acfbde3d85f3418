/* tests/model/test_layout_record.c - the one layout JSON writer and its
 * reader (model/layout_record.h): the keys in their order (a golden
 * manifest's bytes as before the one writer), the optional keys, the
 * reader of the new names and of the short names of older checkpoints. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "model/layout_record.h"

static char *print(const par_layout_record *r)
{
    cJSON *j = par_layout_record_json(r);
    cr_assert_not_null(j);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

/* The serial reference's record, up to "host" (the machine's name). */
Test(layout_record, serial_keys_in_order)
{
    par_layout_record r;
    par_layout_record_serial(&r, 8, "Haswell");
    char *s = print(&r);
    const char *want = "{\"world_size\":1,\"tensor_model_parallel_size\":1,\"pipeline_model_parallel_size\":1,"
                       "\"virtual_pipeline_model_parallel_size\":1,\"context_parallel_size\":1,"
                       "\"expert_model_parallel_size\":1,\"expert_tensor_parallel_size\":1,\"micro_batch_size\":8,"
                       "\"global_batch_size\":8,\"use_distributed_optimizer\":false,\"pipeline_schedule\":\"none\","
                       "\"backend\":\"self\",\"blas_core\":\"Haswell\",\"host\":\"";
    cr_expect(strncmp(s, want, strlen(want)) == 0, "%s", s);
    free(s);
}

/* A parallel run's: da, de, the pipeline layout, sequence parallelism last
 * (after the machine, where the driver used to append it). */
Test(layout_record, parallel_keys_in_order)
{
    par_layout_record r = {.world = 8, .tp = 2, .pp = 2, .vpp = 1, .cp = 1, .ep = 2, .etp = 1, .da = 2, .de = 2,
                           .micro_batch = 1, .global_batch = 8, .distributed_optimizer = 1, .sequence_parallel = 1,
                           .schedule = "1f1b", .pp_layout = "Et*2|tmL"};
    char *s = print(&r);
    cr_expect_str_eq(s, "{\"world_size\":8,\"tensor_model_parallel_size\":2,\"pipeline_model_parallel_size\":2,"
                        "\"virtual_pipeline_model_parallel_size\":1,\"context_parallel_size\":1,"
                        "\"expert_model_parallel_size\":2,\"expert_tensor_parallel_size\":1,\"data_parallel_size\":2,"
                        "\"expert_data_parallel_size\":2,\"micro_batch_size\":1,\"global_batch_size\":8,"
                        "\"use_distributed_optimizer\":true,\"pipeline_schedule\":\"1f1b\","
                        "\"pipeline_model_parallel_layout\":\"Et*2|tmL\",\"sequence_parallel\":true}");
    free(s);
    r.schedule = NULL, r.pp_layout = "", r.sequence_parallel = 0;
    s = print(&r);
    cr_expect(!strstr(s, "pipeline_schedule") && !strstr(s, "pipeline_model_parallel_layout") &&
                  !strstr(s, "sequence_parallel") && !strstr(s, "host"), "%s", s);
    free(s);
}

static cJSON *parse(const char *text)
{
    cJSON *j = cJSON_Parse(text);
    cr_assert_not_null(j);
    return j;
}

Test(layout_record, reads_what_it_writes)
{
    par_layout_record r = {.world = 8, .tp = 2, .pp = 2, .vpp = 1, .cp = 1, .ep = 2, .etp = 1, .da = 2, .de = 2,
                           .micro_batch = 1, .global_batch = 8, .distributed_optimizer = 1, .sequence_parallel = 1,
                           .schedule = "1f1b", .pp_layout = "Et*2|tmL"};
    char *s = print(&r);
    cJSON *j = parse(s);
    par_layout_record b;
    cr_assert_eq(par_layout_record_read(j, "t", &b), PAR_OK, "%s", par_last_error());
    cr_expect(b.world == 8 && b.tp == 2 && b.pp == 2 && b.vpp == 1 && b.cp == 1 && b.ep == 2 && b.etp == 1);
    cr_expect(b.da == 2 && b.de == 2 && b.micro_batch == 1 && b.global_batch == 8);
    cr_expect(b.distributed_optimizer && b.sequence_parallel);
    cr_expect_str_eq(b.schedule, "1f1b");
    cr_expect_str_eq(b.pp_layout, "Et*2|tmL");
    cJSON_Delete(j);
    free(s);
}

/* The layout object of a checkpoint written before the one writer. */
Test(layout_record, reads_the_old_checkpoint_keys)
{
    cJSON *j = parse("{\"world_size\": 4, \"tp\": 1, \"pp\": 2, \"vpp\": 1, \"cp\": 1, \"ep\": 2, \"etp\": 1, "
                     "\"da\": 2, \"de\": 1, \"micro_batch\": 1, \"global_batch\": 8, \"distributed_optimizer\": true, "
                     "\"schedule\": \"1f1b\", \"pp_layout\": \"Et*2|tmL\"}");
    par_layout_record b;
    cr_assert_eq(par_layout_record_read(j, "t", &b), PAR_OK, "%s", par_last_error());
    cr_expect(b.world == 4 && b.tp == 1 && b.pp == 2 && b.ep == 2 && b.da == 2 && b.de == 1);
    cr_expect(b.global_batch == 8 && b.distributed_optimizer && !b.sequence_parallel);
    cr_expect_str_eq(b.schedule, "1f1b");
    cr_expect_str_eq(b.pp_layout, "Et*2|tmL");
    cJSON_Delete(j);
}

Test(layout_record, a_missing_key_is_named)
{
    par_err_set_quiet(1);
    cJSON *j = parse("{\"world_size\": 4, \"tp\": 1, \"pp\": 2, \"vpp\": 1, \"cp\": 1, \"ep\": 2, \"etp\": 1, "
                     "\"da\": 2, \"micro_batch\": 1, \"global_batch\": 8, \"distributed_optimizer\": true}");
    par_layout_record b;
    cr_expect_eq(par_layout_record_read(j, "m.json", &b), PAR_EFORMAT);
    cr_expect(strstr(par_last_error(), "m.json: layout.expert_data_parallel_size: missing"), "%s", par_last_error());
    cJSON_Delete(j);
    j = parse("{\"world_size\": 4, \"tp\": 1, \"pp\": 2, \"vpp\": 1, \"cp\": 1, \"ep\": 2, \"etp\": 1, \"da\": 2, "
              "\"de\": 1, \"micro_batch\": 1, \"global_batch\": 8, \"distributed_optimizer\": 1}");
    cr_expect_eq(par_layout_record_read(j, "m.json", &b), PAR_EFORMAT, "the optimizer flag is a bool");
    cJSON_Delete(j);
    par_err_set_quiet(0);
}
