// The order in which router_logits reduces one logit (contract: kernels/ops.py), shared by the CPU kernel and named by
// the CUDA one, which follows it lane by lane: 32 chains, then a butterfly. Fixed by H alone, so a row's logits have
// the same bits whatever the call holds.
#pragma once

namespace ddtree {

constexpr int kRouterLanes = 32;  // the chains of one dot product: a warp's lanes on CUDA
constexpr int kRouterChunk = 4;   // columns a chain takes at a time where H is a multiple of it (a float4 of weight)

}  // namespace ddtree
