// llama.cpp's weight blocks (GGUF tensor types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) dequantized to float32,
// exactly: the values gguf-py's `gguf.quants.dequantize` gives (what transformers loads a GGUF file with) and ggml's
// `dequantize_row_*` (ggml/src/ggml-quants.c) compute, bit for bit.
//
// Why exact, whatever the order of the multiplications: every product here is exact in float32. A block's scale is
// a float16 (11 significant bits), its sub-block scales at most 8 bits, its integers at most 6: d * sc * q needs at
// most 11 + 7 + 6 = 24 bits. The only rounding is the one add or subtract of a minimum (Q4_1, Q5_1: d * q + m; Q4_K,
// Q5_K: d * sc * q - dmin * m), done once, here as there (a fused multiply-add rounds the same exact product once).
//
// The block layouts are ggml-common.h's (block_q4_0, ..., block_q6_K); each row of a weight is its blocks end to end,
// as a GGUF file stores it. genprobe.engine.fast.kernels' linear layers dequantize a few rows at a time into a small
// float32 buffer that the float32 kernels then read (linear.cpp: small_linear_ggml), so a product over blocks sums
// in exactly the float32 kernels' order and gives their result on the dequantized matrix, bit for bit.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace genprobe {

// ggml's type ids (ggml.h enum ggml_type; gguf.GGMLQuantizationType in Python).
enum GGMLType : int64_t {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
};

// Weights per block and bytes per block of `type`; false for a type this file does not read.
bool ggml_block_shape(int64_t type, int64_t* weights, int64_t* bytes) {
  switch (type) {
    case kQ4_0: *weights = 32; *bytes = 18; return true;    // d, qs[16]
    case kQ4_1: *weights = 32; *bytes = 20; return true;    // d, m, qs[16]
    case kQ5_0: *weights = 32; *bytes = 22; return true;    // d, qh[4], qs[16]
    case kQ5_1: *weights = 32; *bytes = 24; return true;    // d, m, qh[4], qs[16]
    case kQ8_0: *weights = 32; *bytes = 34; return true;    // d, qs[32]
    case kQ4_K: *weights = 256; *bytes = 144; return true;  // d, dmin, scales[12], qs[128]
    case kQ5_K: *weights = 256; *bytes = 176; return true;  // d, dmin, scales[12], qh[32], qs[128]
    case kQ6_K: *weights = 256; *bytes = 210; return true;  // ql[128], qh[64], scales[16], d
    default: return false;
  }
}

}  // namespace genprobe

namespace {

using u8 = uint8_t;

// IEEE half to float, exactly (every half is a float).
inline float half(const u8* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf, NaN
  } else if (exp == 0) {
    const float sub = float(mant) * 5.9604644775390625e-08f;  // mant * 2^-24, exact (zero and the subnormals)
    return sign ? -sub : sub;
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// get_scale_min_k4 of ggml-quants.c: the 6-bit scale and minimum of sub-block j (0..7) of a Q4_K/Q5_K block.
inline void scale_min_k4(int j, const u8* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// ---- one block, plain C++ (any x86-64 with AVX2; the reference the vector forms are tested against) -------------
void block_q4_0(const u8* b, float* y) {
  const float d = half(b);
  const u8* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = float((qs[j] & 0xF) - 8) * d;
    y[j + 16] = float((qs[j] >> 4) - 8) * d;
  }
}

void block_q4_1(const u8* b, float* y) {
  const float d = half(b), m = half(b + 2);
  const u8* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(qs[j] & 0xF) * d + m;
    y[j + 16] = float(qs[j] >> 4) * d + m;
  }
}

inline uint32_t u32_at(const u8* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q5_0 ((q - 16) d) and Q5_1 (q d + m): the fifth bit of weight j is bit j of qh.
template <bool MIN>
void block_q5(const u8* b, float* y) {
  const float d = half(b), m = MIN ? half(b + 2) : 0.0f;
  const u8* q = b + (MIN ? 4 : 2);
  const uint32_t qh = u32_at(q);
  const u8* qs = q + 4;
  for (int j = 0; j < 16; ++j) {
    const int h0 = int((qh >> j) << 4) & 0x10, h1 = int(qh >> (j + 12)) & 0x10;
    const int lo = (qs[j] & 0xF) | h0, hi = (qs[j] >> 4) | h1;
    y[j] = MIN ? float(lo) * d + m : float(lo - 16) * d;
    y[j + 16] = MIN ? float(hi) * d + m : float(hi - 16) * d;
  }
}

void block_q8_0(const u8* b, float* y) {
  const float d = half(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = float(qs[j]) * d;
}

void block_q4_k(const u8* b, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const u8 *scales = b + 4, *q = b + 16;
  for (int j = 0; j < 4; ++j, q += 32, y += 64) {
    int sc, m;
    scale_min_k4(2 * j, scales, &sc, &m);
    const float d1 = d * float(sc), m1 = dmin * float(m);
    scale_min_k4(2 * j + 1, scales, &sc, &m);
    const float d2 = d * float(sc), m2 = dmin * float(m);
    for (int l = 0; l < 32; ++l) y[l] = d1 * float(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) y[l + 32] = d2 * float(q[l] >> 4) - m2;
  }
}

void block_q5_k(const u8* b, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const u8 *scales = b + 4, *qh = b + 16, *ql = b + 48;
  for (int j = 0; j < 4; ++j, ql += 32, y += 64) {
    int sc, m;
    scale_min_k4(2 * j, scales, &sc, &m);
    const float d1 = d * float(sc), m1 = dmin * float(m);
    scale_min_k4(2 * j + 1, scales, &sc, &m);
    const float d2 = d * float(sc), m2 = dmin * float(m);
    const int u1 = 1 << (2 * j), u2 = 2 << (2 * j);
    for (int l = 0; l < 32; ++l) y[l] = d1 * float((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) y[l + 32] = d2 * float((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
  }
}

void block_q6_k(const u8* b, float* y) {
  const float d = half(b + 208);
  const u8 *ql = b, *qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * float(sc[is]) * float(q1);
      y[l + 32] = d * float(sc[is + 2]) * float(q2);
      y[l + 64] = d * float(sc[is + 4]) * float(q3);
      y[l + 96] = d * float(sc[is + 6]) * float(q4);
    }
  }
}

using BlockFn = void (*)(const u8*, float*);

BlockFn scalar_block(int64_t type) {
  using namespace genprobe;
  switch (type) {
    case kQ4_0: return block_q4_0;
    case kQ4_1: return block_q4_1;
    case kQ5_0: return block_q5<false>;
    case kQ5_1: return block_q5<true>;
    case kQ8_0: return block_q8_0;
    case kQ4_K: return block_q4_k;
    case kQ5_K: return block_q5_k;
    case kQ6_K: return block_q6_k;
    default: return nullptr;
  }
}

// ---- the same with AVX-512: 16 weights per vector ---------------------------------------------------------------
// Types with at most 32 values per scale (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K) compute a block's (or sub-block's) possible
// weights once, into one or two registers, each with the one rounding the scalar form has, then look each weight up
// by its bits with a permutation: one instruction per 16 weights instead of a conversion and a multiply-add, and the
// same values (one core of an Intel Xeon, weights in cache: Q4_0 1.2-1.4x, Q5_0 and Q4_K 1.1x the conversion's
// speed). The others widen their integers and scale them, one multiply (or fused multiply-add) each.
// One decoder per type hands each 16-weight group of a block, as float32 values in a register, to a sink: `Store`
// writes them out (dequantization), `Dot` multiplies them into running sums against rows of x (the fused product
// below), so a type's bit layout is written once for both. A sink is a functor, not a lambda: GCC does not give a
// lambda its enclosing function's target attribute.
#define GGML_AVX512 __attribute__((target("avx512f,f16c"), always_inline)) inline

GGML_AVX512 __m512i bytes16(const u8* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }
GGML_AVX512 __m512 as_float(__m512i q) { return _mm512_cvtepi32_ps(q); }
GGML_AVX512 __m512i lanes(int v) { return _mm512_set1_epi32(v); }
// The 16 lanes 0 - c, 1 - c, ..., 15 - c (exact small integers as float32): times a scale, a block's weight table.
GGML_AVX512 __m512 minus(int c) {
  return _mm512_sub_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_ps(float(c)));
}
// A block's float16 scale, exactly (F16C converts every half, subnormals included, as half() does).
GGML_AVX512 float half16(const u8* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

struct DecodeQ4_0 {
  static constexpr int kGroups = 2, kBytes = 18;
  template <class Sink>
  GGML_AVX512 static void run(const u8* b, Sink& sink) {
    // The block's 16 possible weights (q - 8) d, each exact (q d and 8 d are), in one register: a permutation by
    // the nibbles then gives each weight in one instruction (it reads the low 4 bits of each lane, so the low
    // nibbles need no mask), instead of a conversion and a multiply-add per 16 weights.
    const __m512 table = _mm512_mul_ps(_mm512_set1_ps(half16(b)), minus(8));
    const __m512i v = bytes16(b + 2);
    sink(0, _mm512_permutexvar_ps(v, table));
    sink(1, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table));
  }
};

struct DecodeQ4_1 {
  static constexpr int kGroups = 2, kBytes = 20;
  template <class Sink>
  GGML_AVX512 static void run(const u8* b, Sink& sink) {
    // the 16 weights q d + m, each rounded once (d q is exact), looked up by nibble as for Q4_0
    const __m512 table = _mm512_fmadd_ps(minus(0), _mm512_set1_ps(half16(b)), _mm512_set1_ps(half16(b + 2)));
    const __m512i v = bytes16(b + 4);
    sink(0, _mm512_permutexvar_ps(v, table));
    sink(1, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table));
  }
};

// Q5_0 and Q5_1: the fifth bit of weight j is bit j of qh; a mask register sets bit 4 of the lanes that have it, and
// a two-register permutation looks the 5-bit value up in the block's 32 weights (bit 4 picks the register).
template <bool MIN>
struct DecodeQ5 {
  static constexpr int kGroups = 2, kBytes = MIN ? 24 : 22;
  template <class Sink>
  GGML_AVX512 static void run(const u8* b, Sink& sink) {
    const u8* q = b + (MIN ? 4 : 2);
    const __m512 d = _mm512_set1_ps(half16(b));
    // (q - 16) d for Q5_0 (exact, as for Q4_0); q d + m, rounded once, for Q5_1
    const __m512 low = MIN ? _mm512_fmadd_ps(minus(0), d, _mm512_set1_ps(half16(b + 2))) : _mm512_mul_ps(minus(16), d);
    const __m512 high = MIN ? _mm512_fmadd_ps(minus(-16), d, _mm512_set1_ps(half16(b + 2))) : _mm512_mul_ps(minus(0), d);
    uint32_t qh;
    std::memcpy(&qh, q, 4);
    const __m512i v = bytes16(q + 4), l4 = _mm512_and_si512(v, lanes(0xF)), h4 = _mm512_srli_epi32(v, 4);
    const __m512i lo = _mm512_mask_or_epi32(l4, __mmask16(qh & 0xFFFF), l4, lanes(16));
    const __m512i hi = _mm512_mask_or_epi32(h4, __mmask16(qh >> 16), h4, lanes(16));
    sink(0, _mm512_permutex2var_ps(low, lo, high));
    sink(1, _mm512_permutex2var_ps(low, hi, high));
  }
};

struct DecodeQ8_0 {
  static constexpr int kGroups = 2, kBytes = 34;
  template <class Sink>
  GGML_AVX512 static void run(const u8* b, Sink& sink) {
    const __m512 d = _mm512_set1_ps(half16(b));
    sink(0, _mm512_mul_ps(as_float(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 2)))), d));
    sink(1, _mm512_mul_ps(as_float(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 18)))), d));
  }
};

// Q4_K and Q5_K: 64 weights per step (sub-blocks 2j and 2j + 1 share 32 bytes of nibbles).
template <bool FIVE>
struct DecodeK {
  static constexpr int kGroups = 16, kBytes = FIVE ? 176 : 144;
  template <class Sink>
  GGML_AVX512 static void run(const u8* b, Sink& sink) {
    const float d = half16(b), dmin = half16(b + 2);
    const u8 *scales = b + 4, *qh = b + 16, *ql = b + (FIVE ? 48 : 16);
    __m512i h[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    if (FIVE) h[0] = bytes16(qh), h[1] = bytes16(qh + 16);
    for (int j = 0; j < 4; ++j, ql += 32) {
      for (int half_ = 0; half_ < 2; ++half_) {  // sub-block 2j (low nibbles), then 2j + 1 (high nibbles)
        const int s = 2 * j + half_;
        int sc, m;
        scale_min_k4(s, scales, &sc, &m);
        const __m512 a = _mm512_set1_ps(d * float(sc)), c = _mm512_set1_ps(dmin * float(m));
        const __m512 table = _mm512_fmsub_ps(a, minus(0), c);  // a q - c for q = 0..15 (a q exact: one rounding)
        for (int part = 0; part < 2; ++part) {
          const __m512i v = bytes16(ql + 16 * part);
          if (FIVE) {  // 32 values: converted and scaled (a lookup in two registers measured slower here)
            __m512i q = half_ ? _mm512_srli_epi32(v, 4) : _mm512_and_si512(v, lanes(0xF));
            q = _mm512_or_si512(q, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h[part], s), lanes(1)), 4));
            sink(4 * j + 2 * half_ + part, _mm512_fmsub_ps(a, as_float(q), c));  // a * q exact
          } else {  // Q4_K: looked up by nibble, as for Q4_0
            sink(4 * j + 2 * half_ + part, _mm512_permutexvar_ps(half_ ? _mm512_srli_epi32(v, 4) : v, table));
          }
        }
      }
    }
  }
};

struct DecodeQ6_K {
  static constexpr int kGroups = 16, kBytes = 210;
  template <class Sink>
  GGML_AVX512 static void run(const u8* b, Sink& sink) {
    const float d = half16(b + 208);
    const u8 *ql = b, *qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const __m512i low = lanes(0xF), three = lanes(3);
    for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; l += 16) {
        const int is = l / 16;
        const __m512i l0 = bytes16(ql + l), l1 = bytes16(ql + l + 32), h = bytes16(qh + l);
        const __m512i q[4] = {
            _mm512_or_si512(_mm512_and_si512(l0, low), _mm512_slli_epi32(_mm512_and_si512(h, three), 4)),
            _mm512_or_si512(_mm512_and_si512(l1, low), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 2), three), 4)),
            _mm512_or_si512(_mm512_srli_epi32(l0, 4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 4), three), 4)),
            _mm512_or_si512(_mm512_srli_epi32(l1, 4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 6), three), 4)),
        };
        for (int t = 0; t < 4; ++t) {  // (q - 32) a as q a - 32 a: exact, as for Q4_0
          const float a = d * float(sc[is + 2 * t]);
          sink(8 * n + 2 * t + is, _mm512_fmadd_ps(as_float(q[t]), _mm512_set1_ps(a), _mm512_set1_ps(-32.0f * a)));
        }
      }
    }
  }
};

// The dequantizing sink: group g of the block goes to y[16 g, 16 g + 16).
struct Store {
  float* y;
  GGML_AVX512 void operator()(int g, __m512 w) { _mm512_storeu_ps(y + 16 * g, w); }
};

template <class Decode>
__attribute__((target("avx512f,f16c"))) void dequantize_block_512(const u8* b, float* y) {
  Store sink{y};
  Decode::run(b, sink);
}

// The fused product's sink: M rows of x (row stride K) times one output's weights, 4 running sums per row so that
// consecutive groups do not wait on each other's fused multiply-add (its latency is 4 cycles, its rate 2 a cycle).
// `base` rotates the sums a block's groups land in, so that two 2-group blocks in a row keep all four busy.
template <int M>
struct Dot {
  const float* x;  // x at the block's first column
  int64_t K;
  int base;
  __m512 acc[M][4];
  GGML_AVX512 void operator()(int g, __m512 w) {
    const int a = (g + base) & 3;
    for (int m = 0; m < M; ++m) acc[m][a] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + m * K + 16 * g), acc[m][a]);
  }
};

// y[m, n] = x[m] . W[n] (+ bias[n]) for outputs [n0, n1): each block decoded once into registers and multiplied by
// every row of x, never written to memory. Blocks of 32 weights go two at a time (their 4 groups: 4 sums busy).
// A row of blocks also asks for the bytes kPrefetchBytes ahead of it (a hint: it never faults, also past the end):
// interleaved with the decoding, the hardware prefetcher alone falls behind a weight streamed from memory (measured
// on an Intel Xeon, one core, 390 MB of blocks: Q4_0 1.3x, Q8_0 1.7-2x with 4 KB ahead).
constexpr int64_t kPrefetchBytes = 4096;

template <class Decode, int M>
__attribute__((target("avx512f,f16c"))) void dot_rows(const float* x, const u8* raw, int64_t row_bytes, int64_t K,
                                                     const float* bias, float* y, int64_t N, int64_t n0, int64_t n1) {
  constexpr int per_block = 16 * Decode::kGroups, pair = Decode::kGroups == 2 ? 2 : 1;
  const int64_t blocks = K / per_block;
  for (int64_t n = n0; n < n1; ++n) {
    const u8* row = raw + n * row_bytes;
    for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch((const char*)(row + kPrefetchBytes + b), _MM_HINT_T0);
    Dot<M> sink{x, K, 0, {}};
    for (int m = 0; m < M; ++m)
      for (int a = 0; a < 4; ++a) sink.acc[m][a] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + pair <= blocks; i += pair) {
#pragma GCC unroll 2
      for (int u = 0; u < pair; ++u) {
        sink.x = x + (i + u) * per_block;
        sink.base = 2 * u;
        Decode::run(row + (i + u) * Decode::kBytes, sink);
      }
    }
    sink.base = 0;
    for (; i < blocks; ++i) {
      sink.x = x + i * per_block;
      Decode::run(row + i * Decode::kBytes, sink);
    }
    for (int m = 0; m < M; ++m) {
      const __m512 s = _mm512_add_ps(_mm512_add_ps(sink.acc[m][0], sink.acc[m][1]),
                                     _mm512_add_ps(sink.acc[m][2], sink.acc[m][3]));
      y[m * N + n] = _mm512_reduce_add_ps(s) + (bias ? bias[n] : 0.0f);
    }
  }
}

using DotFn = void (*)(const float*, const u8*, int64_t, int64_t, const float*, float*, int64_t, int64_t, int64_t);

template <class Decode>
DotFn dot_for_rows(int64_t M) {
  switch (M) {
    case 1: return dot_rows<Decode, 1>;
    case 2: return dot_rows<Decode, 2>;
    case 3: return dot_rows<Decode, 3>;
    case 4: return dot_rows<Decode, 4>;
    default: return nullptr;
  }
}

DotFn avx512_dot(int64_t type, int64_t M) {
  using namespace genprobe;
  switch (type) {
    case kQ4_0: return dot_for_rows<DecodeQ4_0>(M);
    case kQ4_1: return dot_for_rows<DecodeQ4_1>(M);
    case kQ5_0: return dot_for_rows<DecodeQ5<false>>(M);
    case kQ5_1: return dot_for_rows<DecodeQ5<true>>(M);
    case kQ8_0: return dot_for_rows<DecodeQ8_0>(M);
    case kQ4_K: return dot_for_rows<DecodeK<false>>(M);
    case kQ5_K: return dot_for_rows<DecodeK<true>>(M);
    case kQ6_K: return dot_for_rows<DecodeQ6_K>(M);
    default: return nullptr;
  }
}

BlockFn avx512_block(int64_t type) {
  using namespace genprobe;
  switch (type) {
    case kQ4_0: return dequantize_block_512<DecodeQ4_0>;
    case kQ4_1: return dequantize_block_512<DecodeQ4_1>;
    case kQ5_0: return dequantize_block_512<DecodeQ5<false>>;
    case kQ5_1: return dequantize_block_512<DecodeQ5<true>>;
    case kQ8_0: return dequantize_block_512<DecodeQ8_0>;
    case kQ4_K: return dequantize_block_512<DecodeK<false>>;
    case kQ5_K: return dequantize_block_512<DecodeK<true>>;
    case kQ6_K: return dequantize_block_512<DecodeQ6_K>;
    default: return scalar_block(type);
  }
}

}  // namespace

namespace genprobe {

// Rows [0, rows) of a weight in blocks of `type`, each `row_bytes` long starting at `raw`, as float32 rows of K
// weights into `out` (rows x K). `avx512`: use the 16-lane forms (the caller checked the CPU); same values either way.
void ggml_dequantize_rows(int64_t type, const uint8_t* raw, int64_t row_bytes, int64_t K, int64_t rows, float* out,
                          bool avx512) {
  int64_t weights = 0, bytes = 0;
  ggml_block_shape(type, &weights, &bytes);
  const BlockFn fn = avx512 ? avx512_block(type) : scalar_block(type);
  const int64_t blocks = K / weights;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = raw + r * row_bytes;
    float* y = out + r * K;
    for (int64_t i = 0; i < blocks; ++i) fn(row + i * bytes, y + i * weights);
  }
}

// The fused product of M rows of x (M <= 4; AVX-512 only) with outputs [n0, n1) of a weight in blocks: false when
// there is none for this type, row count or instruction set (the caller dequantizes instead).
bool ggml_dot_rows(int64_t type, const float* x, int64_t M, const uint8_t* raw, int64_t row_bytes, int64_t K,
                   const float* bias, float* y, int64_t N, int64_t n0, int64_t n1, bool avx512) {
  const DotFn fn = avx512 ? avx512_dot(type, M) : nullptr;
  if (fn == nullptr) return false;
  fn(x, raw, row_bytes, K, bias, y, N, n0, n1);
  return true;
}

}  // namespace genprobe
