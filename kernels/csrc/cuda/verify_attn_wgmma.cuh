// The sm_90a (Hopper) tensor-core path of verify_attn, bfloat16 with R = 512, P = 64: warpgroup MMAs
// (wgmma) reading their operands from shared memory. verify_attn.cu prefers it to the mma.sync path
// (verify_attn_tc.cuh) where the library was built for sm_90a (DDTREE_SM90A, set by kernels.load()) and the
// device is compute capability 9.0.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "verify_attn.cuh"

namespace ddtree::cuda::tc_sm90 {

// Built for sm_90a, running on a compute capability 9.0 device.
bool available();

// The shapes and alignment this path handles (and available()).
bool supported(const VerifyAttnArgs<__nv_bfloat16>& a);

// The split count with the least modelled time on num_sms multiprocessors.
int num_splits(int num_nodes, int num_heads, int cache_rows, int num_sms);

// Partial (or, with one split, final) outputs of every query tile and split; the caller combines splits.
cudaError_t launch(const VerifyAttnArgs<__nv_bfloat16>& a, cudaStream_t stream);

}  // namespace ddtree::cuda::tc_sm90
