// router_logits' CUDA tiles side by side (kernels/csrc/cuda/router_logits.cu, whose RouterLogits picks one by N), with
// cuBLAS's float32 gemm (the fast mode's router) beside them: us per launch at Kimi-K2's router (384 experts x 7,168,
// x in bfloat16), the weight rotated over 8 copies (88 MB, past L2), timed as a CUDA graph of 200 launches. Every tile
// must give the first tile's bits ('!' marks one that does not: each keeps the order of router_order.h). Built and run
// by `bash benchmarks/h200_session.sh router` (nvcc and cuBLAS; no torch).
#include <cublas_v2.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "../kernels/csrc/cuda/router_logits.cu"  // the kernel and its tiles

using ddtree::cuda::RouterLogitsArgs;

#define CHECK(...)                                                                    \
  do {                                                                                \
    const cudaError_t err = (__VA_ARGS__);                                            \
    if (err != cudaSuccess) {                                                         \
      std::printf("%s: %s\n", #__VA_ARGS__, cudaGetErrorString(err));                 \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

constexpr int kWidth = 7168, kExperts = 384, kCopies = 8, kMaxRows = 257, kReps = 200;

struct Tile {
  const char* name;  // experts a warp x rows a block x weight chunks in flight
  cudaError_t (*launch)(const RouterLogitsArgs&, cudaStream_t);
};

// us per call of enqueue(i) (i: the call's index, for the weight's rotation), replayed as one graph of kReps calls.
float graph_us(cudaStream_t stream, const std::function<void(int)>& enqueue) {
  for (int i = 0; i < 20; ++i) enqueue(i);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kReps; ++i) enqueue(i);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t start, end;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&end));
  CHECK(cudaEventRecord(start, stream));
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaEventRecord(end, stream));
  CHECK(cudaEventSynchronize(end));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, end));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return ms * 1e3f / kReps;
}

}  // namespace

int main() {
  using namespace ddtree::cuda;
  const Tile tiles[] = {{"1x4x8", launch_router<1, 4, 8>},   {"1x8x8", launch_router<1, 8, 8>},
                        {"1x16x8", launch_router<1, 16, 8>}, {"2x4x4", launch_router<2, 4, 4>},
                        {"2x8x4", launch_router<2, 8, 4>},   {"2x16x4", launch_router<2, 16, 4>},
                        {"4x4x2", launch_router<4, 4, 2>},   {"4x8x2", launch_router<4, 8, 2>},
                        {"4x16x2", launch_router<4, 16, 2>}, {"4x16x1", launch_router<4, 16, 1>},
                        {"8x8x1", launch_router<8, 8, 1>}};
  const size_t weight_size = static_cast<size_t>(kExperts) * kWidth;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  std::vector<float> host_w(weight_size), host_xf(static_cast<size_t>(kMaxRows) * kWidth);
  std::vector<__nv_bfloat16> host_x(host_xf.size());
  for (float& v : host_w) v = normal(gen) / 84.0f;
  for (size_t i = 0; i < host_x.size(); ++i) {
    host_x[i] = __float2bfloat16(normal(gen));
    host_xf[i] = __bfloat162float(host_x[i]);  // the gemm's float32 copy of x
  }
  float *w, *xf, *out, *first;
  __nv_bfloat16* x;
  CHECK(cudaMalloc(&w, sizeof(float) * weight_size * kCopies));
  CHECK(cudaMalloc(&x, sizeof(__nv_bfloat16) * host_x.size()));
  CHECK(cudaMalloc(&xf, sizeof(float) * host_xf.size()));
  CHECK(cudaMalloc(&out, sizeof(float) * kMaxRows * kExperts));
  CHECK(cudaMalloc(&first, sizeof(float) * kMaxRows * kExperts));
  for (int c = 0; c < kCopies; ++c) {
    CHECK(cudaMemcpy(w + c * weight_size, host_w.data(), sizeof(float) * weight_size, cudaMemcpyHostToDevice));
  }
  CHECK(cudaMemcpy(x, host_x.data(), sizeof(__nv_bfloat16) * host_x.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(xf, host_xf.data(), sizeof(float) * host_xf.size(), cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(blas, stream) != CUBLAS_STATUS_SUCCESS) {
    std::printf("cuBLAS did not start\n");
    return 1;
  }

  std::printf("%-6s", "N");
  for (const Tile& tile : tiles) std::printf("%9s", tile.name);
  std::printf("%9s\n", "sgemm");
  for (const int rows : {1, 4, 8, 17, 33, 65, 129, 257}) {
    const size_t num_out = static_cast<size_t>(rows) * kExperts;
    RouterLogitsArgs args{x, kWidth, w, first, rows, kExperts, kWidth, true};
    CHECK(tiles[0].launch(args, stream));
    CHECK(cudaStreamSynchronize(stream));
    std::vector<float> want(num_out), got(num_out);
    CHECK(cudaMemcpy(want.data(), first, sizeof(float) * num_out, cudaMemcpyDeviceToHost));
    std::printf("%-6d", rows);
    for (const Tile& tile : tiles) {
      args.out = out;
      args.weight = w;
      CHECK(cudaMemset(out, 0xff, sizeof(float) * num_out));  // NaN: an unwritten logit differs
      CHECK(tile.launch(args, stream));
      CHECK(cudaStreamSynchronize(stream));
      CHECK(cudaMemcpy(got.data(), out, sizeof(float) * num_out, cudaMemcpyDeviceToHost));
      const bool same = std::memcmp(got.data(), want.data(), sizeof(float) * num_out) == 0;
      const float us = graph_us(stream, [&](int i) {
        args.weight = w + (i % kCopies) * weight_size;
        CHECK(tile.launch(args, stream));
      });
      std::printf("%8.1f%s", us, same ? " " : "!");
    }
    const float one = 1.0f, zero = 0.0f;
    const float us = graph_us(stream, [&](int i) {
      cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, kExperts, rows, kWidth, &one, w + (i % kCopies) * weight_size, kWidth,
                  xf, kWidth, &zero, out, kExperts);
    });
    std::printf("%8.1f\n", us);
  }
  std::printf("tiles: experts a warp x rows a block x weight chunks in flight; bytes floor: 11 MB of weight at the "
              "copy bandwidth (3.7 us on an H100); '!': bits differ from the 1x4x8 tile\n");
  return 0;
}
