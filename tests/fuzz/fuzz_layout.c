/* Fuzz target: parallel layouts (parallel/layout/layout.h, plan.h): byte 0 picks the
 * preset, bytes 1..6 the sizes PP, VPP, CP, EP, micro-batch, world, byte 7
 * the schedule; the rest is the --pipeline-model-parallel-layout string. */
#include "fuzz.h"
#include "model/config.h"
#include "parallel/layout/layout.h"
#include "parallel/plan/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_begin();
    static const char *const presets[] = {"v4-tiny", "v4-mini", "v4-pro", "v4-flash"};
    const char *const *sched = par_layout_schedule_names();
    int nsched = 0;
    while (sched[nsched])
        nsched++;
    uint8_t h[8] = {0};
    memcpy(h, data, size < 8 ? size : 8);
    par_config cfg;
    par_config_preset(&cfg, presets[h[0] % 4]);
    par_layout l;
    par_layout_init(&l);
    l.pp = h[1] % 17;
    l.vpp = h[2] % 5;
    l.cp = 1 + h[3] % 8;
    l.ep = h[4] % 2 ? 1 << (h[4] % 9) : 1;
    l.micro_batch = h[5] % 9;
    l.world = h[6] % 3 ? 0 : h[6];
    char str[PAR_LAYOUT_STR_MAX + 64];
    size_t n = size > 8 ? size - 8 : 0;
    if (n >= sizeof str)
        n = sizeof str - 1;
    memcpy(str, data + (size > 8 ? 8 : size), n);
    str[n] = '\0';
    if (par_layout_set_pp_layout(&l, n ? str : NULL) == PAR_OK &&
        par_layout_set_schedule(&l, h[7] % 2 ? sched[h[7] % nsched] : NULL) == PAR_OK)
        (void)par_plan_resolve(&l, &cfg);
    fuzz_end();
    return 0;
}
