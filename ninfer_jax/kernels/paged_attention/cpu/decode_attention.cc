// Paged decode attention on the CPU (one query token per row), the C++ twin of
// reference.paged_decode_attention for f32, bf16 or f16 pages: per row and kv head, the scores
// of the G query heads against keys 0..length-1 (page_table[t / S], slot t % S), an exact
// two-pass softmax in f32, and the probability-weighted values divided by the total. Pages are
// read in place and widened to f32 in registers (bf16 halves the bytes a long context reads,
// and the step is memory-bound there). The jnp reference walks 64-key blocks in an XLA while
// loop whose page gathers and per-op overhead cost ~0.1 ms per layer for one row at context
// 200 (docs/benchmarks.md).
//
// Paths, picked once at run time from the CPU's features: AVX-512 and AVX2 + FMA + F16C (the
// body in decode_attention_simd.h, compiled once per ISA; head dims in 16s / 8s), and a
// portable scalar loop for anything else. Each (row, kv head) is computed alone in a fixed
// order, so a row gets the same bits alone or in any batch. One thread: spreading the pairs
// over XLA's intra-op pool measured no gain on the 2-vCPU host, where one core already reads
// KV at the ~20 GB/s the VM gets from memory (docs/benchmarks.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

// NINFER_PORTABLE builds only the scalar path (how a non-x86 build runs, testable on x86).
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(NINFER_PORTABLE)
#include <immintrin.h>
#define NINFER_X86 1
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Page element types besides float: the raw 16 bits.
struct Bf16 { uint16_t bits; };
struct F16 { uint16_t bits; };

inline float widen(float x) { return x; }
inline float widen(Bf16 x) {
  const uint32_t bits = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float widen(F16 x) {
  const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16, exp = (x.bits >> 10) & 0x1fu,
                 mant = x.bits & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else {  // zero or subnormal: mant * 2^-24, exact in f32
    const float f = float(mant) * 5.9604645e-8f;
    return sign ? -f : f;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Keys per row are padded to a multiple of this (the widest vector, and the SIMD score pass's
// four keys at a time).
constexpr int64_t kPad = 16;

// One row's kv head: its G query heads against keys 0..L-1.
template <typename T>
struct Head {
  const float* q;          // [G, D], already scaled
  const T* const* keys;    // [Lp] key rows; rows L..Lp-1 repeat row L-1 (their scores unused)
  const T* const* values;  // [Lp] likewise
  int64_t G, D, L, Lp;
  float* scores;  // [G, Lp] scratch: scores, then exp(score - max)
  float* total;   // [G] scratch: the softmax denominators
  float* out;     // [G, D]
};

template <typename T>
inline float dot(const float* q, const T* k, int64_t D) {
  float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};  // vectorizable, no one long chain
  int64_t i = 0;
  for (; i + 8 <= D; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += q[i + j] * widen(k[i + j]);
  float sum = ((part[0] + part[1]) + (part[2] + part[3])) +
              ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < D; ++i) sum += q[i] * widen(k[i]);
  return sum;
}

template <typename T>
void attend_scalar(const Head<T>& h) {
  const int64_t G = h.G, D = h.D, L = h.L, Lp = h.Lp;
  for (int64_t t = 0; t < L; ++t)
    for (int64_t g = 0; g < G; ++g) h.scores[g * Lp + t] = dot(h.q + g * D, h.keys[t], D);
  for (int64_t g = 0; g < G; ++g) {
    float* s = h.scores + g * Lp;
    const float top = *std::max_element(s, s + L);
    float total = 0.f;
    for (int64_t t = 0; t < L; ++t) total += (s[t] = std::exp(s[t] - top));
    h.total[g] = total;
  }
  std::fill(h.out, h.out + G * D, 0.f);
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t g = 0; g < G; ++g) {
      const float p = h.scores[g * Lp + t];
      float* o = h.out + g * D;
      for (int64_t d = 0; d < D; ++d) o[d] += p * widen(h.values[t][d]);
    }
  }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d) h.out[g * D + d] /= h.total[g];
}

#ifdef NINFER_X86
// exp(x) for the softmax's x <= 0 (Cephes' expf: 2^n times a degree-7 polynomial on
// |r| <= ln2 / 2, within ~2 ulp of expf); below ln(FLT_MIN) it returns 0 where expf returns
// subnormals, a difference no sum of probabilities can see. NaN stays NaN.
constexpr float kExpLow = -87.33654f, kLog2e = 1.44269504f, kLn2Hi = 0.693359375f,
                kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

namespace avx2 {
#define NINFER_TARGET __attribute__((target("avx2,fma,f16c")))
struct Simd {
  using V = __m256;
  static constexpr int64_t kLanes = 8;
  static constexpr int kValueVectors = 2;  // GN x 2 accumulators fit the 16 registers
  NINFER_TARGET static V zero() { return _mm256_setzero_ps(); }
  NINFER_TARGET static V set1(float x) { return _mm256_set1_ps(x); }
  NINFER_TARGET static V load(const float* p) { return _mm256_loadu_ps(p); }
  NINFER_TARGET static V load(const Bf16* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  NINFER_TARGET static V load(const F16* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
  }
  NINFER_TARGET static void storeu(float* p, V x) { _mm256_storeu_ps(p, x); }
  NINFER_TARGET static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  NINFER_TARGET static V add(V a, V b) { return _mm256_add_ps(a, b); }
  NINFER_TARGET static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  NINFER_TARGET static V div(V a, V b) { return _mm256_div_ps(a, b); }
  NINFER_TARGET static V max(V a, V b) { return _mm256_max_ps(a, b); }
  NINFER_TARGET static __m128 sum4(V a, V b, V c, V d) {
    // hadd(hadd(a, b), hadd(c, d)) holds each vector's low-half sum, then its high-half sum.
    const V abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
  }
  NINFER_TARGET static float reduce_add(V x) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  }
  NINFER_TARGET static float reduce_max(V x) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  }
  NINFER_TARGET static V exp(V x) {
    const V low = set1(kExpLow);
    const V kept = _mm256_cmp_ps(x, low, _CMP_NLT_UQ);
    x = _mm256_max_ps(low, x);  // maxps returns its second operand for a NaN
    const V n = _mm256_round_ps(_mm256_mul_ps(x, set1(kLog2e)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fnmadd_ps(n, set1(kLn2Hi), x);
    r = _mm256_fnmadd_ps(n, set1(kLn2Lo), r);
    V p = set1(kExpPoly[0]);
    for (int i = 1; i < 6; ++i) p = fma(p, r, set1(kExpPoly[i]));
    const V y = add(fma(p, _mm256_mul_ps(r, r), r), set1(1.f));
    const __m256i scale =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(scale)), kept);
  }
};
#include "decode_attention_simd.h"
#undef NINFER_TARGET
}  // namespace avx2

namespace avx512 {
#define NINFER_TARGET __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,f16c")))
struct Simd {
  using V = __m512;
  static constexpr int64_t kLanes = 16;
  static constexpr int kValueVectors = 4;  // GN x 4 accumulators fit the 32 registers
  NINFER_TARGET static V zero() { return _mm512_setzero_ps(); }
  NINFER_TARGET static V set1(float x) { return _mm512_set1_ps(x); }
  NINFER_TARGET static V load(const float* p) { return _mm512_loadu_ps(p); }
  NINFER_TARGET static V load(const Bf16* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  NINFER_TARGET static V load(const F16* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
  }
  NINFER_TARGET static void storeu(float* p, V x) { _mm512_storeu_ps(p, x); }
  NINFER_TARGET static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  NINFER_TARGET static V add(V a, V b) { return _mm512_add_ps(a, b); }
  NINFER_TARGET static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  NINFER_TARGET static V div(V a, V b) { return _mm512_div_ps(a, b); }
  NINFER_TARGET static V max(V a, V b) { return _mm512_max_ps(a, b); }
  NINFER_TARGET static __m128 sum4(V a, V b, V c, V d) {
    // Fold 512 -> 256 bits per vector pairing a with b and c with d, then 256 -> 128 pairing
    // ab with cd: four 128-bit blocks, one per vector, each to sum across its lanes.
    const V ab = add(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const V cd = add(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    V x = add(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    x = add(x, _mm512_permute_ps(x, 0xB1));
    x = add(x, _mm512_permute_ps(x, 0x4E));
    const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, x));
  }
  NINFER_TARGET static float reduce_add(V x) { return _mm512_reduce_add_ps(x); }
  NINFER_TARGET static float reduce_max(V x) { return _mm512_reduce_max_ps(x); }
  NINFER_TARGET static V exp(V x) {
    const V low = set1(kExpLow);
    const __mmask16 kept = _mm512_cmp_ps_mask(x, low, _CMP_NLT_UQ);
    x = _mm512_max_ps(low, x);
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, set1(kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, set1(kLn2Lo), r);
    V p = set1(kExpPoly[0]);
    for (int i = 1; i < 6; ++i) p = fma(p, r, set1(kExpPoly[i]));
    const V y = add(fma(p, _mm512_mul_ps(r, r), r), set1(1.f));
    const __m512i scale =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(kept, y, _mm512_castsi512_ps(scale));
  }
};
#include "decode_attention_simd.h"
#undef NINFER_TARGET
}  // namespace avx512
#endif

template <typename T>
using AttendFn = void (*)(const Head<T>&);

template <typename T>
AttendFn<T> pick_attend(int64_t D) {
#ifdef NINFER_X86
  __builtin_cpu_init();
  const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                        __builtin_cpu_supports("f16c");
  if (D % 16 == 0 && has_avx2 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw"))
    return avx512::attend<T>;
  if (D % 8 == 0 && has_avx2) return avx2::attend<T>;
#endif
  return attend_scalar<T>;
}

// The path for head dim D, chosen once per page type and class of D.
template <typename T>
AttendFn<T> attend_for(int64_t D) {
  static const AttendFn<T> paths[3] = {pick_attend<T>(16), pick_attend<T>(8), pick_attend<T>(1)};
  return paths[D % 16 == 0 ? 0 : D % 8 == 0 ? 1 : 2];
}

template <typename T>
struct Call {
  const float* q;
  const T* k;
  const T* v;
  const int32_t* table;
  const int32_t* lengths;
  float* out;
  int64_t H, K, G, D, P, S, W;
  float scale;
  AttendFn<T> fn;

  // As the reference: at least the row's first key, at most what its table covers.
  int64_t length(int64_t b) const {
    return std::min<int64_t>(std::max<int32_t>(lengths[b], 1), W * S);
  }

  void attend(int64_t b, int64_t kh) const {
    // Scratch reused across calls; per thread, as XLA may run two executions at once.
    thread_local std::vector<float> qs, scores, total;
    thread_local std::vector<const T*> keys, values;
    const int64_t L = length(b), Lp = (L + kPad - 1) / kPad * kPad;
    qs.resize(G * D);
    scores.resize(G * Lp);
    total.resize(G);
    keys.resize(Lp);
    values.resize(Lp);
    for (int64_t t = 0; t < Lp; ++t) {
      const int64_t u = std::min(t, L - 1);
      // Page ids clamped into the pool, as jnp.take's clip.
      const int64_t page = std::min<int64_t>(std::max<int32_t>(table[b * W + u / S], 0), P - 1);
      const int64_t at = ((page * K + kh) * S + u % S) * D;
      keys[t] = k + at;
      values[t] = v + at;
    }
    const float* qrow = q + (b * H + kh * G) * D;
    for (int64_t i = 0; i < G * D; ++i) qs[i] = qrow[i] * scale;
    fn(Head<T>{qs.data(), keys.data(), values.data(), G, D, L, Lp, scores.data(), total.data(),
               out + (b * H + kh * G) * D});
  }
};

template <typename T>
ffi::Error attend_pages(ffi::Buffer<ffi::F32>& q, ffi::AnyBuffer& k_cache,
                        ffi::AnyBuffer& v_cache, ffi::Buffer<ffi::S32>& page_table,
                        ffi::Buffer<ffi::S32>& lengths, ffi::Result<ffi::Buffer<ffi::F32>>& out,
                        float scale) {
  auto qd = q.dimensions(), cd = k_cache.dimensions(), td = page_table.dimensions();
  const int64_t B = qd[0], H = qd[1], D = qd[2];
  const int64_t K = cd[1];
  Call<T> call{q.typed_data(), (const T*)k_cache.untyped_data(),
               (const T*)v_cache.untyped_data(), page_table.typed_data(), lengths.typed_data(),
               out->typed_data(), H, K, H / K, D, cd[0], cd[2], td[1], scale, attend_for<T>(D)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t kh = 0; kh < K; ++kh) call.attend(b, kh);
  return ffi::Error::Success();
}

ffi::Error DecodeAttention(ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k_cache,
                           ffi::AnyBuffer v_cache, ffi::Buffer<ffi::S32> page_table,
                           ffi::Buffer<ffi::S32> lengths, ffi::ResultBuffer<ffi::F32> out,
                           float scale) {
  auto qd = q.dimensions(), cd = k_cache.dimensions(), td = page_table.dimensions();
  if (qd.size() != 3 || cd.size() != 4 || td.size() != 2)
    return ffi::Error::InvalidArgument("q [B, H, D], caches [P, K, S, D], table [B, W]");
  auto vd = v_cache.dimensions();
  if (cd[3] != qd[2] || qd[1] % cd[1] || td[0] != qd[0] || lengths.dimensions()[0] != qd[0] ||
      !std::equal(cd.begin(), cd.end(), vd.begin(), vd.end()) ||
      v_cache.element_type() != k_cache.element_type())
    return ffi::Error::InvalidArgument("q, caches, table and lengths do not agree");
  switch (k_cache.element_type()) {
    case ffi::DataType::F32:
      return attend_pages<float>(q, k_cache, v_cache, page_table, lengths, out, scale);
    case ffi::DataType::BF16:
      return attend_pages<Bf16>(q, k_cache, v_cache, page_table, lengths, out, scale);
    case ffi::DataType::F16:
      return attend_pages<F16>(q, k_cache, v_cache, page_table, lengths, out, scale);
    default:
      return ffi::Error::InvalidArgument("pages must be f32, bf16 or f16");
  }
}

// Stores new [N, K, D] at flat slots [N] (page * S + offset) of a 16-bit cache [P, K, S, D],
// in place (the result aliases the cache). XLA's CPU backend widens a bf16 scatter to f32
// over the whole cache and back, ~20 ms per step for the pool of 30 layers at context 2000;
// this copies N x K x D values.
ffi::Error WriteKv(ffi::AnyBuffer cache, ffi::AnyBuffer new_rows, ffi::Buffer<ffi::S32> slots,
                   ffi::Result<ffi::AnyBuffer> out) {
  auto cd = cache.dimensions(), nd = new_rows.dimensions();
  if (cd.size() != 4 || nd.size() != 3 || nd[1] != cd[1] || nd[2] != cd[3] ||
      slots.dimensions()[0] != nd[0] || new_rows.element_type() != cache.element_type() ||
      ffi::ByteWidth(cache.element_type()) != 2)
    return ffi::Error::InvalidArgument("cache [P, K, S, D] and new [N, K, D] of one 16-bit "
                                       "dtype, slots [N]");
  const int64_t P = cd[0], K = cd[1], S = cd[2], D = cd[3], N = nd[0];
  auto* dst = static_cast<uint16_t*>(out->untyped_data());
  if (dst != cache.untyped_data())  // not aliased after all: start from the cache
    std::memcpy(dst, cache.untyped_data(), cache.size_bytes());
  const auto* src = static_cast<const uint16_t*>(new_rows.untyped_data());
  const int32_t* at = slots.typed_data();
  for (int64_t n = 0; n < N; ++n) {
    if (at[n] < 0 || at[n] >= P * S) continue;  // never in a step (padding writes page 0)
    const int64_t page = at[n] / S, offset = at[n] % S;
    for (int64_t kh = 0; kh < K; ++kh)
      std::memcpy(dst + ((page * K + kh) * S + offset) * D, src + (n * K + kh) * D, D * 2);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ninfer_paged_decode_attention, DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ninfer_paged_write_kv16, WriteKv,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>());
