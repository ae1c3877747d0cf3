// The bfloat16 tensor-core path of verify_attn (R = 512, P = 64): what it takes, how many KV splits it
// wants, and its launch. verify_attn.cu dispatches to it; everything else runs on the CUDA-core kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "verify_attn.cuh"

namespace ddtree::cuda::tc {

// The shapes and alignment this path handles.
bool supported(const VerifyAttnArgs<__nv_bfloat16>& a);

// The split count with the least modelled time on num_sms multiprocessors.
int num_splits(int num_nodes, int num_heads, int cache_rows, int num_sms);

// Partial (or, with one split, final) outputs of every query tile and split; the caller combines splits.
cudaError_t launch(const VerifyAttnArgs<__nv_bfloat16>& a, cudaStream_t stream);

}  // namespace ddtree::cuda::tc
