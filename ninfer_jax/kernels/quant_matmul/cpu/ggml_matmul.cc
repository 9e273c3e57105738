// y[M, N] = x[M, K] @ W for W kept in a GGUF block format (Q8_0, Q4_0, Q4_1): the raw block
// bytes as stored, one row of K/32 blocks per output column n (ggml's layout).
// x is quantized per 32-block to int8 (scale d = max|x|/127, plus the block's integer sum for
// the formats with an offset), then every block product is an integer dot of 32 int8 x
// against 32 weight codes, scaled in f32. Paths: AVX-512 VNNI, AVX2, NEON, scalar, each compiled
// for its own target and picked once at run time from the CPU's features; the x86 paths also
// quantize x with AVX2 and run tiles of rows x columns (tile_x86). Output columns are
// split with XLA's intra-op thread pool when the weight is large enough to pay for the hand-off.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define NINFER_X86 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kBlock = 32;
enum Format : int32_t { kQ8_0 = 0, kQ4_0 = 1, kQ4_1 = 2 };

int block_bytes(int32_t fmt) { return fmt == kQ8_0 ? 34 : fmt == kQ4_0 ? 18 : 20; }

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do { ++e; mant <<= 1; } while (!(mant & 0x400u));
      bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t load_u16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }

// One activation row quantized: codes [K], per block the scale d and the factor of the weight
// block's offset: q4_1's s (f16, as llama.cpp's q8_1 stores it), q4_0's exact d * sum(codes).
struct QRow {
  const int8_t* q;
  const float* d;
  const float* ds;
  const int32_t* sum;  // per block, the sum of the codes (the interleaved layout's offsets)
};

// f32 -> f16 bits, round to nearest even (as F16C's vcvtps2ph with imm 0); overflow -> inf.
uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u);
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504
  if (absx < 0x38800000u) {  // f16 subnormal or zero: scale into the 10-bit mantissa
    float a;
    std::memcpy(&a, &absx, 4);
    return sign | (uint16_t)std::nearbyint(a * 16777216.f);  // a / 2^-24
  }
  uint32_t mant = absx & 0x7fffffu, exp = (absx >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13), rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carries into the exponent
  return sign | h;
}

float round_to_half(float f) { return half_to_float(float_to_half(f)); }

// llama.cpp's q8_0 / q8_1 activation blocks: d = max|x| / 127 stored as f16, codes
// round-half-even(x * 127 / max|x|), and (q8_1) s = d * sum(codes) stored as f16. The dots use
// the f16-rounded d and s, so a product here is the one llama.cpp's vec_dot computes.
void quantize_row(int32_t fmt, const float* x, int64_t K, int8_t* q, float* d, float* ds,
                  int32_t* sums) {
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.f;
    for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float scale = amax / 127.f, inv = amax != 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int i = 0; i < kBlock; ++i) {
      int v = (int)std::nearbyint(xb[i] * inv);
      q[b * kBlock + i] = (int8_t)v;
      sum += v;
    }
    d[b] = round_to_half(scale);
    ds[b] = fmt == kQ4_1 ? round_to_half(scale * (float)sum) : d[b] * (float)sum;
    sums[b] = sum;
  }
}

// Weight block -> its scale, offset (Q4_1's m, else 0), codes pointer; shared by all paths.
struct BlockView {
  float d, m;
  const uint8_t* qs;
};

inline BlockView view(const uint8_t* blk, int32_t fmt) {
  BlockView v;
  v.d = half_to_float(load_u16(blk));
  v.m = fmt == kQ4_1 ? half_to_float(load_u16(blk + 2)) : 0.f;
  v.qs = blk + (fmt == kQ4_1 ? 4 : 2);
  return v;
}

// ------------------------------------------------------------------------------- scalar
void rows_scalar(int32_t fmt, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                 int64_t nb, const QRow* xs, int64_t M, float* y, int64_t N) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        BlockView v = view(row + b * block_bytes(fmt), fmt);
        const int8_t* qx = xs[m].q + b * kBlock;
        int dot = 0;
        if (fmt == kQ8_0) {
          for (int i = 0; i < kBlock; ++i) dot += (int)(int8_t)v.qs[i] * qx[i];
        } else {
          int off = fmt == kQ4_0 ? 8 : 0;
          for (int i = 0; i < 16; ++i) {
            dot += ((v.qs[i] & 0xf) - off) * qx[i] + ((v.qs[i] >> 4) - off) * qx[i + 16];
          }
        }
        acc += v.d * xs[m].d[b] * (float)dot + v.m * xs[m].ds[b];
      }
      y[m * N + n] = acc;
    }
  }
}

#ifdef NINFER_X86
// The same view with F16C's conversion instead of the software half_to_float: 14-17% off a
// one-thread call (576 x 192, 1-8 rows; docs/benchmarks.md, 2026-12-03).
__attribute__((target("f16c"))) inline BlockView view_f16c(const uint8_t* blk, int32_t fmt) {
  BlockView v;
  v.d = _cvtsh_ss(load_u16(blk));
  v.m = fmt == kQ4_1 ? _cvtsh_ss(load_u16(blk + 2)) : 0.f;
  v.qs = blk + (fmt == kQ4_1 ? 4 : 2);
  return v;
}

// ------------------------------------------------------------------ AVX2 and AVX-512 VNNI
// 32 weight codes of a block as bytes (Q8_0 signed, Q4 nibbles 0..15 unsigned).
__attribute__((target("avx2,fma"))) inline __m256i codes_avx2(const uint8_t* qs, int32_t fmt) {
  if (fmt == kQ8_0) return _mm256_loadu_si256((const __m256i*)qs);
  const __m128i packed = _mm_loadu_si128((const __m128i*)qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed),
                          _mm256_set1_epi8(0x0f));
}

// Q8_0's codes are signed but both byte dots take unsigned x signed: the sign trick moves the
// weight's sign onto the activation (|w| * sign(x, w) = w * x).
__attribute__((target("avx2,fma"))) inline __m256i unsigned_codes(__m256i codes, bool signed_w) {
  return signed_w ? _mm256_sign_epi8(codes, codes) : codes;
}

// sum over 32 lanes of u*s as 8 int32 lanes (u unsigned bytes, s signed bytes)
__attribute__((target("avx2,fma"))) inline __m256i dot_maddubs(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// The same sum in one AVX-512 VNNI instruction. Written as assembly so that the row loop keeps
// its AVX2 target: a target attribute cannot depend on a template parameter, and an AVX-512
// target would let the compiler emit AVX-512 anywhere in the AVX2 instantiation.
__attribute__((target("avx2,fma"))) inline __m256i dot_vnni(__m256i u, __m256i s) {
  __m256i acc = _mm256_setzero_si256();
  asm("vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
  return acc;
}

__attribute__((target("avx2,fma"))) inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// llama.cpp's activation blocks (quantize_row above) with AVX2: the same f32 products and
// round-half-even (vroundps under the default rounding mode is nearbyint), F16C's conversion
// for the f16 scales (round to nearest even, as float_to_half), so the bits are the scalar
// version's; ~20x faster than it (nearbyint is a libm call on the baseline ISA).
__attribute__((target("f16c"))) inline float round_to_half_f16c(float f) {
  return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

__attribute__((target("avx2,fma,f16c")))
void quantize_row_x86(int32_t fmt, const float* x, int64_t K, int8_t* q, float* d, float* ds,
                      int32_t* sums) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      m = _mm256_max_ps(m, _mm256_and_ps(v[i], abs_mask));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const float scale = amax / 127.f, inv = amax != 0.f ? 127.f / amax : 0.f;
    const __m256 mul = _mm256_set1_ps(inv);
    __m256i c[4];
    for (int i = 0; i < 4; ++i)
      c[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], mul),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
    const int total = _mm_cvtsi128_si32(s4);
    // int32 -> int8 (|code| <= 127, no saturation); the packs interleave 128-bit lanes
    __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]),
                                        _mm256_packs_epi32(c[2], c[3]));
    packed = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i*)(q + b * kBlock), packed);
    d[b] = round_to_half_f16c(scale);
    ds[b] = fmt == kQ4_1 ? round_to_half_f16c(scale * (float)total) : d[b] * (float)total;
    sums[b] = total;
  }
}

constexpr int kTile = 4;  // activation rows sharing one unpacked weight block

// R activation rows x C weight columns, every block: each weight block is unpacked once for the
// R rows, and the R*C accumulators are independent chains, so the FMA latency of one block
// overlaps the next column's work (one row and one column at a time was latency bound). Each
// output's arithmetic is that of one row and one column alone: acc += (d_w * d_x) * dot in
// block order over 8 lanes, then the lane sum plus the offset summed in block order, so a row
// gets the same bits whatever R, C, the batch and the thread split.
constexpr int64_t kAheadTiles = 2;

template <bool kVnni, int32_t kFmt, int R, int C>
__attribute__((target("avx2,fma,f16c"))) inline void tile_x86(
    const uint8_t* w, int64_t row_bytes, int64_t n, int64_t nb, const QRow* xs, float* y,
    int64_t N) {
  constexpr int bb = kFmt == kQ8_0 ? 34 : kFmt == kQ4_0 ? 18 : 20;
  constexpr int qs_at = kFmt == kQ4_1 ? 4 : 2;
  constexpr bool signed_w = kFmt == kQ8_0;
  const uint8_t* col[C];
  for (int c = 0; c < C; ++c) col[c] = w + (n + c) * row_bytes;
  __m256 acc[R][C];
  __m128 offset[R][C];  // lane 1: the offset's sum (lane 0 unused)
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      acc[r][c] = _mm256_setzero_ps();
      offset[r][c] = _mm_setzero_ps();
    }
  // The C columns interleave C streams, which the hardware prefetcher follows badly from DRAM
  // (576 x 49152 Q8_0, 30 MB: 2.6x slower than one column at a time without this); fetch the
  // next tile's bytes, C * bb of them per block, as this tile goes.
  const uint8_t* ahead = col[0] + kAheadTiles * C * row_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    for (int p = 0; p < C * bb; p += 64)
      _mm_prefetch((const char*)ahead + b * C * bb + p, _MM_HINT_T0);
    __m256i qx[R];
    __m128 dsx[R];  // the activation block's (d, s)
    for (int r = 0; r < R; ++r) {
      qx[r] = _mm256_loadu_si256((const __m256i*)(xs[r].q + b * kBlock));
      dsx[r] = _mm_unpacklo_ps(_mm_load_ss(xs[r].d + b), _mm_load_ss(xs[r].ds + b));
    }
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = col[c] + b * bb;
      // The weight block's (d, m) in one conversion; Q4_0's (d, d), its offset being -8 * d.
      uint32_t dm;
      if (kFmt == kQ4_1) {
        std::memcpy(&dm, blk, 4);
      } else {
        dm = load_u16(blk);
        dm |= dm << 16;
      }
      const __m128 dmw = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm));
      const __m256i codes = codes_avx2(blk + qs_at, kFmt);
      const __m256i wu = unsigned_codes(codes, signed_w);
      for (int r = 0; r < R; ++r) {
        const __m256i sx8 = signed_w ? _mm256_sign_epi8(qx[r], codes) : qx[r];
        const __m256i dot = kVnni ? dot_vnni(wu, sx8) : dot_maddubs(wu, sx8);
        const __m128 scales = _mm_mul_ps(dmw, dsx[r]);  // (d_w * d_x, m_w * s_x or d_w * s_x)
        acc[r][c] = _mm256_fmadd_ps(_mm256_broadcastss_ps(scales), _mm256_cvtepi32_ps(dot),
                                    acc[r][c]);
        // Q4_0's codes are nibble - 8: 8 * d_w * (d_x * sum x) comes off (times 8 is exact,
        // so the fused form rounds as the separate product and sum); Q4_1 adds m * s.
        if (kFmt == kQ4_1) offset[r][c] = _mm_add_ps(offset[r][c], scales);
        if (kFmt == kQ4_0)
          offset[r][c] = _mm_fmadd_ps(scales, _mm_set1_ps(-8.f), offset[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      y[r * N + n + c] =
          hsum_avx2(acc[r][c]) + _mm_cvtss_f32(_mm_movehdup_ps(offset[r][c]));
}

// Columns per tile for R rows: R * C accumulators and the R activation and C weight registers
// fit AVX2's 16.
constexpr int columns_for(int R) { return R <= 2 ? 4 : 2; }

template <bool kVnni, int32_t kFmt, int R>
__attribute__((target("avx2,fma,f16c"))) void columns_x86(
    const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t nb, const QRow* xs,
    float* y, int64_t N) {
  constexpr int C = columns_for(R);
  int64_t n = n0;
  for (; n + C <= n1; n += C) tile_x86<kVnni, kFmt, R, C>(w, row_bytes, n, nb, xs, y, N);
  for (; n < n1; ++n) tile_x86<kVnni, kFmt, R, 1>(w, row_bytes, n, nb, xs, y, N);
}

template <bool kVnni, int32_t kFmt>
__attribute__((target("avx2,fma,f16c"))) void rows_fmt_x86(
    const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t nb, const QRow* xs,
    int64_t M, float* y, int64_t N) {
  // Row tiles inside a band of columns, so the band's weights (~16 KB) stay in L1 across tiles.
  constexpr int64_t kBand = 48;
  for (int64_t b0 = n0; b0 < n1; b0 += kBand) {
    const int64_t b1 = std::min(n1, b0 + kBand);
    for (int64_t m0 = 0; m0 < M; m0 += kTile) {
      const QRow* x = xs + m0;
      float* ym = y + m0 * N;
      switch (std::min<int64_t>(kTile, M - m0)) {
        case 1: columns_x86<kVnni, kFmt, 1>(w, row_bytes, b0, b1, nb, x, ym, N); break;
        case 2: columns_x86<kVnni, kFmt, 2>(w, row_bytes, b0, b1, nb, x, ym, N); break;
        case 3: columns_x86<kVnni, kFmt, 3>(w, row_bytes, b0, b1, nb, x, ym, N); break;
        default: columns_x86<kVnni, kFmt, 4>(w, row_bytes, b0, b1, nb, x, ym, N); break;
      }
    }
  }
}

// Both x86 paths: kVnni picks the inner byte dot (run only where pick_path saw avx512vnni).
template <bool kVnni>
void rows_x86(int32_t fmt, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
              int64_t nb, const QRow* xs, int64_t M, float* y, int64_t N) {
  if (fmt == kQ8_0) rows_fmt_x86<kVnni, kQ8_0>(w, row_bytes, n0, n1, nb, xs, M, y, N);
  else if (fmt == kQ4_0) rows_fmt_x86<kVnni, kQ4_0>(w, row_bytes, n0, n1, nb, xs, M, y, N);
  else rows_fmt_x86<kVnni, kQ4_1>(w, row_bytes, n0, n1, nb, xs, M, y, N);
}
#endif  // NINFER_X86

#if defined(__aarch64__)
// ------------------------------------------------------------------------------- NEON
void rows_neon(int32_t fmt, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
               int64_t nb, const QRow* xs, int64_t M, float* y, int64_t N) {
  const int bb = block_bytes(fmt);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    for (int64_t m = 0; m < M; ++m) {
      const QRow& x = xs[m];
      float32x4_t acc = vdupq_n_f32(0.f);
      float offset = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        BlockView v = view(row + b * bb, fmt);
        int8x16_t w0, w1;
        if (fmt == kQ8_0) {
          w0 = vld1q_s8((const int8_t*)v.qs);
          w1 = vld1q_s8((const int8_t*)v.qs + 16);
        } else {
          uint8x16_t packed = vld1q_u8(v.qs);
          w0 = vreinterpretq_s8_u8(vandq_u8(packed, vdupq_n_u8(0x0f)));
          w1 = vreinterpretq_s8_u8(vshrq_n_u8(packed, 4));
        }
        int8x16_t x0 = vld1q_s8(x.q + b * kBlock), x1 = vld1q_s8(x.q + b * kBlock + 16);
        int16x8_t p = vmull_s8(vget_low_s8(w0), vget_low_s8(x0));
        p = vmlal_s8(p, vget_high_s8(w0), vget_high_s8(x0));
        int16x8_t r = vmull_s8(vget_low_s8(w1), vget_low_s8(x1));
        r = vmlal_s8(r, vget_high_s8(w1), vget_high_s8(x1));
        int32x4_t s = vaddq_s32(vpaddlq_s16(p), vpaddlq_s16(r));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(s), v.d * x.d[b]);
        offset += (fmt == kQ4_0 ? -8.f * v.d : v.m) * x.ds[b];
      }
      y[m * N + n] = vaddvq_f32(acc) + offset;
    }
  }
}
#endif

// ------------------------------------------------------------------ interleaved (x16) layout
// The same blocks regrouped at load (formats.interleave_blocks) so that one vector holds 16
// output columns: per group of 16 columns and per block b, one record of 16 * bb bytes:
//   the 16 columns' d (f16) | Q4_1: their 16 m (f16) | codes: vector j (64 bytes) holds, for
//   column c, 4 bytes at 4c: Q4 qs[4j..4j+3] (low nibbles: elements 4j+t, high: 16+4j+t),
//   j < 4; Q8 q[4j..4j+3], j < 8.
// A 4-byte dot of 16 columns against one broadcast group of 4 activation codes is then one
// VNNI instruction, the 16 block dots land in the 16 lanes of one register, and a block's
// scaling (d_w * d_x, and Q4_1's m * s) is one multiply and FMA for all 16 columns: the row
// layout above pays a horizontal-free but per-column convert, multiply and FMA for every
// block. Every path computes, per column and row, in block order:
//   dot = sum(u * x) - off * sum(x)  (exact int32; u the unsigned code: Q4 nibble, Q8 q + 128;
//                                    off 8 for Q4_0, 128 for Q8_0, 0 for Q4_1)
//   acc = fma(d_w * d_x, float(dot), acc);  Q4_1: acc = fma(m_w, s_x, acc)
// so the scalar, AVX2 and AVX-512 paths give the same bits, for any rows, tiles and threads.
constexpr int kGroup = 16;

inline int32_t load_i32(const int8_t* p) { int32_t v; std::memcpy(&v, p, 4); return v; }

template <int32_t kFmt>
constexpr int code_offset() { return kFmt == kQ8_0 ? 128 : kFmt == kQ4_0 ? 8 : 0; }

void x16_scalar(int32_t fmt, const uint8_t* w, int64_t record_row, int64_t g0, int64_t g1,
                int64_t nb, const QRow* xs, int64_t M, float* y, int64_t N) {
  const int bb = block_bytes(fmt), rec = kGroup * bb, codes_at = fmt == kQ4_1 ? 64 : 32;
  const int off = fmt == kQ8_0 ? 128 : fmt == kQ4_0 ? 8 : 0;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = w + g * record_row;
    for (int64_t m = 0; m < M; ++m)
      for (int c = 0; c < kGroup; ++c) {
        float acc = 0.f;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* r = group + b * rec;
          int dot = 0;
          for (int j = 0; j < 8; ++j)
            for (int t = 0; t < 4; ++t) {
              int u;
              if (fmt == kQ8_0) {
                u = (r[codes_at + 64 * j + 4 * c + t] ^ 0x80);
              } else {
                const uint8_t byte = r[codes_at + 64 * (j & 3) + 4 * c + t];
                u = j < 4 ? byte & 0xf : byte >> 4;
              }
              dot += u * xs[m].q[b * kBlock + 4 * j + t];
            }
          dot -= off * xs[m].sum[b];
          const float dw = half_to_float(load_u16(r + 2 * c));
          acc = std::fma(dw * xs[m].d[b], (float)dot, acc);
          if (fmt == kQ4_1) acc = std::fma(half_to_float(load_u16(r + 32 + 2 * c)), xs[m].ds[b], acc);
        }
        y[m * N + g * kGroup + c] = acc;
      }
  }
}

#ifdef NINFER_X86
// AVX2 (no VNNI): each group as two halves of 8 columns; byte dots by maddubs, whose 16-bit
// pair sums saturate past 32767: Q8 codes go signed through the sign trick (|w| * sign(x, w),
// at most 2 * 128 * 127), nibbles as they are (at most 2 * 15 * 127).
template <int32_t kFmt, int R>
__attribute__((target("avx2,fma,f16c"))) void x16_half_avx2(
    const uint8_t* group, int64_t nb, const QRow* xs, float* y, int64_t N, int64_t n, int h) {
  constexpr int rec = kGroup * (kFmt == kQ8_0 ? 34 : kFmt == kQ4_0 ? 18 : 20);
  constexpr int codes_at = kFmt == kQ4_1 ? 64 : 32;
  const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rp = group + b * rec;
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(rp + 16 * h)));
    __m256 mw = _mm256_setzero_ps();
    if (kFmt == kQ4_1) mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(rp + 32 + 16 * h)));
    __m256i u[8];
    for (int j = 0; j < (kFmt == kQ8_0 ? 8 : 4); ++j) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(rp + codes_at + 64 * j + 32 * h));
      if (kFmt == kQ8_0) {
        u[j] = v;  // signed codes
      } else {
        u[j] = _mm256_and_si256(v, low);
        u[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
    }
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = xs[r].q + b * kBlock;
      __m256i dot = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        const __m256i bx = _mm256_set1_epi32(load_i32(xq + 4 * j));
        const __m256i p = kFmt == kQ8_0
            ? _mm256_maddubs_epi16(_mm256_sign_epi8(u[j], u[j]), _mm256_sign_epi8(bx, u[j]))
            : _mm256_maddubs_epi16(u[j], bx);
        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p, ones));
      }
      // Q8 here is already the signed dot: + 128 * sum(x) - 128 * sum(x)
      if (kFmt == kQ4_0)
        dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(8 * xs[r].sum[b]));
      const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(xs[r].d[b]));
      acc[r] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot), acc[r]);
      if (kFmt == kQ4_1) acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xs[r].ds[b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * N + n + 8 * h, acc[r]);
}

template <int32_t kFmt>
__attribute__((target("avx2,fma,f16c"))) void x16_fmt_avx2(
    const uint8_t* w, int64_t record_row, int64_t g0, int64_t g1, int64_t nb, const QRow* xs,
    int64_t M, float* y, int64_t N) {
  constexpr int kRows = 4;  // 8 code registers + scales + 4 accumulators fit AVX2's 16
  for (int64_t g = g0; g < g1; ++g)
    for (int64_t m0 = 0; m0 < M; m0 += kRows)
      for (int h = 0; h < 2; ++h) {
        const uint8_t* group = w + g * record_row;
        const QRow* x = xs + m0;
        float* ym = y + m0 * N;
        switch (std::min<int64_t>(kRows, M - m0)) {
          case 1: x16_half_avx2<kFmt, 1>(group, nb, x, ym, N, g * kGroup, h); break;
          case 2: x16_half_avx2<kFmt, 2>(group, nb, x, ym, N, g * kGroup, h); break;
          case 3: x16_half_avx2<kFmt, 3>(group, nb, x, ym, N, g * kGroup, h); break;
          default: x16_half_avx2<kFmt, 4>(group, nb, x, ym, N, g * kGroup, h); break;
        }
      }
}

void x16_avx2(int32_t fmt, const uint8_t* w, int64_t record_row, int64_t g0, int64_t g1,
              int64_t nb, const QRow* xs, int64_t M, float* y, int64_t N) {
  if (fmt == kQ8_0) x16_fmt_avx2<kQ8_0>(w, record_row, g0, g1, nb, xs, M, y, N);
  else if (fmt == kQ4_0) x16_fmt_avx2<kQ4_0>(w, record_row, g0, g1, nb, xs, M, y, N);
  else x16_fmt_avx2<kQ4_1>(w, record_row, g0, g1, nb, xs, M, y, N);
}

// AVX-512 VNNI: a whole group in one register, up to 8 rows sharing each unpacked block.
#define NINFER_AVX512 "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
template <int32_t kFmt, int R>
__attribute__((target(NINFER_AVX512))) void x16_tile_avx512(
    const uint8_t* group, int64_t nb, const QRow* xs, float* y, int64_t N, int64_t n) {
  constexpr int rec = kGroup * (kFmt == kQ8_0 ? 34 : kFmt == kQ4_0 ? 18 : 20);
  constexpr int codes_at = kFmt == kQ4_1 ? 64 : 32;
  const __m512i low = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8((char)0x80);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* rp = group + b * rec;
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)rp));
    __m512 mw = _mm512_setzero_ps();
    if (kFmt == kQ4_1) mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(rp + 32)));
    __m512i u[8];
    for (int j = 0; j < (kFmt == kQ8_0 ? 8 : 4); ++j) {
      const __m512i v = _mm512_loadu_si512((const void*)(rp + codes_at + 64 * j));
      if (kFmt == kQ8_0) {
        u[j] = _mm512_xor_si512(v, flip);  // q + 128 as an unsigned byte
      } else {
        u[j] = _mm512_and_si512(v, low);
        u[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
    }
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = xs[r].q + b * kBlock;
      // two chains: half the latency of eight dependent dot instructions
      __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        even = _mm512_dpbusd_epi32(even, u[j], _mm512_set1_epi32(load_i32(xq + 4 * j)));
        odd = _mm512_dpbusd_epi32(odd, u[j + 1], _mm512_set1_epi32(load_i32(xq + 4 * j + 4)));
      }
      __m512i dot = _mm512_add_epi32(even, odd);
      if (code_offset<kFmt>())
        dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(code_offset<kFmt>() * xs[r].sum[b]));
      const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(xs[r].d[b]));
      acc[r] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot), acc[r]);
      if (kFmt == kQ4_1) acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[r].ds[b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * N + n, acc[r]);
}

template <int32_t kFmt>
__attribute__((target(NINFER_AVX512))) void x16_fmt_avx512(
    const uint8_t* w, int64_t record_row, int64_t g0, int64_t g1, int64_t nb, const QRow* xs,
    int64_t M, float* y, int64_t N) {
  constexpr int kRows = 8;
  // all row tiles of a group before the next: its records (<= 16 KB at K = 1536) stay in L1
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = w + g * record_row;
    for (int64_t m0 = 0; m0 < M; m0 += kRows) {
      const QRow* x = xs + m0;
      float* ym = y + m0 * N;
      const int64_t n = g * kGroup;
      switch (std::min<int64_t>(kRows, M - m0)) {
        case 1: x16_tile_avx512<kFmt, 1>(group, nb, x, ym, N, n); break;
        case 2: x16_tile_avx512<kFmt, 2>(group, nb, x, ym, N, n); break;
        case 3: x16_tile_avx512<kFmt, 3>(group, nb, x, ym, N, n); break;
        case 4: x16_tile_avx512<kFmt, 4>(group, nb, x, ym, N, n); break;
        case 5: x16_tile_avx512<kFmt, 5>(group, nb, x, ym, N, n); break;
        case 6: x16_tile_avx512<kFmt, 6>(group, nb, x, ym, N, n); break;
        case 7: x16_tile_avx512<kFmt, 7>(group, nb, x, ym, N, n); break;
        default: x16_tile_avx512<kFmt, 8>(group, nb, x, ym, N, n); break;
      }
    }
  }
}

void x16_avx512(int32_t fmt, const uint8_t* w, int64_t record_row, int64_t g0, int64_t g1,
                int64_t nb, const QRow* xs, int64_t M, float* y, int64_t N) {
  if (fmt == kQ8_0) x16_fmt_avx512<kQ8_0>(w, record_row, g0, g1, nb, xs, M, y, N);
  else if (fmt == kQ4_0) x16_fmt_avx512<kQ4_0>(w, record_row, g0, g1, nb, xs, M, y, N);
  else x16_fmt_avx512<kQ4_1>(w, record_row, g0, g1, nb, xs, M, y, N);
}
#endif  // NINFER_X86

using RowsFn = void (*)(int32_t, const uint8_t*, int64_t, int64_t, int64_t, int64_t,
                        const QRow*, int64_t, float*, int64_t);
using QuantizeFn = void (*)(int32_t, const float*, int64_t, int8_t*, float*, float*, int32_t*);

struct Path {
  RowsFn fn;
  const char* name;
  QuantizeFn quantize = quantize_row;  // the x86 paths' own gives the same bits, faster
  RowsFn x16 = x16_scalar;  // the interleaved layout's (same bits on every path)
};

Path pick_path() {
#ifdef NINFER_X86
  __builtin_cpu_init();
  const bool f16c = __builtin_cpu_supports("f16c");  // every AVX2 CPU so far has it
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && f16c)
    return {rows_x86<true>, "avx512vnni", quantize_row_x86, x16_avx512};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)
    return {rows_x86<false>, "avx2", quantize_row_x86, x16_avx2};
#endif
#if defined(__aarch64__)
  return {rows_neon, "neon"};
#endif
  return {rows_scalar, "scalar"};
}

// A path forced by name (tests run every path this CPU has against the reference).
Path path_named(int32_t which) {
  Path best = pick_path();
  if (which == 0) return best;
  if (which == 1) return {rows_scalar, "scalar"};
#ifdef NINFER_X86
  if (which == 2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return {rows_x86<false>, "avx2", quantize_row_x86, x16_avx2};
  if (which == 3 && std::strcmp(best.name, "avx512vnni") == 0) return best;
#endif
#if defined(__aarch64__)
  if (which == 4) return best;
#endif
  return {nullptr, "unavailable"};
}

// Below this many weight bytes one thread does it all: handing half to a pool thread costs
// more than the half takes (the 576x576 Q4_1 projections are ~200 KB).
constexpr int64_t kSplitBytes = 1 << 19;

ffi::Error GgmlMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> w,
                      ffi::ResultBuffer<ffi::F32> y, int32_t fmt, int32_t path, int32_t layout) {
  if (fmt < kQ8_0 || fmt > kQ4_1) return ffi::Error::InvalidArgument("unknown block format");
  if (layout != 0 && layout != 1) return ffi::Error::InvalidArgument("unknown layout");
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2) return ffi::Error::InvalidArgument("x, w must be 2-D");
  // layout 0: one row of blocks per column; 1: one row of records per group of 16 columns
  const int64_t per_row = layout ? kGroup : 1;
  const int64_t M = xd[0], K = xd[1], N = wd[0] * per_row, row_bytes = wd[1];
  const int64_t nb = K / kBlock;
  if (K % kBlock || nb * block_bytes(fmt) * per_row != row_bytes)
    return ffi::Error::InvalidArgument("K does not match the weight's blocks");
  Path p = path_named(path);
  if (!p.fn) return ffi::Error::InvalidArgument("that SIMD path is not available on this CPU");
  const RowsFn fn = layout ? p.x16 : p.fn;
  const int64_t units = wd[0];  // columns, or groups of them, handed out to threads

  std::vector<int8_t> q(M * K);
  std::vector<float> d(M * nb), ds(M * nb);
  std::vector<int32_t> sums(M * nb);
  std::vector<QRow> rows(M);
  const float* xp = x.typed_data();
  for (int64_t m = 0; m < M; ++m) {
    p.quantize(fmt, xp + m * K, K, q.data() + m * K, d.data() + m * nb, ds.data() + m * nb,
               sums.data() + m * nb);
    rows[m] = {q.data() + m * K, d.data() + m * nb, ds.data() + m * nb, sums.data() + m * nb};
  }
  const uint8_t* wp = w.typed_data();
  float* yp = y->typed_data();
  const int64_t workers = std::min<int64_t>(pool.num_threads(), 8);
  const int64_t parts = units * row_bytes >= kSplitBytes && workers > 1 ? workers : 1;
  if (parts == 1) {
    fn(fmt, wp, row_bytes, 0, units, nb, rows.data(), M, yp, N);
    return ffi::Error::Success();
  }
  // Chunks of columns are claimed from a shared counter by this thread and by the pool tasks,
  // so the caller never waits on a task that has not started (a busy or one-thread pool just
  // leaves it all to the caller); the state is shared because a late task may outlive the call.
  struct Shared {
    std::atomic<int64_t> next{0}, done{0};
    std::vector<int8_t> q;
    std::vector<float> d, ds;
    std::vector<int32_t> sums;
    std::vector<QRow> rows;
  };
  auto shared = std::make_shared<Shared>();
  shared->q = std::move(q);
  shared->d = std::move(d);
  shared->ds = std::move(ds);
  shared->sums = std::move(sums);
  shared->rows = std::move(rows);
  const int64_t chunks = std::min(units, parts * 4), step = (units + chunks - 1) / chunks;
  auto work = [=] {
    for (int64_t i; (i = shared->next.fetch_add(1)) < chunks;) {
      const int64_t n0 = std::min(units, i * step), n1 = std::min(units, n0 + step);
      fn(fmt, wp, row_bytes, n0, n1, nb, shared->rows.data(), M, yp, N);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t i = 1; i < parts; ++i) pool.Schedule(decltype(work)(work));
  work();
  while (shared->done.load(std::memory_order_acquire) < chunks) {
#ifdef NINFER_X86
    _mm_pause();
#endif
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ninfer_ggml_matmul, GgmlMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("fmt")
                                  .Attr<int32_t>("path")
                                  .Attr<int32_t>("layout"));

// The path picked on this CPU, for logs and tests (ctypes).
extern "C" const char* ninfer_ggml_path_name(int32_t which) { return path_named(which).name; }

// Whether the interleaved layout has a SIMD path here (else the load keeps the row layout).
extern "C" int32_t ninfer_ggml_interleaved_simd() { return pick_path().x16 != x16_scalar; }
