/* model/compare.h - the comparator of golden sets and safetensors files
 * (GOLDEN.md "Comparing"; docs/formats.md has the full policy).
 *
 * A comparison takes a reference A (the first argument) and a candidate B.
 * Every tensor name of either side is one entry: a name on one side only,
 * a dtype or shape difference, or values outside the policy fail.
 *   integer tensors      equal, always (manifest overrides do not apply);
 *   float, f64 policy    ||B-A||_2 <= 1e-10 ||A||_2 + 1e-14 sqrt(numel);
 *   float, f32 / bf16    the same with 1e-4, 1e-7 / 2e-2, 1e-4;
 *   bitwise              every bit equal (NaN payloads, signed zeros too).
 * Under the norm policies the positions of NaN and +-Inf must agree and
 * their values too (NaN with NaN, +Inf with +Inf); only finite pairs enter
 * the norms, numel is the tensor's full element count.  A's manifest may
 * override rtol/atol for a tensor name ("tolerances", with a reason); that
 * override applies under every float policy, bitwise included.
 *
 * Untemplated: depends on core only.
 */
#ifndef PAR_MODEL_COMPARE_H
#define PAR_MODEL_COMPARE_H

#include <stdint.h>
#include <stdio.h>

#include "core/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/bounds.h"

typedef enum {
    PAR_POLICY_AUTO = 0, /* from the manifests' "precision" (f64 for bare files) */
    PAR_POLICY_F64,
    PAR_POLICY_F32,
    PAR_POLICY_BF16,
    PAR_POLICY_BITWISE,
    PAR_POLICY_DERIVED, /* per tensor, the bounds of a bounds file (model/bounds.h); opts.bounds */
} par_policy;

/* "auto", "f64", "f32", "bf16", "bitwise", "derived" -> policy; PAR_EINVAL otherwise. */
par_status par_policy_parse(const char *s, par_policy *out);
const char *par_policy_name(par_policy p);
/* The policy a manifest "precision" implies ("f64", "f32", "bf16"). */
par_status par_policy_from_precision(const char *precision, par_policy *out);
/* rtol/atol of a norm policy (0, 0 for bitwise and auto). */
void par_policy_tolerance(par_policy p, double *rtol, double *atol);

#define PAR_CMP_MAX_LIST 32

/* One listed mismatching element. */
typedef struct {
    int64_t index;                /* flat (row-major) index */
    int64_t coord[PAR_MAX_DIMS];  /* its coordinates */
    double a, b;                  /* values of A and B (integers converted) */
    int64_t ia, ib;               /* exact values, integer tensors only */
    double err;                   /* |A-B|; +inf for a non-finite mismatch */
    char where[200];              /* decoded meaning: layer, expert, row, ... */
    int has_margin;               /* derived policy, a router flip: margin = A's K-th minus (K+1)-th score */
    double margin;
} par_cmp_elem;

/* Which sides hold an entry. */
typedef enum {
    PAR_CMP_BOTH = 0,   /* both sides (or an entry about both: a config key, no step in common) */
    PAR_CMP_ONLY_A,     /* missing in B */
    PAR_CMP_ONLY_B,     /* missing in A (extra in B) */
    PAR_CMP_SELECTION,  /* about the selection itself: an --only pattern that matched nothing, --subset with
                           nothing in common */
} par_cmp_side;

typedef struct {
    char *file;         /* file name the tensor is in (both sides) */
    char *tensor;       /* tensor name; "" for an entry about a whole file */
    int pass;           /* 1 pass, 0 fail */
    par_cmp_side side;  /* which sides hold it: a missing entry is no divergence (model/rootcause.h) */
    int left_out;       /* --subset: in A only, not judged (pass stays 1) */
    char reason[240];   /* why it failed; "" when it passed */
    const char *mode;   /* "f64", "f32", "bf16", "bitwise", "override", "integer", "-" */
    char *override_reason; /* A manifest's reason when an override applied (owned) */
    par_dtype dtype;    /* A's (B's when missing in A) */
    int ndim;
    int64_t shape[PAR_MAX_DIMS];
    int64_t numel;
    double rtol, atol;  /* tolerances used (norm modes) */
    double max_abs;     /* max |A-B| over finite pairs */
    double max_rel;     /* max |A-B|/|A| over finite pairs with A != 0 */
    double rel_l2;      /* ||A-B|| / ||A|| (0 when both are 0, inf when only A is) */
    double diff_norm;   /* ||A-B||_2 over finite pairs */
    double bound;       /* rtol ||A||_2 + atol sqrt(numel) */
    int64_t n_diff;     /* elements whose bits differ */
    int64_t n_nonfinite;/* positions where NaN/Inf do not agree */
    int64_t rows_differ; /* attn.*.selected with A's ties.K: rows [B,S] whose picks differ */
    int64_t tie_rows;    /* of them, rows whose picks differ only among A's exact ties (tie order) */
    int nlist;
    par_cmp_elem *list; /* largest errors first (ties: lower index first) */
    /* the derived policy (model/bounds.h) */
    char *bound_source;  /* where the bound came from (owned), NULL under other policies */
    double cosine;       /* float tensors: cos(A, B) (1 when both are 0) */
    int64_t flips, flips_allowed; /* margin: tokens whose picks differ, those within eps */
} par_cmp_entry;

typedef struct {
    par_policy policy;  /* default PAR_POLICY_AUTO */
    int max_list;       /* elements listed per failing tensor (default 5, at most PAR_CMP_MAX_LIST) */
    /* A partial comparison (a dump of a few tensors, a forward-only dump):
     *   only     n_only glob patterns (fnmatch); an entry is compared when its
     *            tensor name matches one, or "FILEGLOB:TENSORGLOB" matches
     *            its file and tensor; the others are not entries at all.  A
     *            pattern that matches nothing on either side is a failing
     *            entry (a typo must not pass as "nothing diverged").
     *   subset   entries of A that B lacks (tensors, and whole files) are
     *            left out, listed and counted, not failed; B's extra entries
     *            still fail; nothing in common at all fails.
     * A file one side lacks is then read from the other side and judged
     * tensor by tensor.  Config keys (manifest.json) are compared always. */
    const char *const *only;
    int n_only;
    int subset;
    /* Exact ties (issue 33): a golden set's ties.K.safetensors (model/golden.h
     * par_golden_write_ties) marks, per indexer query row, the entries scored
     * exactly the top-k boundary's score where that score spans the boundary.
     * When A has it (a set's, or the ties.K file next to a bare step.K
     * file), attn.<block>.selected rows whose picks differ only among those
     * entries are a tie-order difference: counted (tie_rows), reported, and
     * the entry passes unless strict_ties.  Rows that differ elsewhere fail
     * as before. */
    int strict_ties;
    /* 1: two directories' manifests are read without checking their files'
     * sha256 (par_manifest_read_unverified): sets this process wrote itself
     * a moment ago (the matrix's).  0 (default): every file is hashed. */
    int trust_hashes;
    /* PAR_POLICY_DERIVED: the bounds (model/bounds.h; not owned); for two
     * directories they must have been derived from A (sha256 of its files). */
    const par_bounds *bounds;
} par_compare_opts;

void par_compare_opts_init(par_compare_opts *o);

typedef struct par_compare_report par_compare_report;

/* Compares two golden-set directories or two safetensors files.  PAR_OK when
 * the comparison ran (the verdict is in the report); an error when an input
 * is missing or unreadable, a directory's manifest is bad, or one side is a
 * directory and the other a file.  *out set only on success. */
par_status par_compare_paths(const char *a, const char *b, const par_compare_opts *o, par_compare_report **out);
/* Compares two loaded files (policy AUTO means f64).  `file` labels the
 * entries (NULL: A's label). */
par_status par_compare_st(const par_st_file *a, const par_st_file *b, const char *file, const par_compare_opts *o,
                          par_compare_report **out);

int par_compare_report_ok(const par_compare_report *r);       /* 1 if every entry passed */
int par_compare_report_count(const par_compare_report *r);
int par_compare_report_failed(const par_compare_report *r);   /* failing entries */
int par_compare_report_left_out(const par_compare_report *r); /* --subset: entries of A not in B */
int par_compare_report_unselected(const par_compare_report *r); /* --only: tensors matching no pattern */
int par_compare_report_tie_entries(const par_compare_report *r); /* entries with tie-order rows */
const par_cmp_entry *par_compare_report_entry(const par_compare_report *r, int i);
/* First entry for (file, tensor); file NULL matches any file. */
const par_cmp_entry *par_compare_report_find(const par_compare_report *r, const char *file, const char *tensor);
par_policy par_compare_report_policy(const par_compare_report *r); /* resolved (never AUTO) */
/* Directories: the steps compared (cmp, those both sets hold; cmp[0] >
 * cmp[1] when none) and each set's (manifest first_step..steps); files
 * outside cmp are not compared.  0 for two bare files. */
int par_compare_report_steps(const par_compare_report *r, int64_t cmp[2], int64_t a[2], int64_t b[2]);
/* Summary table: failing entries with their listed elements, then counts;
 * verbose prints every entry. */
void par_compare_report_print(const par_compare_report *r, FILE *out, int verbose);
/* The full report as JSON, written atomically. */
par_status par_compare_report_write_json(const par_compare_report *r, const char *path);
void par_compare_report_free(par_compare_report *r); /* NULL is fine */

#endif
