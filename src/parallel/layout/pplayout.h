/* parallel/layout/pplayout.h - pipeline layouts: which blocks each pipeline segment
 * holds, from a Megatron-LM `--pipeline-model-parallel-layout` string or from
 * Megatron's default even split.  Untemplated; plain values (no allocation).
 *
 * Syntax (Megatron-LM's, see docs/layouts.md):
 *   E  the embedding            t  one transformer block (a main layer)
 *   m  one MTP block            L  the loss / output head
 *   |  ends a segment           (..)*N, x*N  repeat a group / the item x N times
 *   ',' and whitespace are ignored.
 * Example: "Et*3|t*2|t*3mL" (n_layers 8, one MTP block, PP 3).
 *
 * Segments are listed in virtual-stage order: segment s runs on pipeline rank
 * s % PP as its virtual chunk s / PP (Megatron's interleaved assignment), so
 * the concatenation of all segments is the model in layer order.
 *
 * Usage:
 *   par_pplayout p;
 *   par_pplayout_parse("Et*3|t*2|t*3mL", &p);       // syntax
 *   par_pplayout_check(&p, 3, 1, 8, 1);              // rules for PP 3, VPP 1
 *   // or, without a string:
 *   par_pplayout_default(&p, 4, 2, 8, 1);            // Megatron's even split
 */
#ifndef PAR_PARALLEL_LAYOUT_PPLAYOUT_H
#define PAR_PARALLEL_LAYOUT_PPLAYOUT_H

#include <stdint.h>

#include "core/status.h"

/* The four block kinds, spelled as in layout strings. */
typedef enum {
    PAR_BLK_EMBED = 'E',
    PAR_BLK_LAYER = 't',
    PAR_BLK_MTP = 'm',
    PAR_BLK_LOSS = 'L',
} par_block_kind;

#define PAR_PPL_MAX_ITEMS 2048   /* blocks after expanding repeats */
#define PAR_PPL_MAX_SEGMENTS 512 /* PP * VPP                       */

typedef struct {
    int n_segments;
    int n_items;
    /* Segment s holds items[seg_off[s] .. seg_off[s+1]). */
    int seg_off[PAR_PPL_MAX_SEGMENTS + 1];
    char items[PAR_PPL_MAX_ITEMS];     /* par_block_kind values           */
    int column[PAR_PPL_MAX_ITEMS];     /* 1-based column in the string (0: default split) */
    int from_string;                   /* 1: parsed, 0: default split     */
} par_pplayout;

/* Parses a layout string (syntax only: characters, parentheses, repeats).
 * Errors (PAR_EINVAL) name the problem and its 1-based column. *out is set
 * only on success. */
par_status par_pplayout_parse(const char *str, par_pplayout *out);

/* Checks a parsed layout against the model and pipeline sizes:
 * segments == pp * vpp, exactly one E as the very first block, exactly one L
 * as the very last, n_layers 't' blocks, n_mtp 'm' blocks, and Megatron's MTP
 * placement rules (after every 't'; all in one segment, the last virtual
 * chunk of its pipeline rank).  PAR_EINVAL with the rule and the numbers. */
par_status par_pplayout_check(const par_pplayout *p, int64_t pp, int64_t vpp, int64_t n_layers,
                              int64_t n_mtp);

/* Megatron's split without a layout string: n_layers % (pp * vpp) must be 0
 * (else PAR_EINVAL telling to pass a layout); every segment gets
 * n_layers / (pp * vpp) consecutive blocks; E goes first in segment 0, the
 * MTP blocks and L last in the last segment (pipeline rank pp-1, chunk
 * vpp-1). */
par_status par_pplayout_default(par_pplayout *out, int64_t pp, int64_t vpp, int64_t n_layers,
                                int64_t n_mtp);

/* The uneven split the even-split error suggests: segs segments, the
 * middle ones one block longer first (E first, MTP blocks and L last),
 * e.g. 'Et*7|t*8|t*8|t*8|t*8|t*8|t*7|t*7mL' for 61 layers + 1 MTP over 8. */
void par_pplayout_suggest(char *buf, int n, int64_t segs, int64_t n_layers, int64_t n_mtp);

/* Segment <-> (pipeline rank, virtual chunk), Megatron's interleaving (the
 * DualPipeV V shape is in parallel/layout/layout.h: par_layout_segment_rank). */
static inline int par_pplayout_segment_rank(int s, int pp) { return s % pp; }
static inline int par_pplayout_segment_chunk(int s, int pp) { return s / pp; }
static inline int par_pplayout_segment_of(int pp_rank, int chunk, int pp) { return chunk * pp + pp_rank; }

/* Number of blocks of a kind in segment s. */
int par_pplayout_count(const par_pplayout *p, int s, par_block_kind k);
/* Number of blocks of a kind in all segments before s: the index of the
 * segment's first such block (layer id of its first 't', MTP depth of its
 * first 'm'). */
int par_pplayout_offset(const par_pplayout *p, int s, par_block_kind k);
/* Segment s in short form, e.g. "E,t*3" or "(empty)"; always terminated. */
void par_pplayout_format_segment(const par_pplayout *p, int s, char *buf, int n);
/* Whole layout back as a string, e.g. "Et*3|t*2|t*3mL"; always terminated. */
void par_pplayout_format(const par_pplayout *p, char *buf, int n);

#endif
