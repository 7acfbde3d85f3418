/* comm/topology.c - host topology and rank binding through hwloc. */
#include "comm/topology.h"

#include <pthread.h>
#include <unistd.h>

#include <hwloc.h>

int par_topo_core_of(int rank, int nranks, int ncores)
{
    if (rank < 0 || nranks < 1 || rank >= nranks || ncores < 1)
        return -1;
    if (nranks <= ncores)
        return (int)((long long)rank * ncores / nranks);
    return rank % ncores;
}

/* Consecutive ranks on one core are printed as one range. */
static void print_binding(FILE *f, int nranks, int ncores, const int *pu_of_core)
{
    fprintf(f, "binding of %d rank%s of one process (--bind):\n", nranks, nranks == 1 ? "" : "s");
    int shown = 0;
    for (int r = 0; r < nranks;) {
        int core = par_topo_core_of(r, nranks, ncores), e = r;
        while (e + 1 < nranks && par_topo_core_of(e + 1, nranks, ncores) == core)
            e++;
        if (shown == 64) {
            fprintf(f, "  ... (ranks %d-%d follow the same rule)\n", r, nranks - 1);
            break;
        }
        char lab[32];
        if (e > r)
            snprintf(lab, sizeof lab, "ranks %d-%d", r, e);
        else
            snprintf(lab, sizeof lab, "rank %d", r);
        if (pu_of_core)
            fprintf(f, "  %-16s -> core %d (first PU os index %d)\n", lab, core, pu_of_core[core]);
        else
            fprintf(f, "  %-16s -> core %d\n", lab, core);
        shown++;
        r = e + 1;
    }
    if (nranks > ncores)
        fprintf(f, "  (%d ranks share %d cores: round-robin)\n", nranks, ncores);
}

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static hwloc_topology_t topo;
static int topo_ok;
static pthread_once_t topo_once = PTHREAD_ONCE_INIT;

static void topo_load(void)
{
    if (hwloc_topology_init(&topo) != 0)
        return;
    if (hwloc_topology_load(topo) != 0) {
        hwloc_topology_destroy(topo);
        return;
    }
    topo_ok = 1;
}

static int loaded(void)
{
    pthread_once(&topo_once, topo_load);
    return topo_ok;
}

int par_topo_ncores(void)
{
    if (!loaded())
        return online_cpus();
    int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    return n > 0 ? n : online_cpus();
}

static int count(hwloc_obj_type_t t)
{
    int n = hwloc_get_nbobjs_by_type(topo, t);
    return n > 0 ? n : 0;
}

par_status par_topo_print(FILE *f, int nranks)
{
    if (!loaded())
        return par_err(PAR_EIO, "topo: hwloc could not load this host's topology");
    int npk = count(HWLOC_OBJ_PACKAGE), nnuma = count(HWLOC_OBJ_NUMANODE);
    int ncore = par_topo_ncores(), npu = count(HWLOC_OBJ_PU);
    hwloc_obj_t root = hwloc_get_root_obj(topo);
    const char *model = hwloc_obj_get_info_by_name(root, "CPUModel");
    if (!model && npk > 0)
        model = hwloc_obj_get_info_by_name(hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0),
                                           "CPUModel");
    fprintf(f, "host (hwloc %s): %d package%s, %d NUMA node%s, %d core%s, %d PU%s%s%s\n",
            HWLOC_VERSION, npk, npk == 1 ? "" : "s", nnuma, nnuma == 1 ? "" : "s", ncore,
            ncore == 1 ? "" : "s", npu, npu == 1 ? "" : "s", model ? ", " : "",
            model ? model : "");
    for (int i = 0; i < npk; i++) {
        hwloc_obj_t pk = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, (unsigned)i);
        int c0 = -1, c1 = -1;
        for (int c = 0; c < ncore; c++) {
            hwloc_obj_t co = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, (unsigned)c);
            if (co && hwloc_obj_is_in_subtree(topo, co, pk)) {
                if (c0 < 0)
                    c0 = c;
                c1 = c;
            }
        }
        char set[256];
        hwloc_bitmap_list_snprintf(set, sizeof set, pk->cpuset);
        fprintf(f, "  package %d: cores %d-%d, PUs (os) %s\n", i, c0, c1, set);
    }
    for (int i = 0; i < nnuma; i++) {
        hwloc_obj_t nu = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
        char set[256];
        hwloc_bitmap_list_snprintf(set, sizeof set, nu->cpuset);
        fprintf(f, "  NUMA node %d: %.1f GiB, PUs (os) %s\n", i,
                (double)nu->attr->numanode.local_memory / (1024.0 * 1024 * 1024), set);
    }
    for (int d = 1; d <= 3; d++) {
        int n = 0;
        hwloc_obj_type_t t = d == 1 ? HWLOC_OBJ_L1CACHE : d == 2 ? HWLOC_OBJ_L2CACHE
                                                               : HWLOC_OBJ_L3CACHE;
        n = count(t);
        if (n > 0) {
            hwloc_obj_t o = hwloc_get_obj_by_type(topo, t, 0);
            fprintf(f, "  L%d: %d x %llu KiB\n", d, n,
                    (unsigned long long)(o->attr->cache.size / 1024));
        }
    }
    int pu_of_core[4096];
    int nc = ncore < 4096 ? ncore : 4096;
    for (int c = 0; c < nc; c++) {
        hwloc_obj_t co = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, (unsigned)c);
        pu_of_core[c] = co ? hwloc_bitmap_first(co->cpuset) : -1;
    }
    print_binding(f, nranks, nc, pu_of_core);
    return PAR_OK;
}

par_status par_topo_bind_thread(int rank, int nranks)
{
    if (!loaded())
        return par_err(PAR_EIO, "bind: hwloc could not load this host's topology");
    int ncore = par_topo_ncores();
    int core = par_topo_core_of(rank, nranks, ncore);
    if (core < 0)
        return par_err(PAR_EINVAL, "bind: rank %d of %d ranks", rank, nranks);
    hwloc_obj_t co = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, (unsigned)core);
    if (!co)
        return par_err(PAR_EINTERNAL, "bind: hwloc has no core %d of %d", core, ncore);
    if (hwloc_set_cpubind(topo, co->cpuset, HWLOC_CPUBIND_THREAD) != 0)
        return par_err(PAR_EIO, "bind: rank %d of %d to core %d failed", rank, nranks, core);
    return PAR_OK;
}
