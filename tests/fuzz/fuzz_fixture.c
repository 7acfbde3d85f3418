/* Fuzz target: a packing fixture JSON (model/data.h par_fixture_load) and the
 * plan it makes for the v4-tiny batch. */
#include "fuzz.h"
#include "model/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_begin();
    fuzz_put("fixture.json", data, size);
    char path[512];
    snprintf(path, sizeof path, "%s/fixture.json", fuzz_dir());
    par_fixture fx;
    if (par_fixture_load(&fx, path) == PAR_OK) {
        par_pack_plan plan;
        if (par_fixture_plan(&fx, 8, fx.seq_length, &plan) == PAR_OK)
            par_pack_plan_free(&plan);
        par_fixture_free(&fx);
    }
    fuzz_end();
    return 0;
}
