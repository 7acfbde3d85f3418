/* matrix/cells.c - the built-in cell catalogue (one static table), the
 * checks of a cell row, and the strict reader of a user's cells file (see
 * matrix/cells.h, docs/matrix.md). */
#include "matrix/cells.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/json.h"
#include "parallel/schedule/schedule.h"

/* ---- names ------------------------------------------------------------ */

static const char *const tier_names[PAR_CELL_TIER_COUNT] = {"quick", "default", "full", "scale"};
static const char *const kind_names[PAR_KIND_COUNT] = {"golden", "repeat", "serial", "data-file",
                                                        "layout", "resume", "ckpt-reshard"};
static const char *const files_names[PAR_FILES_COUNT] = {"all", "steps-and-init", "updated-params"};

const char *par_cell_tier_name(par_cell_tier t) { return (unsigned)t < PAR_CELL_TIER_COUNT ? tier_names[t] : "?"; }
const char *par_cell_kind_name(par_cell_kind k) { return (unsigned)k < PAR_KIND_COUNT ? kind_names[k] : "?"; }

static int name_index(const char *const *names, int n, const char *s)
{
    for (int i = 0; s && i < n; i++)
        if (!strcmp(names[i], s))
            return i;
    return -1;
}

par_status par_cell_tier_parse(const char *s, par_cell_tier *out)
{
    int i = name_index(tier_names, PAR_CELL_TIER_COUNT, s);
    if (i < 0)
        return par_err(PAR_EINVAL, "tier '%s' is not one of quick, default, full, scale", s ? s : "(null)");
    *out = (par_cell_tier)i;
    return PAR_OK;
}

/* ---- the built-in catalogue ------------------------------------------- */

#define TINY "v4-tiny"
#define MINI "v4-mini"
#define Q PAR_CELL_TIER_QUICK
#define D PAR_CELL_TIER_DEFAULT
#define F PAR_CELL_TIER_FULL
#define X PAR_CELL_TIER_SCALE
#define LAYOUT PAR_KIND_LAYOUT
#define SEED(n) .seed = (n), .has_seed = 1

#define NOTE_CP "f64 policy: CE/aux partial sums and weight gradients of split rows add in rank order; routing, " \
                "loads and attn selections exactly equal"
#define NOTE_EP "f64 policy: experts' rows dispatched and combined by all-to-all in a fixed order; expert " \
                "gradients reduced over De in rank order; routing and loads exactly equal"
#define NOTE_DP "f64 policy: gradients reduced in rank order over DP (x CP) and EDP; optimizer replicated"
#define NOTE_ZERO "f64 policy: gradients reduced in rank order over DP (x CP) and EDP; optimizer state (opt.*) " \
                  "gathered from the ZeRO shards and compared after every step"
#define NOTE_PP "f64 policy: forward bitwise (whole rows per microbatch); weight gradients accumulate over " \
                "microbatches, embed/head over stages"
#define NOTE_PAIR "f64 policy: the first `split` steps from the first run, every later file from the run that " \
                  "loaded its checkpoint"
#define NOTE_CLIP "clip_grad 0.5 below the gradient norm (0.87-0.90 on this fixture): the clip scale is active " \
                  "every step, the global norm reduced across ranks; reference with the same clip"
#define NOTE_TP "f64 policy: every TP layer (attention heads split, vocab-parallel embedding / head / CE, " \
                "TP shared expert with EP 1); routing, selections exact"
#define NOTE_ETP "f64 policy: ETP 2 (moe_inter_dim split; rows all-gathered, outputs reduce-scattered over the " \
                 "ETP group of disjoint tokens, expert gradients summed over ETP); routing exactly equal"
#define NOTE_ETP_EP "f64 policy: ETP 2 inside EP 4 (EP-dispatched rows all-gathered over ETP, I/2 slices, outputs " \
                    "reduce-scattered; expert gradients summed over ETP, then EDP); routing exact"
#define NOTE_TPSP "f64 policy: TP 2 + SP: mHC, norms, router, routed experts on the rank's columns; gathered " \
                  "before, reduce-scattered after each TP layer; routing, selections exact"
#define NOTE_TPCOMP "f64 policy: TP composed with SP / CP / EP / ETP (router and dispatch on the rank's tokens); " \
                    "routing, selections exact"
#define NOTE_SCALE "acceptance cell (minutes): the serial golden of the same config, data and steps, f64 policy"

/* The layouts of the catalogue, by Megatron-LM's flag names. */
#define CP(n) {.world_size = (n), .context_parallel_size = (n)}
#define EP(w, n) {.world_size = (w), .expert_model_parallel_size = (n)}
#define DPZ(w, e, z) {.world_size = (w), .expert_model_parallel_size = (e), .use_distributed_optimizer = (z)}
#define TPL(tp, w) {.world_size = (w), .tensor_model_parallel_size = (tp)}
#define PPS(pp, sched, str) \
    {.world_size = (pp), .pipeline_model_parallel_size = (pp), .pipeline_schedule = sched, \
     .pipeline_model_parallel_layout = str}

static const par_cell_spec builtin[] = {
    /* ---- v4-tiny (--quick): every cell ---- */
    {.name = "serial-f64", .preset = TINY, .data = "*", .kind = PAR_KIND_GOLDEN, .tier = Q},
    {.name = "repeat-bitwise", .preset = TINY, .kind = PAR_KIND_REPEAT, .tier = Q,
     .note = "same layout, backend and precision run twice: bitwise (GOLDEN.md)"},
    {.name = "f32-vs-f64", .preset = TINY, .kind = PAR_KIND_SERIAL, .tier = Q, .precision = 32,
     .policy = PAR_POLICY_F32, .files = PAR_FILES_STEPS_AND_INIT,
     .note = "f32 values widened exactly to F64; GOLDEN.md's f32 policy on every step file and params.0 "
             "(docs/matrix.md)"},
    {.name = "f32-vs-f64-params", .preset = TINY, .kind = PAR_KIND_SERIAL, .tier = Q, .precision = 32,
     .policy = PAR_POLICY_F32, .files = PAR_FILES_UPDATED, .informational = 1,
     .note = "informational: parameters after AdamW/Muon updates under the f32 policy; AdamW amplifies "
             "near-zero gradients' rounding (docs/matrix.md)"},
    {.name = "cp2", .preset = TINY, .data = "*", .kind = LAYOUT, .tier = Q, .layout = CP(2), .note = NOTE_CP},
    {.name = "cp4", .preset = TINY, .data = "*", .kind = LAYOUT, .tier = Q, .layout = CP(4), .note = NOTE_CP},
    {.name = "ep2", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = EP(2, 2), .note = NOTE_EP},
    {.name = "ep4", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = EP(4, 4), .note = NOTE_EP},
    {.name = "ep8", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = EP(8, 8), .note = NOTE_EP},
    {.name = "ep4-de2", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = EP(8, 4), .note = NOTE_EP},
    {.name = "ep8-hier", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 8, .expert_model_parallel_size = 8, .moe_dispatch = "hierarchical",
                .gpus_per_node = 2},
     .note = "hierarchical dispatch over 4 nodes of 2 ranks (once per destination node over IB, then NVLink); "
             "f64 policy (bitwise the flat path's by construction)"},
    {.name = "dp2", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = DPZ(2, 0, 0), .note = NOTE_DP},
    {.name = "dp4", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = DPZ(4, 0, 0), .note = NOTE_DP},
    {.name = "dp2-zero1", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = DPZ(2, 0, 1), .note = NOTE_ZERO},
    {.name = "dp4-zero1", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = DPZ(4, 0, 1), .note = NOTE_ZERO},
    {.name = "ep4-zero1", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = DPZ(8, 4, 1), .note = NOTE_ZERO},
    {.name = "dp4-ep2-clip", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = DPZ(4, 2, 0),
     .sets = {"clip_grad=0.5"}, .note = NOTE_CLIP},
    {.name = "dp2-zero1-clip", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = DPZ(2, 0, 1),
     .sets = {"clip_grad=0.5"}, .note = NOTE_CLIP "; the norm from the ZeRO shards"},
    {.name = "cp2-ep2-zero1-f32", .preset = TINY, .kind = LAYOUT, .tier = Q, .precision = 32,
     .policy = PAR_POLICY_F32, .files = PAR_FILES_STEPS_AND_INIT,
     .layout = {.world_size = 4, .context_parallel_size = 2, .expert_model_parallel_size = 2,
                .use_distributed_optimizer = 1},
     .note = "f32 driver (CP, EP, De 2, ZeRO-1) against the f32 serial run, f32 policy on step.* and params.0; "
             "parameters after updates not gated (AdamW amplifies f32 rounding, docs/matrix.md)"},
    {.name = "pp2-gpipe", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = PPS(2, "gpipe", "Et*1|t*2mL"),
     .note = NOTE_PP},
    {.name = "pp2-1f1b", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = PPS(2, "1f1b", "Et*1|t*2mL"),
     .note = NOTE_PP},
    {.name = "pp2-interleaved", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = PPS(2, "interleaved", "E|t*1|t*1|t*1mL"), .note = NOTE_PP},
    {.name = "pp2-zbh1", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = PPS(2, "zb-h1", "Et*1|t*2mL"),
     .note = NOTE_PP},
    {.name = "pp2-dualpipe", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = PPS(2, "dualpipe", "Et*1|t*2mL"),
     .note = NOTE_PP},
    {.name = "pp2-dualpipev", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = PPS(2, "dualpipev", "E|t*1|t*1|t*1mL"), .note = NOTE_PP},
    {.name = "pp2-vpp3", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = PPS(2, "interleaved", "E|t*1|t*1|t*1|m|L"),
     .note = NOTE_PP "; VPP 3: the MTP block on rank 0, the head alone on rank 1"},
    {.name = "pp2-head-apart", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = PPS(2, "1f1b", "Et*3|mL"),
     .note = NOTE_PP "; every main block on stage 0, the MTP block and the head on stage 1"},
    {.name = "pp2-mbs2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 2, .pipeline_model_parallel_size = 2, .pipeline_schedule = "1f1b",
                .pipeline_model_parallel_layout = "Et*1|t*2mL", .micro_batch_size = 2},
     .note = NOTE_PP "; micro-batch-size 2 (4 microbatches of 2 rows)"},
    {.name = "pp2-ep2-zero1", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 8, .pipeline_model_parallel_size = 2, .expert_model_parallel_size = 2,
                .use_distributed_optimizer = 1, .pipeline_model_parallel_layout = "Et*1|t*2mL"},
     .note = NOTE_ZERO "; PP 2 x Da 4 x EP 2 (De 2) per stage"},
    {.name = "pp2-dualpipe-clip", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = PPS(2, "dualpipe", "Et*1|t*2mL"), .sets = {"clip_grad=0.5"},
     .note = NOTE_CLIP "; the norm over stages that hold parameter copies (DualPipe)"},
    {.name = "tp2", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = TPL(2, 2), .note = NOTE_TP},
    {.name = "tp4", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = TPL(4, 4),
     .sets = {"n_heads=4", "o_groups=4", "index_n_heads=4"}, .note = NOTE_TP "; heads widened to 4"},
    {.name = "tp2-zero1", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .use_distributed_optimizer = 1},
     .note = NOTE_TP "; Da 2, ZeRO-1"},
    {.name = "tp2-pp2-1f1b", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .pipeline_model_parallel_size = 2,
                .pipeline_schedule = "1f1b", .pipeline_model_parallel_layout = "Et*1|t*2mL"},
     .note = NOTE_TP "; PP 2"},
    {.name = "tp2-pp2-interleaved", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .pipeline_model_parallel_size = 2,
                .pipeline_schedule = "interleaved", .pipeline_model_parallel_layout = "E|t*1|t*1|t*1mL"},
     .note = NOTE_TP "; PP 2"},
    {.name = "etp2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 2, .expert_tensor_parallel_size = 2}, .note = NOTE_ETP "; Da 2"},
    {.name = "etp2-de2-zero1", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 4, .expert_tensor_parallel_size = 2, .use_distributed_optimizer = 1},
     .note = NOTE_ETP "; Da 4, De 2, ZeRO-1"},
    {.name = "etp2-pp2-1f1b", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 4, .expert_tensor_parallel_size = 2, .pipeline_model_parallel_size = 2,
                .pipeline_schedule = "1f1b", .pipeline_model_parallel_layout = "Et*1|t*2mL"},
     .note = NOTE_ETP "; PP 2"},
    {.name = "etp2-cp2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 2, .expert_tensor_parallel_size = 2, .context_parallel_size = 2},
     .note = NOTE_ETP "; the ETP group is the CP group"},
    {.name = "etp2-zero1-to-etp1", .preset = TINY, .kind = PAR_KIND_RESUME, .tier = Q,
     .layout = {.world_size = 4, .expert_tensor_parallel_size = 2, .use_distributed_optimizer = 1},
     .load_layout = {.world_size = 1}, .note = NOTE_PAIR " (ETP 2 x ZeRO-1 saved, loaded serially)"},
    /* ---- ETP inside EP (MoE parallel folding; issue 15, etp15) ---- */
    {.name = "etp2-ep4-de2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 16, .expert_tensor_parallel_size = 2, .expert_model_parallel_size = 4,
                .context_parallel_size = 2},
     .note = NOTE_ETP_EP "; CP 2 x Da 8 = ETP 2 x EP 4 x De 2"},
    {.name = "etp2-ep4-de2-zero1", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 16, .expert_tensor_parallel_size = 2, .expert_model_parallel_size = 4,
                .context_parallel_size = 2, .use_distributed_optimizer = 1},
     .note = NOTE_ETP_EP "; CP 2 x Da 8 = ETP 2 x EP 4 x De 2, ZeRO-1"},
    {.name = "etp2-ep4-zero1-to-ep2", .preset = TINY, .kind = PAR_KIND_RESUME, .tier = Q,
     .layout = {.world_size = 16, .expert_tensor_parallel_size = 2, .expert_model_parallel_size = 4,
                .context_parallel_size = 2, .use_distributed_optimizer = 1},
     .load_layout = {.world_size = 4, .expert_model_parallel_size = 2, .use_distributed_optimizer = 1},
     .note = NOTE_PAIR " (ETP 2 x EP 4 x CP 2 x ZeRO-1 saved, loaded under EP 2 x De 2 x ZeRO-1)"},
    {.name = "etp2-ep4-to-etp1", .preset = TINY, .kind = PAR_KIND_RESUME, .tier = Q,
     .layout = {.world_size = 16, .expert_tensor_parallel_size = 2, .expert_model_parallel_size = 4,
                .context_parallel_size = 2},
     .load_layout = {.world_size = 1}, .note = NOTE_PAIR " (ETP 2 x EP 4 x CP 2 saved, loaded serially)"},
    {.name = "tp2-ep4", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 8, .tensor_model_parallel_size = 2, .expert_model_parallel_size = 4},
     .note = NOTE_TP "; TP 2 x Da 4 = EP 4 x De 2 (each TP copy of a token dispatched, weight pass on tp 0's)"},
    {.name = "tp2-cp2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .context_parallel_size = 2},
     .note = NOTE_TP "; CP 2 on the TP shard (indexer chained over TP for the local queries)"},
    {.name = "tp2-cp2-ep4", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 8, .tensor_model_parallel_size = 2, .context_parallel_size = 2,
                .expert_model_parallel_size = 4},
     .note = NOTE_TP "; CP 2 on the TP shard; TP 2 x CP 2 x Da 2 = EP 4 x De 2"},
    {.name = "tp2-to-tp1", .preset = TINY, .kind = PAR_KIND_RESUME, .tier = Q, .layout = TPL(2, 2),
     .load_layout = {.world_size = 1}, .note = NOTE_PAIR " (saved under TP 2, loaded serially)"},
    {.name = "tp2-zero1-to-tp4", .preset = TINY, .kind = PAR_KIND_RESUME, .tier = Q,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .use_distributed_optimizer = 1},
     .load_layout = TPL(4, 4), .sets = {"n_heads=4", "o_groups=4", "index_n_heads=4"},
     .note = NOTE_PAIR " (TP 2 x DP 2 x ZeRO-1 saved, loaded under TP 4)"},
    /* -- issue 15, TP round 2: SP, the reshard chain; every TP layer is the default since round 3
     * (tp2-all and tp4-all were tp2 and tp4 with --tp-all-layers: the same cells now) -- */
    {.name = "tp2-all-zero1-pp2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 8, .tensor_model_parallel_size = 2, .pipeline_model_parallel_size = 2,
                .use_distributed_optimizer = 1, .pipeline_schedule = "1f1b",
                .pipeline_model_parallel_layout = "Et*1|t*2mL"},
     .note = NOTE_TP "; PP 2 (1F1B) x Da 2, ZeRO-1"},
    {.name = "tp2-sp", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 2, .tensor_model_parallel_size = 2, .sequence_parallel = 1}, .note = NOTE_TPSP},
    {.name = "tp2-sp-pp2-dp2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 8, .tensor_model_parallel_size = 2, .pipeline_model_parallel_size = 2,
                .sequence_parallel = 1, .use_distributed_optimizer = 1, .pipeline_schedule = "interleaved",
                .pipeline_model_parallel_layout = "E|t*1|t*1|t*1mL"},
     .note = NOTE_TPSP "; PP 2 interleaved (one row per microbatch: the layer's own SP) x Da 2, ZeRO-1"},
    /* -- issue 15, TP compositions (tpcomp15): SP x CP / EP / ETP, TP x ETP (x EP) -- */
    {.name = "tp2-sp-cp2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .context_parallel_size = 2, .sequence_parallel = 1},
     .note = NOTE_TPCOMP "; TP 2 + SP x CP 2 (the CP slice gathered over TP for the attention)"},
    {.name = "tp2-sp-ep4", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 8, .tensor_model_parallel_size = 2, .expert_model_parallel_size = 4,
                .sequence_parallel = 1},
     .note = NOTE_TPCOMP "; TP 2 + SP x Da 4 = EP 4 x De 2 (no TP copies dispatched)"},
    {.name = "tp2-sp-cp2-ep4", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 8, .tensor_model_parallel_size = 2, .context_parallel_size = 2,
                .expert_model_parallel_size = 4, .sequence_parallel = 1},
     .note = NOTE_TPCOMP "; TP 2 + SP x CP 2 x Da 2 = EP 4 x De 2"},
    {.name = "tp2-etp2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 2, .tensor_model_parallel_size = 2, .expert_tensor_parallel_size = 2},
     .note = NOTE_TPCOMP "; TP 2 = ETP 2 without SP (same tokens: slices' outputs all-reduced)"},
    {.name = "tp2-etp2-ep2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .expert_tensor_parallel_size = 2,
                .expert_model_parallel_size = 2},
     .note = NOTE_TPCOMP "; TP 2 x Da 2 = ETP 2 x EP 2 without SP"},
    {.name = "tp2-sp-etp2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .expert_tensor_parallel_size = 2,
                .sequence_parallel = 1},
     .note = NOTE_TPCOMP "; TP 2 + SP x Da 2 = ETP 2 x De 2 (rows gathered over ETP)"},
    {.name = "tp2-sp-etp2-ep2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .expert_tensor_parallel_size = 2,
                .expert_model_parallel_size = 2, .sequence_parallel = 1},
     .note = NOTE_TPCOMP "; TP 2 + SP x Da 2 = ETP 2 x EP 2"},
    /* -- issue 15, the TP shared expert under EP / ETP (shexp15): column / row parallel over TP
     * whatever EP and ETP are; the cells above with EP or ETP > 1 run it split too -- */
    {.name = "tp2-ep2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .expert_model_parallel_size = 2},
     .note = NOTE_TP "; TP 2 x Da 2 = EP 2 x De 2 (the shared expert TP-split inside the EP executor)"},
    {.name = "tp2-sp-cp2-etp2-ep2", .preset = TINY, .kind = LAYOUT, .tier = Q,
     .layout = {.world_size = 8, .tensor_model_parallel_size = 2, .context_parallel_size = 2,
                .expert_tensor_parallel_size = 2, .expert_model_parallel_size = 2, .sequence_parallel = 1},
     .note = NOTE_TPCOMP "; TP 2 + SP x CP 2 x Da 2 = ETP 2 x EP 2 x De 2 (the shared expert TP-split)"},
    /* issue 33 item 2: math branches no other golden takes (tools/coverage-math.py) */
    {.name = "ep2-swiglu-clamp", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = EP(2, 2),
     .sets = {"swiglu_limit=1"},
     .note = "f64 policy, as ep2; swiglu_limit 1: the SwiGLU clamp fires (at the preset's 10 no pre-activation "
             "reaches it), forward and backward, routed and shared experts"},
    {.name = "cp2-yarn-short", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = CP(2),
     .sets = {"original_seq_len=4"},
     .note = "f64 policy, as cp2; original_seq_len 4: YaRN's correction range below 0 and empty (low "
             "clamped to 0, low == high)"},
    {.name = "dp2-yarn-wide", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = DPZ(2, 0, 0),
     .sets = {"compress_rope_theta=100"},
     .note = "f64 policy, as dp2; compress_rope_theta 100: YaRN's correction range above rope_head_dim - 1 "
             "(high clamped)"},
    {.name = "ep2-swiglu-off", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = EP(2, 2),
     .sets = {"swiglu_limit=0"},
     .note = "f64 policy, as ep2; swiglu_limit 0: no clamp at all (the L > 0 test's other side, forward and "
             "backward, routed and shared experts)"},
    {.name = "pp2-no-mtp", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = PPS(2, "1f1b", "Et*1|t*2L"),
     .sets = {"n_mtp_layers=0", "compress_ratios=0,4,16"},
     .note = "f64 policy, as pp2-1f1b; n_mtp_layers 0: a model without the MTP block (no MTP loss term, its "
             "statistics and head absent), the head alone after layer 2"},
    /* issue 33: exact router ties and hash layers past the first stage (docs/matrix.md "Router ties") */
    {.name = "dp4-ep2-router-ties", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = DPZ(4, 2, 0),
     .sets = {"bias_update_rate=1e17"},
     .note = "f64 policy, routing exact; bias_update_rate 1e17: from step 1 gate.bias is 0 or +-1e17, s + bias "
             "rounds to the bias: every score-routed row an exact tie, the lower index wins (ties.K: "
             "router.*.ties)"},
    {.name = "pp2-hash-later", .preset = TINY, .kind = LAYOUT, .tier = Q, .layout = PPS(2, "1f1b", "Et*1|t*2mL"),
     .sets = {"n_hash_layers=2"},
     .note = "f64 policy, as pp2-1f1b; n_hash_layers 2: layer 1, a hash layer, on the second stage (its token ids "
             "sent with the microbatch), layer 2 and the MTP score-routed"},
    {.name = "tp2-to-tp1-to-tp4", .preset = TINY, .kind = PAR_KIND_RESUME, .tier = Q, .steps = 3, .split = 1,
     .layout = TPL(2, 2), .load_layout = {.world_size = 1}, .chain_layout = TPL(4, 4),
     .sets = {"n_heads=4", "o_groups=4", "index_n_heads=4"},
     .note = NOTE_PAIR " (a chain: step 0 under TP 2, step 1 serially, step 2 under TP 4, heads widened)"},
    {.name = "resume", .preset = TINY, .kind = PAR_KIND_RESUME, .tier = Q, .layout = DPZ(4, 2, 1),
     .load_layout = DPZ(4, 2, 1), .note = NOTE_PAIR " (the same layout)"},
    {.name = "reshard", .preset = TINY, .kind = PAR_KIND_RESUME, .tier = Q, .layout = DPZ(4, 2, 1),
     .load_layout = {.world_size = 4, .context_parallel_size = 2},
     .note = NOTE_PAIR " (resharded on load to another layout)"},
    {.name = "data-file", .preset = TINY, .kind = PAR_KIND_DATA_FILE, .tier = Q,
     .note = "the reference's input.* written to a safetensors file and read back: bitwise"},
    /* -- issue 35: the mechanisms no other quick cell reaches -- */
    {.name = "fiber-cp2-ep2-zero1", .preset = TINY, .kind = LAYOUT, .tier = Q, .backend = "fiber",
     .vs_backend = "threads",
     .layout = {.world_size = 4, .context_parallel_size = 2, .expert_model_parallel_size = 2,
                .use_distributed_optimizer = 1},
     .note = "fiber ranks against the same layout on threads: every tensor bitwise, and the run summaries "
             "(emulated clocks, bytes per tier, per-rank memory table) exactly"},
    {.name = "fiber-pp2-cp2-ep2", .preset = TINY, .kind = LAYOUT, .tier = Q, .backend = "fiber",
     .vs_backend = "threads",
     .layout = {.world_size = 8, .pipeline_model_parallel_size = 2, .context_parallel_size = 2,
                .expert_model_parallel_size = 2, .pipeline_schedule = "1f1b",
                .pipeline_model_parallel_layout = "Et*1|t*2mL"},
     .note = "PP 2 x CP 2 x Da 2 = EP 2 x De 2 on fiber ranks against threads: bitwise, summaries exactly"},
    {.name = "fiber-cp4-dp17", .preset = TINY, .kind = LAYOUT, .tier = Q, .steps = 1, .backend = "fiber",
     .layout = {.world_size = 68, .context_parallel_size = 4, .global_batch_size = 17},
     .note = "CP 4 x DP 17 = 68 ranks on fiber: the gradient all-reduce over 68 ranks goes in chunks "
             "(comm/collectives.c); f64 policy against the serial run of the same 17 rows"},
    {.name = "golden-blocked", .preset = TINY, .kind = PAR_KIND_REPEAT, .tier = Q, .rows_per_block = 3,
     .note = "the row-blocked golden (blocks of 3, 3, 2 rows) against the one-shot reference, which the "
             "serial-f64 cell holds to the checked-in set bitwise: f64 policy (another summation order)"},

    /* ---- v4-mini: default, --full ---- */
    {.name = "serial-f64", .preset = MINI, .kind = PAR_KIND_GOLDEN, .tier = D},
    {.name = "serial-f64", .preset = MINI, .data = "*", .kind = PAR_KIND_GOLDEN, .tier = F},
    {.name = "repeat-bitwise", .preset = MINI, .kind = PAR_KIND_REPEAT, .tier = D,
     .note = "same layout, backend and precision run twice: bitwise (GOLDEN.md)"},
    {.name = "f32-vs-f64", .preset = MINI, .kind = PAR_KIND_SERIAL, .tier = D, .precision = 32,
     .policy = PAR_POLICY_F32, .files = PAR_FILES_STEPS_AND_INIT,
     .note = "f32 values widened exactly to F64; GOLDEN.md's f32 policy on every step file and params.0 "
             "(docs/matrix.md)"},
    {.name = "f32-vs-f64-params", .preset = MINI, .kind = PAR_KIND_SERIAL, .tier = D, .precision = 32,
     .policy = PAR_POLICY_F32, .files = PAR_FILES_UPDATED, .informational = 1,
     .note = "informational: parameters after AdamW/Muon updates under the f32 policy; AdamW amplifies "
             "near-zero gradients' rounding (docs/matrix.md)"},
    {.name = "cp2", .preset = MINI, .kind = LAYOUT, .tier = D, .layout = CP(2), .note = NOTE_CP},
    {.name = "cp2", .preset = MINI, .data = "*", .kind = LAYOUT, .tier = F, .layout = CP(2), .note = NOTE_CP},
    {.name = "cp4", .preset = MINI, .kind = LAYOUT, .tier = D, .layout = CP(4), .note = NOTE_CP},
    {.name = "cp4", .preset = MINI, .data = "*", .kind = LAYOUT, .tier = F, .layout = CP(4), .note = NOTE_CP},
    {.name = "ep32", .preset = MINI, .kind = LAYOUT, .tier = D, .layout = EP(32, 32), .note = NOTE_EP},
    {.name = "ep64-cp2", .preset = MINI, .kind = LAYOUT, .tier = D, .backend = "fiber",
     .layout = {.world_size = 64, .expert_model_parallel_size = 64, .context_parallel_size = 2},
     .note = NOTE_EP "; CP 2 folded so that Da = N / CP divides B = 32"},
    {.name = "ep128-cp4", .preset = MINI, .kind = LAYOUT, .tier = D, .backend = "fiber",
     .layout = {.world_size = 128, .expert_model_parallel_size = 128, .context_parallel_size = 4},
     .note = NOTE_EP "; CP 4 folded so that Da = N / CP divides B = 32"},
    {.name = "dp2", .preset = MINI, .kind = LAYOUT, .tier = F, .layout = DPZ(2, 0, 0), .note = NOTE_DP},
    {.name = "dp4", .preset = MINI, .kind = LAYOUT, .tier = D, .layout = DPZ(4, 0, 0), .note = NOTE_DP},
    {.name = "dp2-zero1", .preset = MINI, .kind = LAYOUT, .tier = F, .layout = DPZ(2, 0, 1), .note = NOTE_ZERO},
    {.name = "dp4-zero1", .preset = MINI, .kind = LAYOUT, .tier = D, .layout = DPZ(4, 0, 1), .note = NOTE_ZERO},
    {.name = "ep4-zero1", .preset = MINI, .kind = LAYOUT, .tier = F, .layout = DPZ(8, 4, 1), .note = NOTE_ZERO},
    {.name = "pp2-gpipe", .preset = MINI, .kind = LAYOUT, .tier = F, .layout = PPS(2, "gpipe", "Et*4|t*4mL"),
     .note = NOTE_PP},
    {.name = "pp2-1f1b", .preset = MINI, .kind = LAYOUT, .tier = D, .layout = PPS(2, "1f1b", "Et*4|t*4mL"),
     .note = NOTE_PP},
    {.name = "pp2-interleaved", .preset = MINI, .kind = LAYOUT, .tier = F,
     .layout = PPS(2, "interleaved", "Et*2|t*2|t*2|t*2mL"), .note = NOTE_PP},
    {.name = "pp2-zbh1", .preset = MINI, .kind = LAYOUT, .tier = F, .layout = PPS(2, "zb-h1", "Et*4|t*4mL"),
     .note = NOTE_PP},
    {.name = "pp2-dualpipe", .preset = MINI, .kind = LAYOUT, .tier = F, .layout = PPS(2, "dualpipe", "Et*4|t*4mL"),
     .note = NOTE_PP},
    {.name = "pp2-dualpipev", .preset = MINI, .kind = LAYOUT, .tier = D,
     .layout = PPS(2, "dualpipev", "Et*2|t*2|t*2|t*2mL"), .note = NOTE_PP},
    {.name = "pp4-1f1b", .preset = MINI, .kind = LAYOUT, .tier = F, .layout = PPS(4, "1f1b", "Et*2|t*2|t*2|t*2mL"),
     .note = NOTE_PP},
    {.name = "pp4-interleaved", .preset = MINI, .kind = LAYOUT, .tier = F,
     .layout = PPS(4, "interleaved", "Et*1|t*1|t*1|t*1|t*1|t*1|t*1|t*1mL"), .note = NOTE_PP},
    {.name = "pp4-zbh1", .preset = MINI, .kind = LAYOUT, .tier = F, .layout = PPS(4, "zb-h1", "Et*2|t*2|t*2|t*2mL"),
     .note = NOTE_PP},
    {.name = "pp4-dualpipev", .preset = MINI, .kind = LAYOUT, .tier = F,
     .layout = PPS(4, "dualpipev", "Et*1|t*1|t*1|t*1|t*1|t*1|t*1|t*1mL"), .note = NOTE_PP},
    {.name = "resume", .preset = MINI, .kind = PAR_KIND_RESUME, .tier = F, .steps = 2, .layout = DPZ(4, 2, 1),
     .load_layout = DPZ(4, 2, 1), .note = NOTE_PAIR " (the same layout)"},
    {.name = "reshard", .preset = MINI, .kind = PAR_KIND_RESUME, .tier = F, .steps = 2, .layout = DPZ(4, 2, 1),
     .load_layout = {.world_size = 4, .context_parallel_size = 2},
     .note = NOTE_PAIR " (resharded on load to another layout)"},
    /* ---- v4-mini TP / ETP / SP (issue 15): the default tier, the list of cells on v4-mini
     * (each about a v4-mini layout cell; docs/parallel.md) ---- */
    {.name = "tp2", .preset = MINI, .kind = LAYOUT, .tier = D, .layout = TPL(2, 2), .note = NOTE_TP},
    {.name = "tp2-sp", .preset = MINI, .kind = LAYOUT, .tier = D,
     .layout = {.world_size = 2, .tensor_model_parallel_size = 2, .sequence_parallel = 1}, .note = NOTE_TPSP},
    {.name = "tp4", .preset = MINI, .kind = LAYOUT, .tier = D,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 4, .global_batch_size = 8},
     .sets = {"o_groups=4", "index_n_heads=4"},
     .note = NOTE_TP "; o_groups and index heads widened to 4; 8 rows (its own reference: the default tier's 5 minutes)"},
    {.name = "etp2", .preset = MINI, .kind = LAYOUT, .tier = D,
     .layout = {.world_size = 2, .expert_tensor_parallel_size = 2}, .note = NOTE_ETP "; Da 2"},
    {.name = "tp2-pp2-1f1b", .preset = MINI, .kind = LAYOUT, .tier = D,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .pipeline_model_parallel_size = 2,
                .pipeline_schedule = "1f1b", .pipeline_model_parallel_layout = "Et*4|t*4mL"},
     .note = NOTE_TP "; PP 2"},
    {.name = "tp2-pp2-interleaved", .preset = MINI, .kind = LAYOUT, .tier = D,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .pipeline_model_parallel_size = 2,
                .pipeline_schedule = "interleaved", .pipeline_model_parallel_layout = "Et*2|t*2|t*2|t*2mL"},
     .note = NOTE_TP "; PP 2 interleaved (VPP 2)"},
    {.name = "tp2-zero1", .preset = MINI, .kind = LAYOUT, .tier = D,
     .layout = {.world_size = 4, .tensor_model_parallel_size = 2, .use_distributed_optimizer = 1},
     .note = NOTE_TP "; Da 2, ZeRO-1"},
    {.name = "etp2-ep4-de2", .preset = MINI, .kind = LAYOUT, .tier = D,
     .layout = {.world_size = 16, .expert_tensor_parallel_size = 2, .expert_model_parallel_size = 4},
     .note = NOTE_ETP_EP "; Da 16 = ETP 2 x EP 4 x De 2"},
    {.name = "tp2-ep4", .preset = MINI, .kind = LAYOUT, .tier = D,
     .layout = {.world_size = 8, .tensor_model_parallel_size = 2, .expert_model_parallel_size = 4},
     .note = NOTE_TP "; TP 2 x Da 4 = EP 4 x De 2 (each TP copy dispatched, weight pass on tp 0's)"},
    {.name = "tp2-cp2-ep4", .preset = MINI, .kind = LAYOUT, .tier = D,
     .layout = {.world_size = 8, .tensor_model_parallel_size = 2, .context_parallel_size = 2,
                .expert_model_parallel_size = 4},
     .note = NOTE_TP "; CP 2 on the TP shard; TP 2 x CP 2 x Da 2 = EP 4 x De 2"},
    /* --full: the chain costs 84 s in the default tier (46 s on 8 rows), which then took 374 s
     * idle, and the default tier must end within 5 minutes (issue 18); v4-tiny runs it in quick */
    {.name = "tp2-to-tp1-to-tp4", .preset = MINI, .kind = PAR_KIND_RESUME, .tier = F, .steps = 3, .split = 1,
     .layout = {.world_size = 2, .tensor_model_parallel_size = 2, .global_batch_size = 8},
     .load_layout = {.world_size = 1, .global_batch_size = 8},
     .chain_layout = {.world_size = 4, .tensor_model_parallel_size = 4, .global_batch_size = 8},
     .sets = {"o_groups=4", "index_n_heads=4"},
     .note = NOTE_PAIR " (a chain: step 0 under TP 2, step 1 serially, step 2 under TP 4, o_groups and index heads "
                       "widened; 8 rows)"},
    {.name = "data-file", .preset = MINI, .kind = PAR_KIND_DATA_FILE, .tier = D,
     .note = "the reference's input.* written to a safetensors file and read back: bitwise"},

    /* ---- scale: the acceptance cells (the meson 'slow' suite, tools/pp-accept.sh, dp-ckpt-accept.sh, cp_acceptance.sh) ---- */
#define SC(nm, pre, dat, k, ...) \
    {.name = nm, .preset = pre, .data = dat, .kind = LAYOUT, .tier = X, .steps = (k), .note = NOTE_SCALE, __VA_ARGS__}
#define B128 .global_batch_size = 128
    /* expert parallelism at B = 128 (tests/parallel/meson.build) */
    SC("ep32_b128", MINI, "generator", 2, .layout = {.expert_model_parallel_size = 32, B128}),
    SC("ep64_b128", MINI, "generator", 2, .layout = {.expert_model_parallel_size = 64, B128}),
    SC("ep128_b128", MINI, "generator", 2, .layout = {.expert_model_parallel_size = 128, B128}),
    SC("ep32_de4_b128", MINI, "generator", 2, .layout = {.world_size = 128, .expert_model_parallel_size = 32, B128}),
    /* context parallelism on every fixture and random packings (meson 'slow', tools/cp_acceptance.sh) */
    SC("cp2_s2", TINY, "*", 2, .layout = CP(2)),
    SC("cp4_s2", TINY, "*", 2, .layout = CP(4)),
    SC("cp2_s2", MINI, "*", 2, .layout = CP(2)),
    SC("cp4_s2", MINI, "*", 2, .layout = CP(4)),
    SC("cp2_seed1", TINY, "generator", 2, SEED(1), .layout = CP(2)),
    SC("cp4_seed1", TINY, "generator", 2, SEED(1), .layout = CP(4)),
    SC("cp2_seed7", TINY, "generator", 2, SEED(7), .layout = CP(2)),
    SC("cp4_seed7", TINY, "generator", 2, SEED(7), .layout = CP(4)),
    SC("cp2_seed2024", TINY, "generator", 2, SEED(2024), .layout = CP(2)),
    SC("cp4_seed2024", TINY, "generator", 2, SEED(2024), .layout = CP(4)),
    SC("cp2_seed1", MINI, "generator", 2, SEED(1), .layout = CP(2)),
    SC("cp4_seed1", MINI, "generator", 2, SEED(1), .layout = CP(4)),
    SC("cp2_seed7", MINI, "generator", 2, SEED(7), .layout = CP(2)),
    SC("cp4_seed7", MINI, "generator", 2, SEED(7), .layout = CP(4)),
    SC("cp2_seed2024", MINI, "generator", 2, SEED(2024), .layout = CP(2)),
    SC("cp4_seed2024", MINI, "generator", 2, SEED(2024), .layout = CP(4)),
    SC("cp4_ep32_s2", MINI, "generator", 2,
       .layout = {.world_size = 128, .context_parallel_size = 4, .expert_model_parallel_size = 32}),
    SC("cp4_ep64_s2", MINI, "generator", 2,
       .layout = {.world_size = 128, .context_parallel_size = 4, .expert_model_parallel_size = 64}),
    SC("cp4_ep128_s2", MINI, "generator", 2,
       .layout = {.world_size = 128, .context_parallel_size = 4, .expert_model_parallel_size = 128}),
    /* pipeline parallelism (tools/pp-accept.sh) */
#define PPX(pp, ...) {.world_size = (pp), .pipeline_model_parallel_size = (pp), __VA_ARGS__}
    SC("pp2", MINI, "generator", 2, .layout = PPX(2)),
    SC("pp4", MINI, "generator", 2, .layout = PPX(4)),
    SC("pp8", MINI, "generator", 2, .layout = PPX(8)),
    SC("pp3_uneven", MINI, "generator", 2, .layout = PPX(3, .pipeline_model_parallel_layout = "Et*3|t*2|t*3mL")),
    SC("pp2_vpp2", MINI, "generator", 2, .layout = PPX(2, .virtual_pipeline_model_parallel_size = 2)),
    SC("pp4_zbh1", MINI, "generator", 2, .layout = PPX(4, .pipeline_schedule = "zb-h1")),
    SC("pp4_dualpipe", MINI, "generator", 2, .layout = PPX(4, .pipeline_schedule = "dualpipe")),
    SC("pp4_dualpipev", MINI, "generator", 2, .layout = PPX(4, .pipeline_schedule = "dualpipev")),
    SC("pp2_cp2", MINI, "generator", 2, .layout = {.pipeline_model_parallel_size = 2, .context_parallel_size = 2}),
    SC("pp2_cp2_ep64", MINI, "generator", 2,
       .layout = {.world_size = 128, .pipeline_model_parallel_size = 2, .context_parallel_size = 2,
                  .expert_model_parallel_size = 64, B128}),
    /* data parallelism and ZeRO-1 (tools/dp-ckpt-accept.sh) */
    SC("dp8", MINI, "generator", 3, .layout = {.world_size = 8}),
    SC("dp8_zero", MINI, "generator", 3, .layout = {.world_size = 8, .use_distributed_optimizer = 1}),
    SC("dp4_cp2", MINI, "generator", 3, .layout = {.world_size = 8, .context_parallel_size = 2}),
    SC("dp4_cp2_zero", MINI, "generator", 3,
       .layout = {.world_size = 8, .context_parallel_size = 2, .use_distributed_optimizer = 1}),
    SC("cp4_ep32", MINI, "generator", 3,
       .layout = {.world_size = 128, .context_parallel_size = 4, .expert_model_parallel_size = 32}),
    SC("cp4_ep32_zero", MINI, "generator", 3,
       .layout = {.world_size = 128, .context_parallel_size = 4, .expert_model_parallel_size = 32,
                  .use_distributed_optimizer = 1}),
    SC("pp2_ep16", MINI, "generator", 3,
       .layout = {.world_size = 32, .pipeline_model_parallel_size = 2, .expert_model_parallel_size = 16}),
    SC("pp2_ep16_zero", MINI, "generator", 3,
       .layout = {.world_size = 32, .pipeline_model_parallel_size = 2, .expert_model_parallel_size = 16,
                  .use_distributed_optimizer = 1}),
    /* resume under another layout (tools/dp-ckpt-accept.sh): 2 steps saved, 2 loaded */
    {.name = "resume_ep32z_dp8", .preset = MINI, .data = "generator", .kind = PAR_KIND_RESUME, .tier = X,
     .steps = 4, .split = 2, .layout = DPZ(0, 32, 1), .load_layout = {.world_size = 8}, .note = NOTE_PAIR},
    {.name = "resume_pp2ep16z_ep32", .preset = MINI, .data = "generator", .kind = PAR_KIND_RESUME, .tier = X,
     .steps = 4, .split = 2,
     .layout = {.world_size = 32, .pipeline_model_parallel_size = 2, .expert_model_parallel_size = 16,
                .use_distributed_optimizer = 1},
     .load_layout = {.expert_model_parallel_size = 32}, .note = NOTE_PAIR},
    {.name = "resume_dp8_pp4vpp2", .preset = MINI, .data = "generator", .kind = PAR_KIND_RESUME, .tier = X,
     .steps = 4, .split = 2, .layout = {.world_size = 8},
     .load_layout = {.world_size = 8, .pipeline_model_parallel_size = 4, .virtual_pipeline_model_parallel_size = 2,
                     .use_distributed_optimizer = 1},
     .note = NOTE_PAIR},
    /* checkpoints resharded offline (tools/dp-ckpt-accept.sh): A's checkpoint after 1 step == its reshard to B */
#define RS(nm, ...) \
    {.name = nm, .preset = MINI, .data = "generator", .kind = PAR_KIND_CKPT_RESHARD, .tier = X, .steps = 1, \
     .note = "the checkpoint of `layout` after 1 step resharded to `load-layout`: state and tensors bitwise equal", \
     __VA_ARGS__}
    RS("reshard_dp8z_dp2", .layout = {.world_size = 8, .use_distributed_optimizer = 1},
       .load_layout = {.world_size = 2}),
    RS("reshard_ep128_ep32", .layout = {.expert_model_parallel_size = 128, B128},
       .load_layout = {.world_size = 32, .expert_model_parallel_size = 32}),
    RS("reshard_pp2ep32_pp4ep64cp2",
       .layout = {.world_size = 64, .pipeline_model_parallel_size = 2, .expert_model_parallel_size = 32},
       .load_layout = {.world_size = 256, .pipeline_model_parallel_size = 4, .expert_model_parallel_size = 64,
                       .context_parallel_size = 2}),
    RS("reshard_pp4vpp2_pp1",
       .layout = {.world_size = 4, .pipeline_model_parallel_size = 4, .virtual_pipeline_model_parallel_size = 2},
       .load_layout = {.world_size = 1}),
#undef RS
    /* ---- the tuning guide's configs A, B, C (../shared/reference/001_*, issue 18) ----
     * Their world sizes and flags verbatim (TP 1, PP 8, CP, EP 64, ETP 1, micro-batch-size 1,
     * global-batch-size 4096, 1F1B; the guide's flags give no --use-distributed-optimizer) on
     * v4-mini's structure (8 layers + MTP over 8 stages, 384 experts, top-6) with S = 16 >= CP x
     * window 16 (C: 64 = 4 x 16), dim 32 and moe_inter_dim 8; B and C's 8,192 ranks narrower still
     * (dim 16, moe_inter_dim 4, q_lora_rank 16, head_dim 16, o_lora_rank 8, index_head_dim 8:
     * docs/matrix.md, "Configs A, B, C"), on the fiber backend: thousands of ranks as user-level
     * contexts. */
#define NARROW "dim=32", "moe_inter_dim=8"
#define NARROW8K "dim=16", "moe_inter_dim=4", "q_lora_rank=16", "head_dim=16", "o_lora_rank=8", "index_head_dim=8"
#define GUIDE(nm, w, cp, seq, da, de, m, ...) \
    {.name = nm, .preset = MINI, .data = "generator", .kind = LAYOUT, .tier = X, .steps = 1, .backend = "fiber", \
     .layout = {.world_size = (w), .tensor_model_parallel_size = 1, .pipeline_model_parallel_size = 8, \
                .context_parallel_size = (cp), .expert_model_parallel_size = 64, .expert_tensor_parallel_size = 1, \
                .micro_batch_size = 1, .global_batch_size = 4096, .pipeline_schedule = "1f1b", \
                .pipeline_model_parallel_layout = "Et|t|t|t|t|t|t|tmL"}, \
     .sets = {"seq_length=" #seq, __VA_ARGS__}, \
     .note = "the tuning guide's " nm ": Da " #da ", De " #de ", m " #m " microbatches per replica; the serial " \
             "golden of the same 4096 rows, f64 policy"}
    GUIDE("config-a", 1024, 1, 16, 128, 2, 32, NARROW),
    GUIDE("config-b", 8192, 1, 16, 1024, 16, 4, NARROW8K),
    GUIDE("config-c", 8192, 4, 64, 256, 16, 16, NARROW8K),
#undef GUIDE
#undef NARROW
#undef NARROW8K
#undef SC
#undef PPX
#undef B128
};

const par_cell_spec *par_cells_builtin(int *n)
{
    *n = (int)(sizeof builtin / sizeof builtin[0]);
    return builtin;
}

/* ---- layouts ---------------------------------------------------------- */

typedef enum { FLAG_INT, FLAG_BOOL, FLAG_STR } flag_type;

/* The flags of par_cell_layout, in the order `parity run` gets them. */
static const struct {
    const char *name;
    flag_type type;
    size_t off, cap;
} flags[] = {
#define FI(nm, f) {nm, FLAG_INT, offsetof(par_cell_layout, f), 0}
#define FS(nm, f) {nm, FLAG_STR, offsetof(par_cell_layout, f), sizeof(((par_cell_layout *)0)->f)}
    FI("world-size", world_size),
    FI("tensor-model-parallel-size", tensor_model_parallel_size),
    FI("pipeline-model-parallel-size", pipeline_model_parallel_size),
    FI("virtual-pipeline-model-parallel-size", virtual_pipeline_model_parallel_size),
    FS("pipeline-model-parallel-layout", pipeline_model_parallel_layout),
    FS("pipeline-schedule", pipeline_schedule),
    FI("context-parallel-size", context_parallel_size),
    FI("expert-model-parallel-size", expert_model_parallel_size),
    FI("expert-tensor-parallel-size", expert_tensor_parallel_size),
    FI("micro-batch-size", micro_batch_size),
    FI("global-batch-size", global_batch_size),
    {"use-distributed-optimizer", FLAG_BOOL, offsetof(par_cell_layout, use_distributed_optimizer), 0},
    FS("moe-dispatch", moe_dispatch),
    FI("gpus-per-node", gpus_per_node),
    {"sequence-parallel", FLAG_BOOL, offsetof(par_cell_layout, sequence_parallel), 0},
    {"tp-all-layers", FLAG_BOOL, offsetof(par_cell_layout, tp_all_layers), 0},
#undef FI
#undef FS
};
#define NFLAGS ((int)(sizeof flags / sizeof flags[0]))

void par_cell_layout_args(const par_cell_layout *cl, void (*add)(const char *flag, const char *value, void *ud),
                          void *ud)
{
    for (int i = 0; i < NFLAGS; i++) {
        const char *p = (const char *)cl + flags[i].off;
        char v[160];
        if (flags[i].type == FLAG_INT) {
            int64_t x;
            memcpy(&x, p, sizeof x);
            if (!x)
                continue;
            snprintf(v, sizeof v, "%lld", (long long)x);
            add(flags[i].name, v, ud);
        } else if (flags[i].type == FLAG_BOOL) {
            int x;
            memcpy(&x, p, sizeof x);
            if (x)
                add(flags[i].name, NULL, ud);
        } else if (*p) {
            add(flags[i].name, p, ud);
        }
    }
}

static void count_flag(const char *flag, const char *value, void *ud)
{
    (void)flag;
    (void)value;
    ++*(int *)ud;
}

int par_cell_layout_empty(const par_cell_layout *cl)
{
    int n = 0;
    par_cell_layout_args(cl, count_flag, &n);
    return n == 0;
}

static int64_t or1(int64_t v) { return v > 0 ? v : 1; }

par_status par_cell_layout_to(const par_cell_layout *cl, par_layout *out)
{
    par_layout l;
    par_layout_init(&l);
    l.world = cl->world_size;
    l.tp = or1(cl->tensor_model_parallel_size);
    l.pp = or1(cl->pipeline_model_parallel_size);
    l.vpp = cl->virtual_pipeline_model_parallel_size;
    l.cp = or1(cl->context_parallel_size);
    l.ep = or1(cl->expert_model_parallel_size);
    l.etp = or1(cl->expert_tensor_parallel_size);
    l.micro_batch = cl->micro_batch_size;
    l.global_batch = cl->global_batch_size;
    l.distributed_optimizer = cl->use_distributed_optimizer;
    l.sequence_parallel = cl->sequence_parallel;
    l.tp_all_layers = cl->tp_all_layers; /* a deprecated no-op */
    par_status s = PAR_OK;
    if (cl->pipeline_model_parallel_layout[0])
        s = par_layout_set_pp_layout(&l, cl->pipeline_model_parallel_layout);
    if (!s && cl->pipeline_schedule[0])
        s = par_layout_set_schedule(&l, cl->pipeline_schedule);
    if (!s)
        *out = l;
    return s;
}

par_status par_cell_layout_resolve(const par_cell_layout *cl, const par_config *cfg, par_layout *out)
{
    par_layout_model lm = {
        .n_layers = cfg->n_layers, .n_mtp_layers = cfg->n_mtp_layers, .n_routed_experts = cfg->n_routed_experts,
        .seq_length = cfg->seq_length, .global_batch_size = cfg->global_batch_size,
        .window_size = cfg->window_size, .n_ratios = cfg->n_compress_ratios, .compress_ratios = cfg->compress_ratios,
    };
    par_layout l;
    par_status s = par_cell_layout_to(cl, &l);
    if (!s)
        s = par_layout_resolve(&l, &lm);
    if (!s)
        *out = l;
    return s;
}

/* ---- checks of a row -------------------------------------------------- */

/* par_err with the message of the last error appended (copied first: the
 * message buffer is par_err's own). */
static par_status err_with_last(par_status code, const char *cell, const char *field)
{
    char last[600];
    snprintf(last, sizeof last, "%s", par_last_error());
    return par_err(code, "cell '%s': %s: %s", cell, field, last);
}

par_status par_cell_config(const par_cell_spec *c, par_config *out)
{
    par_config cfg;
    par_status s = par_config_preset(&cfg, c->preset);
    if (s)
        return err_with_last(s, c->name, "\"preset\"");
    for (int i = 0; i < PAR_CELL_MAX_SETS && c->sets[i][0]; i++) {
        if ((s = par_config_set_arg(&cfg, c->sets[i]))) {
            char field[96];
            snprintf(field, sizeof field, "\"set\" '%s'", c->sets[i]);
            return err_with_last(s, c->name, field);
        }
    }
    if (c->layout.global_batch_size > 0)
        cfg.global_batch_size = c->layout.global_batch_size;
    if ((s = par_config_validate(&cfg)) || (s = par_config_check_runnable(&cfg)))
        return err_with_last(s, c->name, "config (\"preset\", \"set\", \"global-batch-size\")");
    *out = cfg;
    return PAR_OK;
}

static par_status check_layout(const par_cell_spec *c, const par_config *cfg, const par_cell_layout *cl,
                               const char *field)
{
    if (cl->moe_dispatch[0] && strcmp(cl->moe_dispatch, "flat") && strcmp(cl->moe_dispatch, "hierarchical"))
        return par_err(PAR_EINVAL, "cell '%s': %s.\"moe-dispatch\": expected flat or hierarchical, got '%s'",
                       c->name, field, cl->moe_dispatch);
    if (cl->global_batch_size > 0 && cl->global_batch_size != cfg->global_batch_size)
        return par_err(PAR_EINVAL, "cell '%s': %s.\"global-batch-size\" %lld differs from the cell's (%lld, from "
                       "\"layout\"): both runs of a cell train on the same batches",
                       c->name, field, (long long)cl->global_batch_size, (long long)cfg->global_batch_size);
    par_layout l;
    par_status s = par_cell_layout_resolve(cl, cfg, &l);
    return s ? err_with_last(s, c->name, field) : PAR_OK;
}

/* The fields a kind does not use must be empty (a user's typo in "kind"
 * would otherwise silently drop a layout). */
static par_status check_kind_fields(const par_cell_spec *c)
{
    int two = c->kind == PAR_KIND_RESUME || c->kind == PAR_KIND_CKPT_RESHARD;
    int lay = c->kind == PAR_KIND_LAYOUT || two;
    if (!lay && !par_cell_layout_empty(&c->layout))
        return par_err(PAR_EINVAL, "cell '%s': \"layout\": a %s cell runs serially and takes no layout", c->name,
                       par_cell_kind_name(c->kind));
    if (!two && !par_cell_layout_empty(&c->load_layout))
        return par_err(PAR_EINVAL, "cell '%s': \"load-layout\" belongs to resume and ckpt-reshard cells (kind is %s)",
                       c->name, par_cell_kind_name(c->kind));
    if (c->kind != PAR_KIND_RESUME && !par_cell_layout_empty(&c->chain_layout))
        return par_err(PAR_EINVAL, "cell '%s': \"chain-layout\" belongs to resume cells (kind is %s)", c->name,
                       par_cell_kind_name(c->kind));
    if (c->kind == PAR_KIND_RESUME && !par_cell_layout_empty(&c->chain_layout) && c->steps &&
        c->steps - (c->split ? c->split : c->steps / 2) < 2)
        return par_err(PAR_EINVAL, "cell '%s': a chain needs two steps after \"split\" (%lld of \"steps\" %lld)",
                       c->name, (long long)(c->split ? c->split : c->steps / 2), (long long)c->steps);
    if (c->backend[0] && strcmp(c->backend, "threads") && strcmp(c->backend, "fiber"))
        return par_err(PAR_EINVAL, "cell '%s': \"backend\": '%s' is not threads or fiber (leave it out for the "
                       "matrix's --backend)", c->name, c->backend);
    if (!lay && c->backend[0])
        return par_err(PAR_EINVAL, "cell '%s': \"backend\" is the backend of layout runs: a %s cell runs serially",
                       c->name, par_cell_kind_name(c->kind));
    if (c->vs_backend[0] && (c->kind != PAR_KIND_LAYOUT || (strcmp(c->vs_backend, "threads") &&
                                                           strcmp(c->vs_backend, "fiber"))))
        return par_err(PAR_EINVAL, "cell '%s': \"vs-backend\": '%s' must be threads or fiber, on a layout cell "
                       "(kind is %s)", c->name, c->vs_backend, par_cell_kind_name(c->kind));
    if (c->rows_per_block && (c->kind != PAR_KIND_REPEAT || c->rows_per_block < 1))
        return par_err(PAR_EINVAL, "cell '%s': \"rows-per-block\" %lld: a count >= 1 on a repeat cell (kind is %s)",
                       c->name, (long long)c->rows_per_block, par_cell_kind_name(c->kind));
    if (c->kind != PAR_KIND_RESUME && c->split)
        return par_err(PAR_EINVAL, "cell '%s': \"split\" belongs to resume cells (kind is %s)", c->name,
                       par_cell_kind_name(c->kind));
    if (c->precision != 0 && c->precision != 64 && c->precision != 32)
        return par_err(PAR_EINVAL, "cell '%s': \"precision\": expected f64 or f32", c->name);
    if (c->precision == 32 && (c->kind == PAR_KIND_GOLDEN || c->kind == PAR_KIND_REPEAT ||
                               c->kind == PAR_KIND_DATA_FILE || c->kind == PAR_KIND_RESUME))
        return par_err(PAR_EINVAL, "cell '%s': \"precision\": f32 is for serial and layout cells (kind %s runs "
                       "the f64 reference)", c->name, par_cell_kind_name(c->kind));
    if (c->kind == PAR_KIND_RESUME && c->steps && (c->steps < 2 || (c->split && c->split >= c->steps)))
        return par_err(PAR_EINVAL, "cell '%s': a resume cell needs 1 <= \"split\" (%lld) < \"steps\" (%lld)",
                       c->name, (long long)c->split, (long long)c->steps);
    return PAR_OK;
}

par_status par_cell_check(const par_cell_spec *c)
{
    if (!c->name[0])
        return par_err(PAR_EINVAL, "a cell has no \"name\"");
    for (const char *p = c->name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_' || *p == '.'))
            return par_err(PAR_EINVAL, "cell '%s': \"name\": only letters, digits, '-', '_' and '.' (it names a "
                           "directory)", c->name);
    par_status s = check_kind_fields(c);
    par_config cfg;
    if (!s)
        s = par_cell_config(c, &cfg);
    int two = c->kind == PAR_KIND_RESUME || c->kind == PAR_KIND_CKPT_RESHARD;
    if (!s && (c->kind == PAR_KIND_LAYOUT || two))
        s = check_layout(c, &cfg, &c->layout, "\"layout\"");
    if (!s && two)
        s = check_layout(c, &cfg, &c->load_layout, "\"load-layout\"");
    if (!s && !par_cell_layout_empty(&c->chain_layout))
        s = check_layout(c, &cfg, &c->chain_layout, "\"chain-layout\"");
    return s;
}

/* ---- the cells file --------------------------------------------------- */

/* Where a reader is: the file and the cell, for messages. */
typedef struct {
    const char *path;
    int index;           /* 1-based cell number */
    const char *name;    /* the cell's name once known */
} rctx;

static par_status bad(const rctx *x, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static par_status bad(const rctx *x, const char *field, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (x->index > 0)
        return par_err(PAR_EINVAL, "%s (cell #%d): cell '%s': %s: %s", x->path, x->index, x->name ? x->name : "?",
                       field, what);
    return par_err(PAR_EINVAL, "%s: %s: %s", x->path, field, what);
}

/* 1 when obj has two members of one name (cJSON keeps both). */
static const char *duplicate_key(const cJSON *obj)
{
    for (const cJSON *a = obj->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (!strcmp(a->string, b->string))
                return a->string;
    return NULL;
}

static par_status get_str(const rctx *x, const cJSON *v, const char *field, char *dst, size_t cap)
{
    if (!cJSON_IsString(v))
        return bad(x, field, "expected a string");
    if (strlen(v->valuestring) >= cap)
        return bad(x, field, "longer than %zu characters", cap - 1);
    snprintf(dst, cap, "%s", v->valuestring);
    return PAR_OK;
}

static par_status get_int(const rctx *x, const cJSON *v, const char *field, int64_t lo, int64_t *dst)
{
    int64_t k;
    if (!par_json_as_int(v, &k))
        return bad(x, field, "expected an integer");
    if (k < lo)
        return bad(x, field, "must be >= %lld (got %lld)", (long long)lo, (long long)k);
    *dst = k;
    return PAR_OK;
}

static par_status read_layout(const rctx *x, const cJSON *obj, const char *field, par_cell_layout *out)
{
    if (!cJSON_IsObject(obj))
        return bad(x, field, "expected an object of `parity run` layout flags (e.g. {\"context-parallel-size\": 2})");
    const char *dup = duplicate_key(obj);
    if (dup)
        return bad(x, field, "\"%s\" given twice", dup);
    memset(out, 0, sizeof *out);
    for (const cJSON *m = obj->child; m; m = m->next) {
        int i = 0;
        while (i < NFLAGS && strcmp(flags[i].name, m->string))
            i++;
        char fld[160];
        snprintf(fld, sizeof fld, "%s.\"%s\"", field, m->string);
        if (i == NFLAGS)
            return bad(x, fld, "not a layout flag (flags: world-size, context-parallel-size, "
                               "expert-model-parallel-size, pipeline-model-parallel-size, "
                               "virtual-pipeline-model-parallel-size, pipeline-model-parallel-layout, "
                               "pipeline-schedule, micro-batch-size, global-batch-size, use-distributed-optimizer, "
                               "moe-dispatch, gpus-per-node, tensor-model-parallel-size, expert-tensor-parallel-size, "
                               "sequence-parallel, tp-all-layers)");
        char *p = (char *)out + flags[i].off;
        par_status s = PAR_OK;
        if (flags[i].type == FLAG_INT) {
            int64_t v;
            s = get_int(x, m, fld, 1, &v);
            if (!s)
                memcpy(p, &v, sizeof v);
        } else if (flags[i].type == FLAG_BOOL) {
            if (!cJSON_IsBool(m))
                return bad(x, fld, "expected true or false");
            int v = cJSON_IsTrue(m);
            memcpy(p, &v, sizeof v);
        } else {
            s = get_str(x, m, fld, p, flags[i].cap);
            if (!s && !*p)
                s = bad(x, fld, "empty (leave the flag out for the default)");
        }
        if (s)
            return s;
    }
    return PAR_OK;
}

static par_status read_sets(const rctx *x, const cJSON *v, par_cell_spec *c)
{
    if (!cJSON_IsArray(v))
        return bad(x, "\"set\"", "expected an array of \"key=value\" strings");
    int n = 0;
    for (const cJSON *e = v->child; e; e = e->next, n++) {
        if (n == PAR_CELL_MAX_SETS)
            return bad(x, "\"set\"", "more than %d entries", PAR_CELL_MAX_SETS);
        par_status s = get_str(x, e, "\"set\"", c->sets[n], sizeof c->sets[n]);
        if (s)
            return s;
        if (!strchr(c->sets[n], '='))
            return bad(x, "\"set\"", "'%s' is not key=value", c->sets[n]);
    }
    return PAR_OK;
}

/* A named enumeration field. */
static par_status get_enum(const rctx *x, const cJSON *v, const char *field, const char *const *names, int n,
                           int *dst)
{
    if (!cJSON_IsString(v))
        return bad(x, field, "expected a string");
    int i = name_index(names, n, v->valuestring);
    if (i < 0) {
        char list[200] = "";
        for (int k = 0; k < n; k++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", names[k]);
        return bad(x, field, "'%s' is not one of %s", v->valuestring, list);
    }
    *dst = i;
    return PAR_OK;
}

static const char *const precision_names[2] = {"f64", "f32"};
static const char *const policy_names[5] = {"auto", "f64", "f32", "bf16", "bitwise"};

/* One member of a cell object. */
static par_status read_member(const rctx *x, const cJSON *m, const char *dir, par_cell_spec *c)
{
    const char *k = m->string;
    char fld[80];
    snprintf(fld, sizeof fld, "\"%s\"", k);
    int e = 0;
    par_status s;
    if (!strcmp(k, "name"))
        return get_str(x, m, fld, c->name, sizeof c->name);
    if (!strcmp(k, "preset"))
        return get_str(x, m, fld, c->preset, sizeof c->preset);
    if (!strcmp(k, "note"))
        return get_str(x, m, fld, c->note, sizeof c->note);
    if (!strcmp(k, "data")) {
        char d[sizeof c->data];
        if ((s = get_str(x, m, fld, d, sizeof d)))
            return s;
        int is_file = strlen(d) > 12 && !strcmp(d + strlen(d) - 12, ".safetensors");
        if (is_file && d[0] != '/' && dir[0]) /* relative to the cells file */
            return snprintf(c->data, sizeof c->data, "%s/%s", dir, d) < (int)sizeof c->data
                       ? PAR_OK
                       : bad(x, fld, "path too long");
        snprintf(c->data, sizeof c->data, "%s", d);
        return PAR_OK;
    }
    if (!strcmp(k, "kind"))
        return (s = get_enum(x, m, fld, kind_names, PAR_KIND_COUNT, &e)) ? s : (c->kind = (par_cell_kind)e, PAR_OK);
    if (!strcmp(k, "tier"))
        return (s = get_enum(x, m, fld, tier_names, PAR_CELL_TIER_COUNT, &e)) ? s : (c->tier = (par_cell_tier)e, PAR_OK);
    if (!strcmp(k, "files"))
        return (s = get_enum(x, m, fld, files_names, PAR_FILES_COUNT, &e)) ? s : (c->files = (par_cell_files)e, PAR_OK);
    if (!strcmp(k, "policy"))
        return (s = get_enum(x, m, fld, policy_names, 5, &e)) ? s : (c->policy = (par_policy)e, PAR_OK);
    if (!strcmp(k, "precision"))
        return (s = get_enum(x, m, fld, precision_names, 2, &e)) ? s : (c->precision = e ? 32 : 64, PAR_OK);
    if (!strcmp(k, "steps"))
        return get_int(x, m, fld, 1, &c->steps);
    if (!strcmp(k, "split"))
        return get_int(x, m, fld, 1, &c->split);
    if (!strcmp(k, "seed"))
        return (s = get_int(x, m, fld, 0, &c->seed)) ? s : (c->has_seed = 1, PAR_OK);
    if (!strcmp(k, "informational")) {
        if (!cJSON_IsBool(m))
            return bad(x, fld, "expected true or false");
        c->informational = cJSON_IsTrue(m);
        return PAR_OK;
    }
    if (!strcmp(k, "layout"))
        return read_layout(x, m, fld, &c->layout);
    if (!strcmp(k, "load-layout"))
        return read_layout(x, m, fld, &c->load_layout);
    if (!strcmp(k, "chain-layout"))
        return read_layout(x, m, fld, &c->chain_layout);
    if (!strcmp(k, "set"))
        return read_sets(x, m, c);
    if (!strcmp(k, "backend"))
        return get_str(x, m, fld, c->backend, sizeof c->backend);
    if (!strcmp(k, "vs-backend"))
        return get_str(x, m, fld, c->vs_backend, sizeof c->vs_backend);
    if (!strcmp(k, "rows-per-block"))
        return get_int(x, m, fld, 1, &c->rows_per_block);
    return bad(x, fld, "unknown key (keys: name, preset, data, kind, tier, steps, seed, precision, layout, "
                       "load-layout, chain-layout, split, set, policy, files, informational, backend, vs-backend, "
                       "rows-per-block, note)");
}

static par_status read_cell(rctx *x, const cJSON *obj, const char *dir, par_cell_spec *c)
{
    memset(c, 0, sizeof *c);
    c->kind = PAR_KIND_LAYOUT;
    c->tier = PAR_CELL_TIER_DEFAULT;
    if (!cJSON_IsObject(obj))
        return bad(x, "cell", "expected an object");
    const char *dup = duplicate_key(obj);
    if (dup)
        return bad(x, "cell", "\"%s\" given twice", dup);
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(obj, "name");
    if (!cJSON_IsString(nm) || !nm->valuestring[0])
        return bad(x, "\"name\"", "every cell needs a name (a non-empty string)");
    x->name = nm->valuestring;
    if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(obj, "preset")))
        return bad(x, "\"preset\"", "every cell needs a preset (v4-tiny or v4-mini)");
    for (const cJSON *m = obj->child; m; m = m->next) {
        par_status s = read_member(x, m, dir, c);
        if (s)
            return s;
    }
    par_status s = par_cell_check(c);
    if (s) {
        char last[700];
        snprintf(last, sizeof last, "%s", par_last_error());
        return par_err(s, "%s (cell #%d): %s", x->path, x->index, last);
    }
    return PAR_OK;
}

/* The directory part of path ("" for a bare name). */
static void dir_of(const char *path, char *buf, size_t n)
{
    const char *sl = strrchr(path, '/');
    size_t k = sl ? (size_t)(sl - path) : 0;
    if (k >= n)
        k = n - 1;
    memcpy(buf, path, k);
    buf[k] = 0;
    if (sl && k == 0)
        snprintf(buf, n, "/");
}

static par_status read_top(const rctx *x, const cJSON *root, const cJSON **cells)
{
    if (!cJSON_IsObject(root))
        return bad(x, "top level", "expected an object {\"format\": \"parity-cells\", \"version\": 1, \"cells\": [...]}");
    const char *dup = duplicate_key(root);
    if (dup)
        return bad(x, "top level", "\"%s\" given twice", dup);
    for (const cJSON *m = root->child; m; m = m->next)
        if (strcmp(m->string, "format") && strcmp(m->string, "version") && strcmp(m->string, "cells") &&
            strcmp(m->string, "note"))
            return bad(x, "top level", "unknown key \"%s\" (keys: format, version, cells, note)", m->string);
    const char *fmt = par_json_str(root, "format");
    int64_t ver = 0;
    if (!fmt || strcmp(fmt, "parity-cells"))
        return bad(x, "\"format\"", "expected \"parity-cells\"");
    if (!par_json_int(root, "version", &ver) || ver != 1)
        return bad(x, "\"version\"", "expected 1");
    *cells = cJSON_GetObjectItemCaseSensitive(root, "cells");
    if (!cJSON_IsArray(*cells) || cJSON_GetArraySize(*cells) == 0)
        return bad(x, "\"cells\"", "expected a non-empty array of cells");
    return PAR_OK;
}

/* (name, data) names one cell: a file must not list it twice. */
static par_status check_unique(const rctx *x, const par_cell_spec *v, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, v[n].name) && !strcmp(v[i].data, v[n].data) && !strcmp(v[i].preset, v[n].preset))
            return bad(x, "\"name\"", "cell %d has the same name, preset and data", i + 1);
    return PAR_OK;
}

par_status par_cells_read(const char *path, par_cell_spec **out, int *n)
{
    cJSON *root = NULL;
    par_status s = par_json_read_file(path, &root);
    if (s)
        return s;
    rctx x = {.path = path};
    const cJSON *cells = NULL;
    char dir[512];
    dir_of(path, dir, sizeof dir);
    par_cell_spec *v = NULL;
    s = read_top(&x, root, &cells);
    int cnt = s ? 0 : cJSON_GetArraySize(cells);
    if (!s && !(v = par_calloc((size_t)cnt, sizeof *v, PAR_TAG_MISC)))
        s = par_err(PAR_ENOMEM, "%s: out of memory for %d cells", path, cnt);
    int i = 0;
    for (const cJSON *e = s ? NULL : cells->child; !s && e; e = e->next, i++) {
        x.index = i + 1;
        x.name = NULL;
        s = read_cell(&x, e, dir, &v[i]);
        if (!s)
            s = check_unique(&x, v, i);
    }
    cJSON_Delete(root);
    if (s) {
        par_free(v);
        return s;
    }
    *out = v;
    *n = cnt;
    return PAR_OK;
}
