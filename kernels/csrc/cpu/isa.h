// Which instruction set the CPU kernels run: the widest this CPU has, or DDTREE_CPU_ISA's choice.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

#include "simd.h"

namespace ddtree::cpu {

enum class Isa { kGeneric, kAvx2, kAvx512 };

inline bool cpu_has(Isa isa) {
#ifdef DDTREE_X86_64
  if (isa == Isa::kAvx512) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  if (isa == Isa::kAvx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return isa == Isa::kGeneric;
}

// DDTREE_CPU_ISA = avx512 | avx2 | generic forces one (an error if this CPU lacks it); auto or unset picks the
// widest. Read at each call, like the CUDA ops' kernel switches, so a test can run every path.
inline Isa chosen_isa() {
  const char* env = std::getenv("DDTREE_CPU_ISA");
  const std::string name = env == nullptr ? "auto" : env;
  if (name.empty() || name == "auto") {
    return cpu_has(Isa::kAvx512) ? Isa::kAvx512 : cpu_has(Isa::kAvx2) ? Isa::kAvx2 : Isa::kGeneric;
  }
  const Isa isa = name == "avx512" ? Isa::kAvx512 : name == "avx2" ? Isa::kAvx2 : Isa::kGeneric;
  TORCH_CHECK(name == "avx512" || name == "avx2" || name == "generic", "DDTREE_CPU_ISA must be auto, avx512, avx2 ",
              "or generic, got '", name, "'");
  TORCH_CHECK(cpu_has(isa), "DDTREE_CPU_ISA=", name, " but this CPU (or build) lacks it: unset DDTREE_CPU_ISA ",
              "or set it to auto to use the widest instruction set the CPU has");
  return isa;
}

}  // namespace ddtree::cpu
