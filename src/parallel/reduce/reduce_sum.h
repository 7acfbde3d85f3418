/* parallel/reduce/reduce_sum.h - the one cross-rank sum, the untemplated core of
 * the reduction module (parallel/reduce/reduce.h): fields, their pack/unpack
 * helper and the one "reduce these fields over this group" call. */
#ifndef PAR_PARALLEL_REDUCE_REDUCE_SUM_H
#define PAR_PARALLEL_REDUCE_REDUCE_SUM_H

#include <stddef.h>

#include "comm/comm.h"
#include "core/status.h"

/* n elements of type t at p.  p NULL: n zeros (packed as zeros, never
 * written back), for padding. */
typedef struct {
    void *p;
    size_t n;
    par_ctype t;  /* PAR_C_I64, PAR_C_F64, PAR_C_F32 (PAR_C_BYTE: byte sums) */
} par_field;

#define PAR_FIELD(ptr, count, type) ((par_field){(void *)(ptr), (size_t)(count), (type)})

/* The pack/unpack helper: copies the fields of type t, in order, into buf
 * (unpack 0) or from buf back into them (unpack 1); returns the elements
 * (buf NULL: only counts). */
size_t par_fields_pack(void *buf, const par_field *f, int n, par_ctype t, int unpack);

/* Reduce these fields over this group (collective over c; every member
 * passes the same field types and counts): element-wise sums in rank order
 * 0..p-1, whatever the backend and the packing (comm/comm.h).  out NULL: an
 * all-reduce, every member's fields receive the sums (one collective per
 * element type present).  out not NULL: a reduce-scatter of fields of ONE
 * type whose packed length is a multiple of the group size p: member r
 * receives block r of the sums at out (the fields stay as they were).  The
 * data of one type that is a single field is summed where it lies (no
 * copy).  c NULL sums nothing: out gets the packed fields. */
par_status par_reduce_fields(par_comm *c, const par_field *f, int n, void *out);

/* The module's one non-sum: buf[0..n) = the element-wise max over c (an
 * all-reduce, exact in any order; the vocab-parallel CE's logit max).  c
 * NULL leaves buf as it is. */
par_status par_reduce_max_f64(par_comm *c, double *buf, size_t n);

#endif
