// Row-wise softmax behind magpie's C calling convention:
//   int softmax(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream)
// (input pointers, output pointers, every input tensor's sizes, the stream; returns a cudaError_t).
#include <cfloat>
#include <cstdint>
#include <cuda_runtime.h>

constexpr int kThreads = 256;

template <typename Op>
__device__ float block_reduce(float value, Op op, float identity) {
    __shared__ float partial[kThreads / 32];
    for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = value;
    __syncthreads();
    value = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : identity;
    if (threadIdx.x < 32)
        for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
    if (threadIdx.x == 0) partial[0] = value;
    __syncthreads();
    value = partial[0];
    __syncthreads();
    return value;
}

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
    const float* row_in = x + blockIdx.x * cols;
    float* row_out = y + blockIdx.x * cols;
    float peak = -FLT_MAX;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) peak = fmaxf(peak, row_in[c]);
    peak = block_reduce(peak, [](float a, float b) { return fmaxf(a, b); }, -FLT_MAX);
    float total = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) total += expf(row_in[c] - peak);
    total = block_reduce(total, [](float a, float b) { return a + b; }, 0.f);
    const float scale = 1.f / total;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) row_out[c] = expf(row_in[c] - peak) * scale;
}

extern "C" int softmax(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
    softmax_rows<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, y, cols);
    return static_cast<int>(cudaGetLastError());
}
