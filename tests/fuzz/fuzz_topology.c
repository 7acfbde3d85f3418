/* Fuzz target: the emulated network's topology JSON (comm/netmodel.h). */
#include "comm/netmodel.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_begin();
    par_netmodel m;
    if (par_netmodel_parse((const char *)data, size, "fuzz", &m) == PAR_OK)
        (void)par_netmodel_validate(&m);
    fuzz_end();
    return 0;
}
