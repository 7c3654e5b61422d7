// The element-wise engine's instruction codes and its register interpreter (conv_tail_registers.cc), shared by
// conv_tail.cc's chunk interpreter and bindings, and through conv_tail.h's HardSwishTail by the conv kernels.
#pragma once

#include <cstdint>

namespace npu_ep::kern::tail_code {

// Instruction codes, as CODES in kernels/fusion/conv_tail.py.
enum Code : int32_t {
  kMul,
  kAdd,
  kSub,
  kRsub,
  kDiv,
  kRdiv,
  kClip,
  kSave,
  kMulSaved,
  kAddSaved,
  kSigmoid,
  kErf,
  kLeakyRelu,
  kTanh,
  kPowHalf,
  kExp,
  kLog,
  kAbs,
  kFloor,
  kCeil,
  kRound,
  kSign,
  kDivSaved,
  kElu,
  kSoftplus,
  kSin,
  kCos,
  kSoftsign
};

// Whether RunInRegisters takes this program on this host (an AVX2/AVX-512 ISA active, every code one it knows).
bool FitsRegisters(const int32_t* codes, int64_t n_codes);

// The program over in[0, n) into out[0, n) (in == out: in place), every instruction applied to a block of a few
// vectors held in registers before the next block is loaded: one pass over the data instead of one per instruction.
// Each instruction is the chunk interpreter's float32 operation per element (the same bits); only for programs
// FitsRegisters accepts.
void RunInRegisters(const float* in, float* out, int64_t n, const int32_t* codes, const float* consts, int64_t n_codes);

// RunInRegisters of in[i] + bias[i] (bias[0, n): a float32 add as each vector is loaded, then the program): the
// bits of that add followed by the program (BiasGelu's x + bias).
void RunInRegistersBias(const float* in, const float* bias, float* out, int64_t n, const int32_t* codes,
                        const float* consts, int64_t n_codes);

// Whether the program is HardSwish's (save; mul a; add b; clip lo hi with lo <= hi; mul_saved); then hs = {a, b, lo,
// hi}, for a kernel that applies it in its registers as v * max(lo, min(hi, v * a + b)): RunInRegisters' operations
// in its order.
bool HardSwishProgram(const int32_t* codes, const float* consts, int64_t n_codes, float* hs);

}  // namespace npu_ep::kern::tail_code
