// Compile-time activation element type and weight width of the weight-only kernels, chosen
// per build with -DWO_ELEMENT=0|1|2 (half, bfloat16, float) and -DWO_BITS=4|8.
#pragma once
#include "common.cuh"

#ifndef WO_ELEMENT
#define WO_ELEMENT 0
#endif
#ifndef WO_BITS
#define WO_BITS 4
#endif

#if WO_ELEMENT == 0
typedef __half element_t;
#elif WO_ELEMENT == 1
typedef __nv_bfloat16 element_t;
#elif WO_ELEMENT == 2
typedef float element_t;
#else
#error "WO_ELEMENT must be 0 (half), 1 (bfloat16) or 2 (float)"
#endif

#if WO_BITS != 4 && WO_BITS != 8
#error "WO_BITS must be 4 or 8"
#endif
