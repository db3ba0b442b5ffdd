// y = x . w^T with bf16 tensor cores (mma.sync m16n8k16, fp32 accumulators) for bf16 and Q8_0
// weights, the same chains for every row count. K is split into gemm_splits(n, k) fixed
// segments; each output is, per segment, one accumulator chained over its k16 steps in order,
// and the segments' sums are added in segment order: by a reduce kernel over partials when the
// rows are few (so enough blocks stream the weights), inside the block when they are many (no
// partial traffic). Both add the same fp32 values in the same order, so which way a row goes
// never shows in its bits. Q8_0: each 32-block's int8 values are exact in bf16; a block's dot
// product is chained from zero and scaled by its fp16 scale into the accumulator.
#include <algorithm>

#include "common.cuh"
#include "kernels.cuh"

namespace conduit {
namespace cuda {

namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kPad = 8;        // bf16 elements after each 32-element shared row: conflict-free fragments

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async_16(void* shared, const void* global, bool valid) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Two int8 weights as a bf16 pair (exact).
__device__ __forceinline__ uint32_t int8_pair_to_bf16x2(uint16_t pair) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(float(int8_t(pair & 0xff)), float(int8_t(pair >> 8)));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A block of WARPS_M x WARPS_N warps, each 16*MT rows x 8*NT columns; BK = 32 per stage.
template <int WARPS_M, int WARPS_N, int MT, int NT, bool Q8>
struct Tile {
  static constexpr int BM = WARPS_M * 16 * MT;
  static constexpr int BN = WARPS_N * 8 * NT;
  static constexpr int kAStride = kGemmKStep + kPad;           // bf16 elements
  static constexpr int kBStride = Q8 ? kGemmKStep + 16 : kGemmKStep + kPad;  // int8 bytes or bf16 elements
  static constexpr int kABytes = BM * kAStride * 2;
  static constexpr int kBBytes = Q8 ? BN * kBStride : BN * kBStride * 2;
  static constexpr int kScaleBytes = Q8 ? BN * 2 : 0;
  static constexpr int kStageBytes = kABytes + kBBytes + kScaleBytes;
};

constexpr int kStages = 4;

// One block: rows [m0, m0 + BM), columns [n0, n0 + BN), K segments [split_begin, split_end).
// IN_BLOCK: every segment here, summed in order into the output; else one segment into partials.
template <int WARPS_M, int WARPS_N, int MT, int NT, bool Q8, bool IN_BLOCK>
__global__ void __launch_bounds__(kThreads) gemm_kernel(const __nv_bfloat16* __restrict__ x, int32_t x_stride,
                                                         int32_t num_rows, const void* __restrict__ w_values,
                                                         const __half* __restrict__ w_scales, int32_t n,
                                                         int32_t n_padded, int32_t k_padded, int32_t num_splits,
                                                         float* __restrict__ y, int32_t y_stride, bool accumulate,
                                                         float* __restrict__ partials,
                                                         const int32_t* __restrict__ group_starts) {
  using T = Tile<WARPS_M, WARPS_N, MT, NT, Q8>;
  extern __shared__ __align__(16) uint8_t smem[];
  if (group_starts != nullptr) {
    // Grouped (MoE): block z runs group z's rows [starts[z], starts[z + 1]) on its own matrix,
    // the z-th of a stack; every row's chains are those of an ungrouped launch.
    const int32_t first_row = group_starts[blockIdx.z];
    num_rows = group_starts[blockIdx.z + 1] - first_row;
    if (int32_t(blockIdx.y) * T::BM >= num_rows) return;
    x += size_t(first_row) * x_stride;
    y += size_t(first_row) * y_stride;
    w_values = static_cast<const uint8_t*>(w_values) + size_t(blockIdx.z) * n_padded * k_padded * (Q8 ? 1 : 2);
    if constexpr (Q8) w_scales += size_t(blockIdx.z) * (k_padded / kGemmKStep) * n_padded;
  }
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid & 31;
  const int group = lane >> 2;
  const int tig = lane & 3;
  const int warp_m = warp / WARPS_N;
  const int warp_n = warp % WARPS_N;
  const int m0 = blockIdx.y * T::BM;
  const int n0 = blockIdx.x * T::BN;
  const int steps_total = k_padded / kGemmKStep;
  const int steps_per_split = steps_total / num_splits;  // gemm_splits divides evenly
  const int split_begin = IN_BLOCK ? 0 : int(blockIdx.z);
  const int split_end = IN_BLOCK ? num_splits : int(blockIdx.z) + 1;
  const int step_begin = split_begin * steps_per_split;
  const int step_end = split_end * steps_per_split;

  auto stage_a = [&](int s) { return reinterpret_cast<__nv_bfloat16*>(smem + s * T::kStageBytes); };
  auto stage_b = [&](int s) { return smem + s * T::kStageBytes + T::kABytes; };
  auto stage_scales = [&](int s) {
    return reinterpret_cast<__half*>(smem + s * T::kStageBytes + T::kABytes + T::kBBytes);
  };

  auto load_stage = [&](int s, int step) {
    const int k0 = step * kGemmKStep;
    __nv_bfloat16* a = stage_a(s);
    // A: BM rows x 32 bf16 = 4 chunks of 16 bytes per row; rows past num_rows zero-filled.
    for (int chunk = tid; chunk < T::BM * 4; chunk += kThreads) {
      const int r = chunk / 4;
      const int c = (chunk % 4) * 8;
      const int row = m0 + r;
      const bool valid = row < num_rows;
      const __nv_bfloat16* source = x + size_t(valid ? row : 0) * x_stride + k0 + c;
      cp_async_16(a + r * T::kAStride + c, source, valid);
    }
    uint8_t* b = stage_b(s);
    if constexpr (Q8) {
      const int8_t* values = static_cast<const int8_t*>(w_values);
      for (int chunk = tid; chunk < T::BN * 2; chunk += kThreads) {
        const int r = chunk / 2;
        const int c = (chunk % 2) * 16;
        cp_async_16(b + r * T::kBStride + c, values + size_t(n0 + r) * k_padded + k0 + c, true);
      }
      // Scales are [k_padded / 32][n_padded]: this step's BN scales are contiguous.
      const __half* scales = w_scales + size_t(step) * n_padded + n0;
      for (int chunk = tid; chunk < T::BN / 8; chunk += kThreads) {
        cp_async_16(stage_scales(s) + chunk * 8, scales + chunk * 8, true);
      }
    } else {
      const __nv_bfloat16* values = static_cast<const __nv_bfloat16*>(w_values);
      __nv_bfloat16* bb = reinterpret_cast<__nv_bfloat16*>(b);
      for (int chunk = tid; chunk < T::BN * 4; chunk += kThreads) {
        const int r = chunk / 4;
        const int c = (chunk % 4) * 8;
        cp_async_16(bb + r * T::kBStride + c, values + size_t(n0 + r) * k_padded + k0 + c, true);
      }
    }
  };

  float total[MT][NT][4];
  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) total[i][j][e] = 0.0f;

  // The pipeline runs over [step_begin, step_end) continuously; segment boundaries only reset
  // and fold the accumulators.
  const int num_steps = step_end - step_begin;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_steps) load_stage(s, step_begin + s);
    cp_async_commit();
  }
  for (int i = 0; i < num_steps; ++i) {
    const int step = step_begin + i;
    if ((step - step_begin) % steps_per_split == 0) {
#pragma unroll
      for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[a][b][e] = 0.0f;
    }
    cp_async_wait<kStages - 2>();
    __syncthreads();
    // Refill the stage consumed last iteration.
    if (i + kStages - 1 < num_steps) load_stage((i + kStages - 1) % kStages, step + kStages - 1);
    cp_async_commit();

    const int s = i % kStages;
    const __nv_bfloat16* a_tile = stage_a(s);
    float block[MT][NT][4];
    if constexpr (Q8) {
#pragma unroll
      for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b)
#pragma unroll
          for (int e = 0; e < 4; ++e) block[a][b][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kGemmKStep; kk += 16) {
      uint32_t a_frag[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r = warp_m * 16 * MT + mt * 16 + group;
        const __nv_bfloat16* base = a_tile + r * T::kAStride + kk + 2 * tig;
        a_frag[mt][0] = *reinterpret_cast<const uint32_t*>(base);
        a_frag[mt][1] = *reinterpret_cast<const uint32_t*>(base + 8 * T::kAStride);
        a_frag[mt][2] = *reinterpret_cast<const uint32_t*>(base + 8);
        a_frag[mt][3] = *reinterpret_cast<const uint32_t*>(base + 8 * T::kAStride + 8);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = warp_n * 8 * NT + nt * 8 + group;
        uint32_t b0, b1;
        if constexpr (Q8) {
          const uint8_t* base = stage_b(s) + col * T::kBStride + kk + 2 * tig;
          b0 = int8_pair_to_bf16x2(*reinterpret_cast<const uint16_t*>(base));
          b1 = int8_pair_to_bf16x2(*reinterpret_cast<const uint16_t*>(base + 8));
        } else {
          const __nv_bfloat16* base = reinterpret_cast<const __nv_bfloat16*>(stage_b(s)) + col * T::kBStride + kk + 2 * tig;
          b0 = *reinterpret_cast<const uint32_t*>(base);
          b1 = *reinterpret_cast<const uint32_t*>(base + 8);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (Q8) {
            mma_bf16(block[mt][nt], a_frag[mt], b0, b1);
          } else {
            mma_bf16(acc[mt][nt], a_frag[mt], b0, b1);
          }
        }
      }
    }
    if constexpr (Q8) {
      // acc += block * scale of the block's column (c0, c2 at column 2 tig; c1, c3 at 2 tig + 1).
      const __half* scales = stage_scales(s);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = warp_n * 8 * NT + nt * 8 + 2 * tig;
        const float s0 = __half2float(scales[col]);
        const float s1 = __half2float(scales[col + 1]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          acc[mt][nt][0] += block[mt][nt][0] * s0;
          acc[mt][nt][1] += block[mt][nt][1] * s1;
          acc[mt][nt][2] += block[mt][nt][2] * s0;
          acc[mt][nt][3] += block[mt][nt][3] * s1;
        }
      }
    }
    // A segment's end folds its sums into the total, segments in order (the first is the total).
    if ((step + 1 - step_begin) % steps_per_split == 0) {
      const bool first_segment = step + 1 - step_begin == steps_per_split;
#pragma unroll
      for (int a = 0; a < MT; ++a)
#pragma unroll
        for (int b = 0; b < NT; ++b)
#pragma unroll
          for (int e = 0; e < 4; ++e) total[a][b][e] = first_segment ? acc[a][b][e] : total[a][b][e] + acc[a][b][e];
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = m0 + warp_m * 16 * MT + mt * 16 + group + (e >= 2 ? 8 : 0);
        const int col = n0 + warp_n * 8 * NT + nt * 8 + 2 * tig + (e & 1);
        if (row >= num_rows || col >= n) continue;
        if constexpr (IN_BLOCK) {
          float* out = y + size_t(row) * y_stride + col;
          *out = accumulate ? *out + total[mt][nt][e] : total[mt][nt][e];
        } else {
          partials[(size_t(blockIdx.z) * num_rows + row) * n_padded + col] = total[mt][nt][e];
        }
      }
    }
  }
}

// The segments' partial sums added in segment order, then stored or added to y.
__global__ void reduce_splits_kernel(const float* __restrict__ partials, int32_t num_splits, int32_t num_rows, int32_t n,
                                     int32_t n_padded, float* __restrict__ y, int32_t y_stride, bool accumulate) {
  const int32_t col = blockIdx.x * blockDim.x + threadIdx.x;
  const int32_t row = blockIdx.y;
  if (col >= n) return;
  float sum = partials[size_t(row) * n_padded + col];
  for (int32_t s = 1; s < num_splits; ++s) sum = sum + partials[(size_t(s) * num_rows + row) * n_padded + col];
  float* out = y + size_t(row) * y_stride + col;
  *out = accumulate ? *out + sum : sum;
}

// Few rows: 16 x 128 blocks, one K segment each. Many rows: 64 x 64 (Q8) or 128 x 64 (bf16)
// blocks over all of K.
constexpr int32_t kFewRows = 32;

// num_groups > 0: a grouped launch, num_rows the most rows one group can have.
template <int WM, int WN, int MT, int NT, bool Q8, bool IN_BLOCK>
void launch_tile(const __nv_bfloat16* x, int32_t x_stride, int32_t num_rows, const DeviceMatrix& w, int32_t splits,
                 float* y, int32_t y_stride, bool accumulate, float* partials, const int32_t* group_starts,
                 int32_t num_groups, cudaStream_t stream) {
  using T = Tile<WM, WN, MT, NT, Q8>;
  const auto kernel = gemm_kernel<WM, WN, MT, NT, Q8, IN_BLOCK>;
  const int shared_bytes = kStages * T::kStageBytes;
  static std::atomic<uint32_t> configured{0};  // per instantiation
  allow_shared_memory(kernel, shared_bytes, configured);
  const dim3 grid(w.n_padded / T::BN, ceil_div(num_rows, T::BM), num_groups > 0 ? num_groups : IN_BLOCK ? 1 : splits);
  kernel<<<grid, kThreads, shared_bytes, stream>>>(x, x_stride, num_rows, w.values, w.scales, w.n, w.n_padded,
                                                   w.k_padded, splits, y, y_stride, accumulate, partials, group_starts);
  CDC_CHECK_LAUNCH();
}

}  // namespace

int32_t gemm_splits(int32_t n, int32_t k_padded) {
  // Enough column-tile x segment blocks to keep a large GPU's SMs streaming (about 256), each
  // segment at least 256 inputs, a power of two dividing the k steps. Never the row count.
  const int32_t column_tiles = ceil_div(n, kGemmRowPad);
  const int32_t steps = k_padded / kGemmKStep;
  int32_t splits = 1;
  while (splits < 16 && column_tiles * splits < 256 && steps % (splits * 2) == 0 && steps / (splits * 2) >= 8) {
    splits *= 2;
  }
  return splits;
}

namespace {
int32_t splits_of(const DeviceMatrix& w) { return w.splits > 0 ? w.splits : gemm_splits(w.n, w.k_padded); }
}  // namespace

size_t gemm_partials_floats(int32_t num_rows, const DeviceMatrix& w) {
  if (num_rows > kFewRows) return 0;
  return size_t(splits_of(w)) * size_t(num_rows) * size_t(w.n_padded);
}

void launch_gemm(const __nv_bfloat16* x, int32_t x_stride, int32_t num_rows, const DeviceMatrix& w, float* y,
                 int32_t y_stride, bool accumulate, float* partials, cudaStream_t stream) {
  if (num_rows == 0) return;
  const int32_t splits = splits_of(w);
  if (num_rows <= kFewRows) {
    if (w.q8) {
      launch_tile<1, 4, 1, 4, true, false>(x, x_stride, num_rows, w, splits, y, y_stride, accumulate, partials,
                                           nullptr, 0, stream);
    } else {
      launch_tile<1, 4, 1, 4, false, false>(x, x_stride, num_rows, w, splits, y, y_stride, accumulate, partials,
                                            nullptr, 0, stream);
    }
    const dim3 grid(ceil_div(w.n, 256), num_rows);
    reduce_splits_kernel<<<grid, 256, 0, stream>>>(partials, splits, num_rows, w.n, w.n_padded, y, y_stride, accumulate);
    CDC_CHECK_LAUNCH();
    return;
  }
  if (w.q8) {
    launch_tile<2, 2, 2, 4, true, true>(x, x_stride, num_rows, w, splits, y, y_stride, accumulate, nullptr,
                                        nullptr, 0, stream);
  } else {
    launch_tile<2, 2, 4, 4, false, true>(x, x_stride, num_rows, w, splits, y, y_stride, accumulate, nullptr,
                                         nullptr, 0, stream);
  }
}

void launch_grouped_gemm(const __nv_bfloat16* x, int32_t x_stride, int32_t max_group_rows, const DeviceMatrix& w,
                         const int32_t* group_starts, int32_t num_groups, float* y, int32_t y_stride,
                         cudaStream_t stream) {
  if (max_group_rows == 0) return;
  // Every segment inside the block, in order: the same fp32 additions as launch_gemm's either path.
  const int32_t splits = splits_of(w);
  if (max_group_rows <= kFewRows) {
    if (w.q8) {
      launch_tile<1, 4, 1, 4, true, true>(x, x_stride, max_group_rows, w, splits, y, y_stride, false, nullptr,
                                          group_starts, num_groups, stream);
    } else {
      launch_tile<1, 4, 1, 4, false, true>(x, x_stride, max_group_rows, w, splits, y, y_stride, false, nullptr,
                                           group_starts, num_groups, stream);
    }
  } else if (w.q8) {
    launch_tile<2, 2, 2, 4, true, true>(x, x_stride, max_group_rows, w, splits, y, y_stride, false, nullptr,
                                        group_starts, num_groups, stream);
  } else {
    launch_tile<2, 2, 4, 4, false, true>(x, x_stride, max_group_rows, w, splits, y, y_stride, false, nullptr,
                                         group_starts, num_groups, stream);
  }
}

}  // namespace cuda
}  // namespace conduit
