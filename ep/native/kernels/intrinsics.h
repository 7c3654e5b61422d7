// The x86 SIMD intrinsics for the kernels' AVX2/AVX-512 paths (cpu.h's NPU_EP_X86), with GCC 12's false warnings
// silenced: it flags the deliberately undefined pass-through operand inside AVX-512 intrinsics as uninitialized.
#pragma once

#include "cpu.h"

#if NPU_EP_X86
#include <immintrin.h>
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
