// The GPU's ceilings for the check program: streaming-read bandwidth (16-byte loads over a
// buffer far larger than L2, summed so nothing is optimized away) and the bf16 mma.sync peak
// (independent accumulator chains in registers, no memory traffic).
#include <algorithm>
#include <vector>

#include "common.cuh"
#include "kernels.cuh"

namespace conduit {
namespace cuda {

namespace {

__global__ void read_kernel(const uint4* __restrict__ data, size_t count, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // practically never: keeps the loads alive
}

constexpr int kMmaChains = 8;
constexpr int kMmaIterations = 4096;

__global__ void mma_peak_kernel(float* sink) {
  uint32_t a[4] = {threadIdx.x, threadIdx.x + 1, threadIdx.x + 2, threadIdx.x + 3};
  uint32_t b0 = threadIdx.x * 3, b1 = threadIdx.x * 5;
  float c[kMmaChains][4] = {};
  for (int i = 0; i < kMmaIterations; ++i) {
#pragma unroll
    for (int chain = 0; chain < kMmaChains; ++chain) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(c[chain][0]), "+f"(c[chain][1]), "+f"(c[chain][2]), "+f"(c[chain][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
  }
  float total = 0;
  for (int chain = 0; chain < kMmaChains; ++chain) total += c[chain][0] + c[chain][1] + c[chain][2] + c[chain][3];
  if (total == 1234.5f) *sink = total;
}

struct Timer {
  cudaEvent_t start, stop;
  Timer() {
    CDC_CHECK(cudaEventCreate(&start));
    CDC_CHECK(cudaEventCreate(&stop));
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  double seconds() const {
    float ms = 0;
    CDC_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return double(ms) / 1e3;
  }
};

}  // namespace

double probe_read_bandwidth(int32_t device, size_t size_bytes, int32_t repeats) {
  CDC_CHECK(cudaSetDevice(device));
  cudaDeviceProp props{};
  CDC_CHECK(cudaGetDeviceProperties(&props, device));
  void* data = nullptr;
  uint32_t* sink = nullptr;
  CDC_CHECK(cudaMalloc(&data, size_bytes));
  CDC_CHECK(cudaMalloc(&sink, sizeof(uint32_t)));
  CDC_CHECK(cudaMemset(data, 1, size_bytes));
  const size_t count = size_bytes / sizeof(uint4);
  const int blocks = props.multiProcessorCount * 8;
  Timer timer;
  double best = 0;
  for (int32_t r = 0; r <= repeats; ++r) {  // the first is a warm-up
    CDC_CHECK(cudaEventRecord(timer.start));
    read_kernel<<<blocks, 512>>>(static_cast<const uint4*>(data), count, sink);
    CDC_CHECK_LAUNCH();
    CDC_CHECK(cudaEventRecord(timer.stop));
    CDC_CHECK(cudaEventSynchronize(timer.stop));
    if (r > 0) best = std::max(best, double(count * sizeof(uint4)) / timer.seconds());
  }
  cudaFree(data);
  cudaFree(sink);
  return best;
}

double probe_mma_peak(int32_t device) {
  CDC_CHECK(cudaSetDevice(device));
  cudaDeviceProp props{};
  CDC_CHECK(cudaGetDeviceProperties(&props, device));
  float* sink = nullptr;
  CDC_CHECK(cudaMalloc(&sink, sizeof(float)));
  const int blocks = props.multiProcessorCount * 4;
  const int threads = 256;
  Timer timer;
  double best = 0;
  for (int r = 0; r < 4; ++r) {
    CDC_CHECK(cudaEventRecord(timer.start));
    mma_peak_kernel<<<blocks, threads>>>(sink);
    CDC_CHECK_LAUNCH();
    CDC_CHECK(cudaEventRecord(timer.stop));
    CDC_CHECK(cudaEventSynchronize(timer.stop));
    const double flops = double(blocks) * (threads / 32) * kMmaIterations * kMmaChains * (2.0 * 16 * 8 * 16);
    if (r > 0) best = std::max(best, flops / timer.seconds());
  }
  cudaFree(sink);
  return best;
}

}  // namespace cuda
}  // namespace conduit
