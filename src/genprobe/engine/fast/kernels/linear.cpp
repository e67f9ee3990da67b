// Small-M linear layers for compiled decoding: y = x W^T (+ b), x (M, K), W (N, K), M small; x, b and y
// float32, W float32, bfloat16 or int8 (weight-only: each weight widened exactly to float32 as it is loaded,
// the arithmetic float32; a half or a quarter of the bytes to read where a step is bound by reading its
// weights). An int8 W holds integers: the per-row scale of a quantized layer is applied by the graph after the
// product (genprobe.model.weight_only), where Inductor fuses it with the bias into one pass over y.
//
// A decode step multiplies a handful of rows (one per sequence) by every weight matrix, so each
// product is a matrix-vector product bound by reading W. Inductor generates it as one dot product
// per output with a single accumulator, whose add chain, not memory, sets the pace (about 30 GB/s
// of weights on the benchmark machine, where the L3 streams 55-75 GB/s to one core). These kernels
// keep 8-12 independent FMA accumulators in flight: a tile of MR rows of x times NR rows of W, dot
// products along k (W's rows are contiguous, so no packing is needed and in-place weight edits are
// seen on the next call), lanes summed once per tile.
//
// genprobe.engine.fast.kernels builds this file on first use and registers `genprobe::small_linear`
// with the dispatcher, plus the C entry point behind the shim `aoti_torch_cpu_small_linear` (shim.c)
// through which Inductor's C++ wrapper calls it directly (no dispatcher, no Python) inside a compiled graph.
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "genprobe's small-M linear kernels need AVX2 and FMA (compile with -mavx2 -mfma)"
#endif

namespace genprobe {
bool ggml_block_shape(int64_t type, int64_t* weights, int64_t* bytes);  // ggml.cpp
void ggml_dequantize_rows(int64_t type, const uint8_t* raw, int64_t row_bytes, int64_t K, int64_t rows, float* out,
                          bool avx512);
bool ggml_dot_rows(int64_t type, const float* x, int64_t M, const uint8_t* raw, int64_t row_bytes, int64_t K,
                   const float* bias, float* y, int64_t N, int64_t n0, int64_t n1, bool avx512);
}  // namespace genprobe

namespace {

// A bfloat16 weight as its 16 bits (at::BFloat16's storage): the high half of the float32 it stands for.
using bf16_bits = uint16_t;

// An int8 weight: the integer itself (every int8 is exact in float32).
using i8 = int8_t;

inline float to_float(float v) { return v; }
inline float to_float(i8 v) { return float(v); }
inline float to_float(bf16_bits v) {
  const uint32_t bits = uint32_t(v) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// Eight consecutive weights as float32 (bfloat16 widened exactly: its bits shifted into the high half).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16_bits* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

inline __m256 load8(const i8* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Lanes k .. k+rem-1 of p (rem < 8), zeros elsewhere: the K tail without reading past the row.
template <typename W>
inline __m256 load_tail(const W* p, int64_t rem) {
  W part[8] = {};
  std::memcpy(part, p, size_t(rem) * sizeof(W));
  return load8(part);
}

inline __m256 load_tail(const float* p, int64_t rem) {
  alignas(32) static const int32_t ramp[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(rem)),
                                          _mm256_load_si256(reinterpret_cast<const __m256i*>(ramp)));
  return _mm256_maskload_ps(p, mask);
}

// An int8 weight with a float32 scale per 32 consecutive weights along a row (llama.cpp's Q8_0 blocks, their float16
// scales widened): weight e of the row-major matrix stands for q[e] * d[e / 32]. A pointer into it carries both
// arrays and the element's index, so the kernels' pointer arithmetic (w + n * K + k) works on it unchanged; every
// load starts at a multiple of 8 (16) of a row whose length is a multiple of 32, so it lies inside one block.
// q[e] * d[e / 32] is exact in float32 (8 and 11 significant bits), so the kernels sum exactly the float32 matrix
// the blocks stand for, in the same order: bit for bit the float32 result.
struct BlockI8 {
  static constexpr int64_t kBlock = 32;
  const i8* q;
  const float* d;
  int64_t at;
  BlockI8 operator+(int64_t n) const { return {q, d, at + n}; }
  float scale() const { return d[uint64_t(at) / kBlock]; }  // at >= 0: a shift
};

inline __m256 load8(BlockI8 p) { return _mm256_mul_ps(load8(p.q + p.at), _mm256_set1_ps(p.scale())); }
inline __m256 load_tail(BlockI8 p, int64_t rem) {
  return _mm256_mul_ps(load_tail(p.q + p.at, rem), _mm256_set1_ps(p.scale()));
}

// Weight kk of a row as float32.
template <typename W>
inline float weight_at(const W* row, int64_t kk) { return to_float(row[kk]); }
inline float weight_at(BlockI8 row, int64_t kk) { return float(row.q[row.at + kk]) * (row + kk).scale(); }

// Bytes read per weight (what decides whether a one-row product is worth two threads).
template <typename W>
constexpr int64_t weight_bytes(const W*) { return int64_t(sizeof(W)); }
constexpr int64_t weight_bytes(BlockI8) { return 1; }  // + 4 bytes of scale per 32

inline float lane_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// out[i * ldo + j] = bias[j] + sum_k x[i * K + k] * w[j * K + k] for i < MR, j < NR.
template <int MR, int NR, typename WP>
inline void dot_tile(const float* x, WP w, const float* bias, float* out, int64_t K, int64_t ldo) {
  // Every loop over MR or NR is unrolled explicitly: GCC otherwise keeps the accumulator array in memory and
  // stores it back on every iteration (measured: 2.5x slower).
  __m256 acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t k8 = K & ~int64_t(7);
  for (int64_t k = 0; k < k8; k += 8) {
    __m256 wv[NR];
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) wv[j] = load8(w + j * K + k);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * K + k);
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k8 < K) {
    __m256 wv[NR];
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) wv[j] = load_tail(w + j * K + k8, K - k8);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = load_tail(x + i * K + k8, K - k8);
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) out[i * ldo + j] = lane_sum(acc[i][j]) + (bias ? bias[j] : 0.0f);
}

// Rows MR at a time (tail rows one by one) of the output columns [n0, n1), NR columns at a time.
template <int MR, int NR, typename WP>
void tiles(const float* x, WP w, const float* bias, float* y, int64_t M, int64_t N, int64_t K,
           int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) {
    const float* bn = bias ? bias + n : nullptr;
    int64_t m = 0;
    for (; m + MR <= M; m += MR) dot_tile<MR, NR>(x + m * K, w + n * K, bn, y + m * N + n, K, N);
    for (; m < M; ++m) dot_tile<1, NR>(x + m * K, w + n * K, bn, y + m * N + n, K, N);
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m)
      dot_tile<1, 1>(x + m * K, w + n * K, bias ? bias + n : nullptr, y + m * N + n, K, N);
}

// From this many weights a one-row product reads its weight as one stream per thread (row_dots): 384 KB in float32,
// beyond a core's L2 share, so the weight comes from L3 or memory. The default 427k model's matrices (at most 64K
// weights) stay below. Counted in weights, not bytes: a shape takes the same path, and sums in the same order,
// whatever the weights' dtype (a narrow weight gives bit for bit what its float32 values give).
constexpr int64_t kRowStreamMinWeights = int64_t(96) << 10;

// One row of x times a weight too big to stay in a core's cache (see kRowStreamMinWeights): each output is the dot
// product of x with one row of W, read start to end with 8 accumulators along k, so the weight is read as one
// sequential stream per thread. Measured on SmolLM2-135M's 211 products of a step (AMD EPYC, 2 threads, 538 MB):
// 14.8 ms, the speed of a plain sum over the same bytes (14.4 ms), where the 1 x 8 tile below, reading eight rows at
// once, took 19.5 ms (int8 weights: 5.0 ms, 27 GB/s of int8). The tile stays for weights that sit in cache: its lanes
// are summed once per 8 outputs. The AVX-512 forms use this AVX2 loop too: 16 lanes were no faster (the stream is
// the limit).
//
// Each row also asks for the weight kPrefetchBytes ahead of it: interleaved with the multiply-adds, the hardware
// prefetcher alone falls behind a stream that comes from memory (measured on an Intel Xeon, one thread, the weight
// streamed from memory: an int8 head with a scale per 32 read ~1.8x faster with 4 KB ahead).
constexpr int64_t kPrefetchBytes = 4096;

template <typename W>
inline void prefetch_ahead(const W* row, int64_t count) {
  const char* ahead = reinterpret_cast<const char*>(row) + kPrefetchBytes;
  for (int64_t b = 0; b < count * int64_t(sizeof(W)); b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
}
inline void prefetch_ahead(BlockI8 row, int64_t count) {
  prefetch_ahead(row.q + row.at, count);
  prefetch_ahead(row.d + uint64_t(row.at) / BlockI8::kBlock, count / BlockI8::kBlock);
}

template <typename WP>
void row_dots(const float* x, WP w, const float* bias, float* y, int64_t K, int64_t n0, int64_t n1) {
  const int64_t k64 = K & ~int64_t(63), k8 = K & ~int64_t(7);
  for (int64_t n = n0; n < n1; ++n) {
    const WP row = w + n * K;
    prefetch_ahead(row, K);  // a hint: it never faults, also past the end of the weight
    __m256 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k < k64; k += 64) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8 * j), load8(row + k + 8 * j), acc[j]);
    }
    for (; k < k8; k += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load8(row + k), acc[0]);
    if (k8 < K) acc[1] = _mm256_fmadd_ps(load_tail(x + k8, K - k8), load_tail(row + k8, K - k8), acc[1]);
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])),
                                   _mm256_add_ps(_mm256_add_ps(acc[4], acc[5]), _mm256_add_ps(acc[6], acc[7])));
    y[n] = lane_sum(s) + (bias ? bias[n] : 0.0f);
  }
}

// Tile shapes measured on the benchmark machine (AVX2, 16 vector registers): one row, 8 accumulators;
// two rows, 2 x 4; three to five, 3 x 4 (the most reuse of each loaded vector that stays in registers).
template <typename WP>
void columns(const float* x, WP w, const float* bias, float* y, int64_t M, int64_t N, int64_t K,
             int64_t n0, int64_t n1) {
  if (M == 1 && N * K >= kRowStreamMinWeights)
    row_dots(x, w, bias, y, K, n0, n1);
  else if (M == 1)
    tiles<1, 8>(x, w, bias, y, M, N, K, n0, n1);
  else if (M == 2)
    tiles<2, 4>(x, w, bias, y, M, N, K, n0, n1);
  else
    tiles<3, 4>(x, w, bias, y, M, N, K, n0, n1);
}

// ---- six rows or more: outer products over a packed panel of W ------------------------------------
// With many rows each weight is reused from registers across rows instead of across k: a panel of 16 output
// columns is packed k-major (one copy of W per call, small beside M times as many multiply-adds), then every
// block of up to 6 rows runs 6 x 16 outer products per k (12 accumulators, 2 loads and 6 broadcasts per 12
// FMAs). Measured at 16-64 rows: 1.6-2x the dot-product tiles above.
constexpr int64_t kPanel = 16;   // output columns per packed panel (two vectors)
constexpr int64_t kDepth = 256;  // k per packed block: a 16 KB panel stays in L1/L2 while every row block uses it
constexpr int64_t kPackedMinRows = 6;
// With AVX-512's 32 registers a 4-row dot tile fits, and up to 16 rows passes of them beat packing the weights
// on every call (one core, the default model's five shapes: 8 rows 341 vs 434 us, 16 rows 542 vs 582 us for 20
// products; the 57.8M model's 32 products, 2 threads: 16 rows 14.9 vs 17.9 ms). From 24 rows packing wins
// where the weights sit in L2 (24 rows: 827 vs 677 us).
constexpr int64_t kPackedMinRows512 = 17;

// Transpose the 8 x 8 block r[0..7] (rows) in place into columns.
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// panel[kk * P + j] = w[(n + j) * K + k0 + kk] for j < cols (zero columns beyond), kk < depth: whole 8 x 8
// blocks by vector transposes (the pack is one pass over W per call), the ragged edges one value at a time.
template <int64_t P, typename WP>
inline void pack_panel(WP w, int64_t K, int64_t n, int64_t cols, int64_t k0, int64_t depth, float* panel) {
  const int64_t d8 = cols == P ? depth & ~int64_t(7) : 0;
  for (int64_t kk = 0; kk < d8; kk += 8) {
    for (int64_t part = 0; part < P; part += 8) {
      __m256 r[8];
      for (int64_t j = 0; j < 8; ++j) r[j] = load8(w + (n + part + j) * K + k0 + kk);
      transpose8(r);
      for (int64_t c = 0; c < 8; ++c) _mm256_storeu_ps(panel + (kk + c) * P + part, r[c]);
    }
  }
  for (int64_t j = 0; j < P; ++j) {
    const WP row = w + (n + j) * K + k0;
    for (int64_t kk = d8; kk < depth; ++kk) panel[kk * P + j] = j < cols ? weight_at(row, kk) : 0.0f;
  }
}

// y[i * N + j] = (first ? bias[j] : y[i * N + j]) + sum_kk x[i * K + kk] * panel[kk * 16 + j], i < MR, j < cols.
template <int MR>
inline void outer_tile(const float* x, int64_t K, const float* panel, int64_t depth, float* y, int64_t N,
                       int64_t cols, const float* bias, bool first) {
  __m256 acc[MR][2];  // loops over MR unrolled explicitly, as in dot_tile
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < depth; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(panel + kk * kPanel), b1 = _mm256_loadu_ps(panel + kk * kPanel + 8);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(x + i * K + kk);
      acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    alignas(32) float out[kPanel];
    _mm256_store_ps(out, acc[i][0]);
    _mm256_store_ps(out + 8, acc[i][1]);
    float* yi = y + i * N;
    for (int64_t j = 0; j < cols; ++j) yi[j] = (first ? (bias ? bias[j] : 0.0f) : yi[j]) + out[j];
  }
}

// Panels [p0, p1) of the output (16 columns each), every row of x.
template <typename WP>
void packed_columns(const float* x, WP w, const float* bias, float* y, int64_t M, int64_t N, int64_t K,
                    int64_t p0, int64_t p1) {
  alignas(64) float panel[kDepth * kPanel];
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n = p * kPanel, cols = std::min(kPanel, N - n);
    const float* bn = bias ? bias + n : nullptr;
    for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
      const int64_t depth = std::min(kDepth, K - k0);
      pack_panel<kPanel>(w, K, n, cols, k0, depth, panel);
      const bool first = k0 == 0;
      int64_t m = 0;
      for (; m + 6 <= M; m += 6) outer_tile<6>(x + m * K + k0, K, panel, depth, y + m * N + n, N, cols, bn, first);
      float* ym = y + m * N + n;
      const float* xm = x + m * K + k0;
      switch (M - m) {
        case 5: outer_tile<5>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        case 4: outer_tile<4>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        case 3: outer_tile<3>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        case 2: outer_tile<2>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        case 1: outer_tile<1>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        default: break;
      }
    }
  }
}

// ---- the same outer products with AVX-512, where the CPU has it ---------------------------------------------
// 32 output columns (two 16-lane vectors) by 8 rows: 16 accumulators of the 32 registers, 2 loads and 8
// broadcasts per 16 FMAs; twice the work per instruction of the AVX2 panels. Chosen at run time.
#define GENPROBE_AVX512 __attribute__((target("avx512f")))
constexpr int64_t kPanel512 = 32;
constexpr int kRows512 = 8;

// Lanes [0, count) of a 16-lane vector, count clamped to [0, 16].
GENPROBE_AVX512 inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1u);
}

// Sixteen consecutive weights as float32 (bfloat16 widened as in load8); the masked forms read only lanes
// [0, count) and zero the rest.
GENPROBE_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
GENPROBE_AVX512 inline __m512 load16(const bf16_bits* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
GENPROBE_AVX512 inline __m512 load16_tail(__mmask16 lanes, int64_t, const float* p) {
  return _mm512_maskz_loadu_ps(lanes, p);
}
GENPROBE_AVX512 inline __m512 load16(const i8* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
template <typename W>
GENPROBE_AVX512 inline __m512 load16_tail(__mmask16, int64_t count, const W* p) {
  W part[16] = {};
  std::memcpy(part, p, size_t(count) * sizeof(W));
  return load16(part);
}

GENPROBE_AVX512 inline __m512 load16(BlockI8 p) { return _mm512_mul_ps(load16(p.q + p.at), _mm512_set1_ps(p.scale())); }
GENPROBE_AVX512 inline __m512 load16_tail(__mmask16 lanes, int64_t count, BlockI8 p) {
  return _mm512_mul_ps(load16_tail(lanes, count, p.q + p.at), _mm512_set1_ps(p.scale()));
}

// y[i * N + j] = (first ? bias[j] : y[i * N + j]) + sum_kk x[i * K + kk] * panel[kk * 32 + j], i < MR, j < cols.
template <int MR>
GENPROBE_AVX512 inline void outer_tile512(const float* x, int64_t K, const float* panel, int64_t depth, float* y,
                                          int64_t N, int64_t cols, const float* bias, bool first) {
  __m512 acc[MR][2];  // loops over MR unrolled explicitly, as in dot_tile
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < depth; ++kk) {
    const __m512 b0 = _mm512_loadu_ps(panel + kk * kPanel512), b1 = _mm512_loadu_ps(panel + kk * kPanel512 + 16);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(x[i * K + kk]);
      acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
    }
  }
  const __mmask16 m0 = first_lanes(cols), m1 = first_lanes(cols - 16);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* yi = y + i * N;
    const float* base = first ? bias : yi;  // the bias (or nothing) on the first k block, the partial sum after
    const __m512 c0 = base ? _mm512_maskz_loadu_ps(m0, base) : _mm512_setzero_ps();
    const __m512 c1 = base ? _mm512_maskz_loadu_ps(m1, base + 16) : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(yi, m0, _mm512_add_ps(c0, acc[i][0]));
    _mm512_mask_storeu_ps(yi + 16, m1, _mm512_add_ps(c1, acc[i][1]));
  }
}

// Panels [p0, p1) of the output (32 columns each), every row of x.
template <typename WP>
GENPROBE_AVX512 void packed_columns512(const float* x, WP w, const float* bias, float* y, int64_t M,
                                       int64_t N, int64_t K, int64_t p0, int64_t p1) {
  alignas(64) float panel[kDepth * kPanel512];
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n = p * kPanel512, cols = std::min(kPanel512, N - n);
    const float* bn = bias ? bias + n : nullptr;
    for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
      const int64_t depth = std::min(kDepth, K - k0);
      pack_panel<kPanel512>(w, K, n, cols, k0, depth, panel);
      const bool first = k0 == 0;
      int64_t m = 0;
      for (; m + kRows512 <= M; m += kRows512)
        outer_tile512<kRows512>(x + m * K + k0, K, panel, depth, y + m * N + n, N, cols, bn, first);
      float* ym = y + m * N + n;
      const float* xm = x + m * K + k0;
      switch (M - m) {
        case 7: outer_tile512<7>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        case 6: outer_tile512<6>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        case 5: outer_tile512<5>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        case 4: outer_tile512<4>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        case 3: outer_tile512<3>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        case 2: outer_tile512<2>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        case 1: outer_tile512<1>(xm, K, panel, depth, ym, N, cols, bn, first); break;
        default: break;
      }
    }
  }
}

// The CPU has AVX-512 and torch uses it too (torch's own choice, which ATEN_CPU_CAPABILITY can lower).
// The dot-product tiles of a few rows (see dot_tile) with 16-lane vectors: half the instructions along k.
// The lane sums of a, b, c and d, in that order: the 512-bit halves folded, then two rounds of pairwise adds
// shared by the four (one tree instead of four).
GENPROBE_AVX512 inline __m256 fold512(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
GENPROBE_AVX512 inline __m128 sum4_512(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m256 ab = _mm256_hadd_ps(fold512(a), fold512(b));  // a01 a23 b01 b23 | a45 a67 b45 b67
  const __m256 cd = _mm256_hadd_ps(fold512(c), fold512(d));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

template <int MR, int NR, typename WP>
GENPROBE_AVX512 inline void dot_tile512(const float* x, WP w, const float* bias, float* out, int64_t K,
                                        int64_t ldo) {
  __m512 acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  const int64_t k16 = K & ~int64_t(15);
  for (int64_t k = 0; k < k16; k += 16) {
    __m512 wv[NR];
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) wv[j] = load16(w + j * K + k);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * K + k);
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k16 < K) {  // the k tail, masked: no read past a row
    const __mmask16 tail = first_lanes(K - k16);
    __m512 wv[NR];
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) wv[j] = load16_tail(tail, K - k16, w + j * K + k16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(tail, x + i * K + k16);
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if constexpr (NR % 4 == 0) {  // four sums per reduction tree (at K = 128 the sums cost as much as the FMAs)
    const __m128 zero = _mm_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < NR; j += 4) {
        const __m128 sums = sum4_512(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
        _mm_storeu_ps(out + i * ldo + j, _mm_add_ps(sums, bias ? _mm_loadu_ps(bias + j) : zero));
      }
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) out[i * ldo + j] = _mm512_reduce_add_ps(acc[i][j]) + (bias ? bias[j] : 0.0f);
  }
}

template <int MR, int NR, typename WP>
GENPROBE_AVX512 void tiles512(const float* x, WP w, const float* bias, float* y, int64_t M, int64_t N,
                              int64_t K, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) {
    const float* bn = bias ? bias + n : nullptr;
    int64_t m = 0;
    for (; m + MR <= M; m += MR) dot_tile512<MR, NR>(x + m * K, w + n * K, bn, y + m * N + n, K, N);
    switch (M - m) {  // the remaining rows in one more pass (MR <= 4)
      case 0:
        break;
      case 1:
        dot_tile512<1, NR>(x + m * K, w + n * K, bn, y + m * N + n, K, N);
        break;
      case 2:
        dot_tile512<2, NR>(x + m * K, w + n * K, bn, y + m * N + n, K, N);
        break;
      default:
        dot_tile512<3, NR>(x + m * K, w + n * K, bn, y + m * N + n, K, N);
        break;
    }
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m)
      dot_tile512<1, 1>(x + m * K, w + n * K, bias ? bias + n : nullptr, y + m * N + n, K, N);
}

// The tile shapes of columns() (the same register budget suits both: the loads, not the registers, limit).
template <typename WP>
GENPROBE_AVX512 void columns512(const float* x, WP w, const float* bias, float* y, int64_t M, int64_t N,
                                int64_t K, int64_t n0, int64_t n1) {
  if (M == 1 && N * K >= kRowStreamMinWeights)  // memory-bound: 16 lanes were no faster here
    row_dots(x, w, bias, y, K, n0, n1);
  else if (M == 1)
    tiles512<1, 8>(x, w, bias, y, M, N, K, n0, n1);
  else if (M == 2)
    tiles512<2, 4>(x, w, bias, y, M, N, K, n0, n1);
  else if (M == 4)  // one pass over the weights, not 3 rows + 1 (32 registers hold 16 sums, 4 weights, 1 input)
    tiles512<4, 4>(x, w, bias, y, M, N, K, n0, n1);
  else if (M == 5)
    tiles512<5, 4>(x, w, bias, y, M, N, K, n0, n1);
  else if (M == 3)
    tiles512<3, 4>(x, w, bias, y, M, N, K, n0, n1);
  else  // 6-16 rows: 4-row passes, the rest in one (see kPackedMinRows512)
    tiles512<4, 4>(x, w, bias, y, M, N, K, n0, n1);
}

bool cpu_has_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0 && at::get_cpu_capability() == "AVX512";
  }();
  return has;
}

// Whether the kernels take their AVX-512 forms: the CPU has them and they were not turned off (tests turn
// them off to check the AVX2 forms on the same machine).
std::atomic<bool> avx512_allowed{true};

bool use_avx512() { return avx512_allowed.load(std::memory_order_relaxed) && cpu_has_avx512(); }

// Split across threads only when a product is big enough that a fork/join (about a microsecond) is small
// beside it: enough multiply-adds when several rows share each weight (a batch), or, for one row, a weight of
// 64 KB or more. A one-row product streams its weight from L3 or memory, and measured in a decode step on the
// benchmark machine (the weights evicted between steps by everything else the step and the machine do) two
// cores pulling halves of it take ~10% off the step, although two threads are slower than one in a loop that
// keeps the weights hot in L2/L3.
constexpr int64_t kParallelMinMacs = int64_t(1) << 18;
constexpr int64_t kParallelMinWeightBytes = int64_t(1) << 16;

// Set by genprobe::SerialProducts (decoder.cpp) on the thread running a compiled program built single-threaded:
// its products then stay on that thread too, as every other kernel of such a small step does.
thread_local bool serial_products = false;

template <typename WP>
void linear_into(const float* x, WP w, const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
  const bool big = M > 1 ? M * N * K >= kParallelMinMacs : N * K * weight_bytes(w) >= kParallelMinWeightBytes;
  const bool split = !serial_products && at::get_num_threads() > 1 && N >= 64 && big;
  const bool wide = use_avx512();
  if (M >= (wide ? kPackedMinRows512 : kPackedMinRows)) {
    const int64_t width = wide ? kPanel512 : kPanel, panels = (N + width - 1) / width;
    const auto run = [&](int64_t begin, int64_t end) {
      if (wide)
        packed_columns512(x, w, bias, y, M, N, K, begin, end);
      else
        packed_columns(x, w, bias, y, M, N, K, begin, end);
    };
    if (split)
      at::parallel_for(0, panels, 1, run);
    else
      run(0, panels);
    return;
  }
  const auto run = [&](int64_t n0, int64_t n1) {
    if (wide)
      columns512(x, w, bias, y, M, N, K, n0, n1);
    else
      columns(x, w, bias, y, M, N, K, n0, n1);
  };
  if (!split) {
    run(0, N);
    return;
  }
  const int64_t blocks = N / 8;  // threads take whole 8-column blocks; the last one takes the remainder
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) { run(begin * 8, end == blocks ? N : end * 8); });
}

// ---- llama.cpp's weight blocks (ggml.cpp): dequantized a few rows at a time, then the float32 kernels above -------
// The rows of a weight in blocks are dequantized into a small buffer (exactly: ggml.cpp) that the float32 kernels
// read as the rows [c0, c1) of W; an output's sum does not depend on which range it was computed in (the ranges
// start at multiples of the kernels' column steps), so the product is the float32 kernels' result on the dequantized
// matrix, bit for bit. The weight's bytes are read once, as blocks (4.5-8.5 bits a weight); the float32 rows stay in
// L1/L2 between being written and read.

// Output columns [n0, n1) of linear_into's product, in its shapes for M rows and N columns.
template <typename WP>
void column_range(const float* x, WP w, const float* bias, float* y, int64_t M, int64_t N, int64_t K, int64_t n0,
                  int64_t n1, bool wide) {
  if (M >= (wide ? kPackedMinRows512 : kPackedMinRows)) {
    const int64_t width = wide ? kPanel512 : kPanel;
    if (wide)
      packed_columns512(x, w, bias, y, M, N, K, n0 / width, (n1 + width - 1) / width);
    else
      packed_columns(x, w, bias, y, M, N, K, n0 / width, (n1 + width - 1) / width);
  } else if (wide) {
    columns512(x, w, bias, y, M, N, K, n0, n1);
  } else {
    columns(x, w, bias, y, M, N, K, n0, n1);
  }
}

// Up to this many rows of x, a product over blocks is fused (no float32 rows written): decoding a block costs more
// than multiplying it into a few rows, so it is done once per block, not once per row.
constexpr int64_t kFusedMaxRows = 4;

// Float32 weights per dequantized chunk: 8 KB-32 KB of rows, which stay in L1/L2 while the kernels read them.
constexpr int64_t kChunkWeights = int64_t(8) << 10;

void ggml_linear_into(const float* x, const uint8_t* raw, int64_t type, int64_t row_bytes, const float* bias,
                      float* y, int64_t M, int64_t N, int64_t K) {
  const bool wide = use_avx512();
  const bool packed = M >= (wide ? kPackedMinRows512 : kPackedMinRows);
  const int64_t step = packed ? (wide ? kPanel512 : kPanel) : 8;  // ranges start where the kernels' columns do
  const int64_t chunk = std::max(step, kChunkWeights / K / step * step);
  const bool big = M > 1 ? M * N * K >= kParallelMinMacs : N * row_bytes >= kParallelMinWeightBytes;
  const bool split = !serial_products && at::get_num_threads() > 1 && N >= 64 && big;
  const auto run = [&](int64_t n0, int64_t n1) {
    // a few rows of x: each block decoded in registers and multiplied at once (ggml.cpp), where there is a form
    if (M <= kFusedMaxRows && genprobe::ggml_dot_rows(type, x, M, raw, row_bytes, K, bias, y, N, n0, n1, wide)) return;
    thread_local std::vector<float> rows;
    rows.resize(size_t(chunk * K));
    for (int64_t c = n0; c < n1; c += chunk) {
      const int64_t e = std::min(c + chunk, n1);
      genprobe::ggml_dequantize_rows(type, raw + c * row_bytes, row_bytes, K, e - c, rows.data(), wide);
      // the kernels index W's row n at w + n * K: a base shifted back by c rows puts row c at the buffer's start
      const float* w = reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(rows.data()) - uintptr_t(c * K * 4));
      column_range(x, w, bias, y, M, N, K, c, e, wide);
    }
  };
  if (!split) {
    run(0, N);
    return;
  }
  const int64_t blocks = (N + step - 1) / step;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) { run(begin * step, std::min(end * step, N)); });
}

}  // namespace

namespace genprobe {
bool set_serial_products(bool serial) {
  const bool before = serial_products;
  serial_products = serial;
  return before;
}
}  // namespace genprobe

// The (N, K / 32) float32 scales of an int8 weight stored in 32-weight blocks (see BlockI8), checked.
at::Tensor checked_block_scales(const at::Tensor& weight, const at::Tensor& scales) {
  const int64_t N = weight.size(0), K = weight.size(1), block = BlockI8::kBlock;
  TORCH_CHECK(weight.scalar_type() == at::kChar, "small_linear: block scales go with an int8 weight, got ",
              weight.scalar_type());
  TORCH_CHECK(K % block == 0, "small_linear: a weight in blocks of ", block, " needs in_features a multiple of ",
              block, ", got ", K);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 2 && scales.size(0) == N &&
                  scales.size(1) == K / block,
              "small_linear: block scales must be float32 of shape (", N, ", ", K / block, "), got ",
              scales.scalar_type(), " ", scales.sizes());
  return scales.contiguous();
}

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        const std::optional<at::Tensor>& block_scales) {
  const auto wt = weight.scalar_type();
  TORCH_CHECK(x.scalar_type() == at::kFloat && (wt == at::kFloat || wt == at::kBFloat16 || wt == at::kChar),
              "small_linear: x float32 and weight float32, bfloat16 or int8, got ", x.scalar_type(), " and ", wt);
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "small_linear: CPU tensors only");
  TORCH_CHECK(weight.dim() == 2, "small_linear: weight must be (out_features, in_features), got ", weight.sizes());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "small_linear: x ", x.sizes(), " does not match weight ",
              weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  const bool blocks = block_scales.has_value() && block_scales->defined();
  const at::Tensor dc = blocks ? checked_block_scales(weight, *block_scales) : at::Tensor();
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight.contiguous();
  const int64_t M = K == 0 ? 0 : xc.numel() / K;
  const float* b = nullptr;
  at::Tensor bc;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N, "small_linear: bias must be float32 of ", N,
                " elements, got ", bias->sizes());
    bc = bias->contiguous();
    b = bc.data_ptr<float>();
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor y = at::empty(out_shape, x.options());
  if (K == 0) {
    y.zero_();
    if (b != nullptr) y.add_(bc);
    return y;
  }
  if (blocks)
    linear_into(xc.data_ptr<float>(), BlockI8{wc.data_ptr<i8>(), dc.data_ptr<float>(), 0}, b, y.data_ptr<float>(), M,
                N, K);
  else if (wt == at::kBFloat16)
    linear_into(xc.data_ptr<float>(), reinterpret_cast<const bf16_bits*>(wc.data_ptr<at::BFloat16>()), b,
                y.data_ptr<float>(), M, N, K);
  else if (wt == at::kChar)
    linear_into(xc.data_ptr<float>(), wc.data_ptr<i8>(), b, y.data_ptr<float>(), M, N, K);
  else
    linear_into(xc.data_ptr<float>(), wc.data_ptr<float>(), b, y.data_ptr<float>(), M, N, K);
  return y;
}

// The ggml type of a weight in blocks (uint8, (N, blocks per row, bytes per block)) and its in_features, checked.
int64_t checked_ggml_weight(const at::Tensor& weight, int64_t type) {
  int64_t per_block = 0, bytes = 0;
  TORCH_CHECK(genprobe::ggml_block_shape(type, &per_block, &bytes), "small_linear_ggml: ggml type ", type,
              " is not one the kernels read (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
  TORCH_CHECK(weight.scalar_type() == at::kByte && weight.dim() == 3 && weight.size(2) == bytes,
              "small_linear_ggml: a weight of ggml type ", type, " is uint8 (out_features, blocks, ", bytes,
              "), got ", weight.scalar_type(), " ", weight.sizes());
  TORCH_CHECK(weight.device().is_cpu(), "small_linear_ggml: CPU tensors only");
  return weight.size(1) * per_block;
}

at::Tensor small_linear_ggml(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             int64_t ggml_type) {
  const int64_t K = checked_ggml_weight(weight, ggml_type), N = weight.size(0);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "small_linear_ggml: x must be float32 on the CPU");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "small_linear_ggml: x ", x.sizes(), " does not match ", K,
              " in_features");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  const float* b = nullptr;
  at::Tensor bc;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N, "small_linear_ggml: bias must be float32 of ",
                N, " elements, got ", bias->sizes());
    bc = bias->contiguous();
    b = bc.data_ptr<float>();
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor y = at::empty(out_shape, x.options());
  const int64_t M = K == 0 ? 0 : xc.numel() / K;
  if (K == 0 || M == 0) {
    y.zero_();
    if (b != nullptr) y.add_(bc);
    return y;
  }
  ggml_linear_into(xc.data_ptr<float>(), wc.data_ptr<uint8_t>(), ggml_type, wc.size(1) * wc.size(2), b,
                   y.data_ptr<float>(), M, N, K);
  return y;
}

// The float32 weight a weight in blocks stands for (N, K): what the kernels multiply by, for tests and checks.
at::Tensor ggml_dequantize(const at::Tensor& weight, int64_t ggml_type) {
  const int64_t K = checked_ggml_weight(weight, ggml_type), N = weight.size(0);
  const at::Tensor wc = weight.contiguous();
  at::Tensor out = at::empty({N, K}, weight.options().dtype(at::kFloat));
  genprobe::ggml_dequantize_rows(ggml_type, wc.data_ptr<uint8_t>(), wc.size(1) * wc.size(2), K, N,
                                 out.data_ptr<float>(), use_avx512());
  return out;
}

// Which instruction set the kernels use: "avx512" or "avx2". ``allow_avx512`` false keeps them on AVX2
// (for tests), true lets them use AVX-512 where the CPU has it.
std::string small_linear_isa(std::optional<bool> allow_avx512) {
  if (allow_avx512.has_value()) avx512_allowed.store(*allow_avx512);
  return use_avx512() ? "avx512" : "avx2";
}

TORCH_LIBRARY(genprobe, m) {
  m.def("small_linear(Tensor x, Tensor weight, Tensor? bias=None, Tensor? block_scales=None) -> Tensor");
  m.def("small_linear_isa(bool? allow_avx512=None) -> str", small_linear_isa);
  m.def("small_linear_ggml(Tensor x, Tensor weight, Tensor? bias, int ggml_type) -> Tensor");
  m.def("ggml_dequantize(Tensor weight, int ggml_type) -> Tensor");
}

TORCH_LIBRARY_IMPL(genprobe, CPU, m) {
  m.impl("small_linear", small_linear);
  m.impl("small_linear_ggml", small_linear_ggml);
  m.impl("ggml_dequantize", ggml_dequantize);
}

// What the C shim Inductor's C++ wrapper calls (aoti_torch_cpu_small_linear, its naming rule
// aoti_torch_<device>_<op name>) runs; the shim itself lives in shim.c (see there why). Errors become an error
// code, which the wrapper turns into an exception.
extern "C" AOTITorchError genprobe_small_linear_c(AtenTensorHandle x, AtenTensorHandle weight,
                                                  AtenTensorHandle* bias, AtenTensorHandle* block_scales,
                                                  AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    const auto optional = [](AtenTensorHandle* h) {
      std::optional<at::Tensor> t;
      if (h != nullptr && *h != nullptr) t = *torch::aot_inductor::tensor_handle_to_tensor_pointer(*h);
      return t;
    };
    *ret0 = torch::aot_inductor::new_tensor_handle(
        small_linear(*torch::aot_inductor::tensor_handle_to_tensor_pointer(x),
                     *torch::aot_inductor::tensor_handle_to_tensor_pointer(weight), optional(bias), optional(block_scales)));
  });
}

// The same for genprobe::small_linear_ggml (aoti_torch_cpu_small_linear_ggml in shim.c).
extern "C" AOTITorchError genprobe_small_linear_ggml_c(AtenTensorHandle x, AtenTensorHandle weight,
                                                       AtenTensorHandle* bias, int64_t ggml_type,
                                                       AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    std::optional<at::Tensor> b;
    if (bias != nullptr && *bias != nullptr) b = *torch::aot_inductor::tensor_handle_to_tensor_pointer(*bias);
    *ret0 = torch::aot_inductor::new_tensor_handle(
        small_linear_ggml(*torch::aot_inductor::tensor_handle_to_tensor_pointer(x),
                          *torch::aot_inductor::tensor_handle_to_tensor_pointer(weight), b, ggml_type));
  });
}
