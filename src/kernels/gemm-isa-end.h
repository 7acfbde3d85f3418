/* kernels/gemm-isa-end.h - undefines an instruction set's macros of
 * kernels/gemm-ukr.h (gemm.c: after the set's last tile).  No include
 * guard: included once per instruction set. */
#undef UKR_ATTR
#undef VEC
#undef VW
#undef V_LOAD
#undef V_STORE
#undef V_SET1
#undef V_ZERO
#undef V_FMA
#undef V_MUL
#undef V_ADD
