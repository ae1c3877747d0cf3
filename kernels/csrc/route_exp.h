// The router's exp, one function for the CPU and CUDA kernels of moe_route: the same float operations in the same
// order (every multiply-add an explicit fma), so a score has the same bits on both devices, within 2 ulp of exp.
// Library exps differ by device (glibc's expf, CUDA's expf, a double exp rounded once is 10x slower on a GPU), and a
// one-ulp difference can swap two near-tied experts.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define DDTREE_HOST_DEVICE __host__ __device__
#else
#define DDTREE_HOST_DEVICE
#endif

namespace ddtree {

// exp(x) in float: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts), e^r by its degree-7 Taylor polynomial
// (truncation under 1e-8 relative), then times 2^n. NaN stays NaN; past the float range, inf or 0.
DDTREE_HOST_DEVICE inline float route_exp(float x) {
  if (x != x) return x;
  if (x > 88.8f) return INFINITY;
  if (x < -104.0f) return 0.0f;
  const float n = rintf(x * 1.44269504f);
  float r = fmaf(n, -0.693145752f, x);  // ln2's leading bits, exact in the product
  r = fmaf(n, -1.42860677e-6f, r);      // the rest of ln2
  float p = 1.0f / 5040.0f;
  p = fmaf(p, r, 1.0f / 720.0f);
  p = fmaf(p, r, 1.0f / 120.0f);
  p = fmaf(p, r, 1.0f / 24.0f);
  p = fmaf(p, r, 1.0f / 6.0f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  return ldexpf(p, static_cast<int>(n));
}

}  // namespace ddtree
