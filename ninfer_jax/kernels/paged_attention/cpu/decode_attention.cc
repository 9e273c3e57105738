// Paged decode attention on the CPU (one query token per row), the C++ twin of
// reference.paged_decode_attention for f32 pages: per row and kv head, the scores of the G
// query heads against keys 0..length-1 (page_table[t / S], slot t % S), an exact two-pass
// softmax in f32, and the probability-weighted values. The jnp reference walks 64-key blocks
// in an XLA while loop whose page gathers and per-op overhead cost ~0.1 ms per layer for one
// row at context 200 (docs/benchmarks.md); this reads the keys in place.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define NINFER_X86 1
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// q . k over D with 8 partial sums (vectorizable without reassociating a single chain).
inline float dot(const float* a, const float* b, int64_t D) {
  float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= D; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += a[i + j] * b[i + j];
  float sum = ((part[0] + part[1]) + (part[2] + part[3])) +
              ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < D; ++i) sum += a[i] * b[i];
  return sum;
}

// One row's G query heads (qs [G, D], already scaled) against one kv head's keys 0..L-1 at
// rows keys[t], values[t] -> out [G, D]. scores [G, L] and acc [G, D] are scratch.
void attend(const float* qs, int64_t G, int64_t D, int64_t L,
                          const float* const* keys, const float* const* values, float* scores,
                          float* acc, float* out) {
  for (int64_t t = 0; t < L; ++t)
    for (int64_t g = 0; g < G; ++g) scores[g * L + t] = dot(qs + g * D, keys[t], D);
  for (int64_t g = 0; g < G; ++g) {
    float* s = scores + g * L;
    const float top = *std::max_element(s, s + L);
    float total = 0.f;
    for (int64_t t = 0; t < L; ++t) total += (s[t] = std::exp(s[t] - top));
    for (int64_t t = 0; t < L; ++t) s[t] /= total;
  }
  std::fill(acc, acc + G * D, 0.f);
  for (int64_t t = 0; t < L; ++t) {
    const float* v = values[t];
    for (int64_t g = 0; g < G; ++g) {
      const float p = scores[g * L + t];
      float* a = acc + g * D;
      for (int64_t d = 0; d < D; ++d) a[d] += p * v[d];
    }
  }
  std::copy(acc, acc + G * D, out);
}

#ifdef NINFER_X86
// attend() with AVX2 + FMA for D a multiple of 8: each key and value row is loaded once for
// the G heads; the value pass runs per 8-wide slice of D so the G accumulators stay in
// registers.
__attribute__((target("avx2,fma"))) void attend_avx2(
    const float* qs, int64_t G, int64_t D, int64_t L, const float* const* keys,
    const float* const* values, float* scores, float* acc, float* out) {
  constexpr int kMaxG = 8;
  constexpr int64_t kAhead = 6;
  for (int64_t g0 = 0; g0 < G; g0 += kMaxG) {
    const int64_t gn = std::min<int64_t>(kMaxG, G - g0);
    for (int64_t t = 0; t < L; ++t) {
      // Rows come from pages all over the pool, mostly from DRAM in a step: fetch the keys a
      // few rows ahead, and this row's values for the pass after the softmax (8 rows at
      // context 200, 30 layers' caches, cold: 365 -> ~300 us per layer on the 2-core host).
      if (g0 == 0) {
        const char* next = (const char*)keys[std::min<int64_t>(t + kAhead, L - 1)];
        const char* value = (const char*)values[t];
        for (int64_t b = 0; b < D * 4; b += 64) {
          _mm_prefetch(next + b, _MM_HINT_T0);
          _mm_prefetch(value + b, _MM_HINT_T1);
        }
      }
      __m256 part[kMaxG];
      for (int g = 0; g < gn; ++g) part[g] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 k = _mm256_loadu_ps(keys[t] + d);
        for (int g = 0; g < gn; ++g)
          part[g] = _mm256_fmadd_ps(_mm256_loadu_ps(qs + (g0 + g) * D + d), k, part[g]);
      }
      for (int g = 0; g < gn; ++g) {
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(part[g]), _mm256_extractf128_ps(part[g], 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_movehdup_ps(h));
        scores[(g0 + g) * L + t] = _mm_cvtss_f32(h);
      }
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    float* s = scores + g * L;
    const float top = *std::max_element(s, s + L);
    float total = 0.f;
    for (int64_t t = 0; t < L; ++t) total += (s[t] = std::exp(s[t] - top));
    for (int64_t t = 0; t < L; ++t) s[t] /= total;
  }
  for (int64_t g0 = 0; g0 < G; g0 += kMaxG) {
    const int64_t gn = std::min<int64_t>(kMaxG, G - g0);
    for (int64_t d = 0; d < D; d += 8) {
      __m256 a[kMaxG];
      for (int g = 0; g < gn; ++g) a[g] = _mm256_setzero_ps();
      for (int64_t t = 0; t < L; ++t) {
        const __m256 v = _mm256_loadu_ps(values[t] + d);
        for (int g = 0; g < gn; ++g)
          a[g] = _mm256_fmadd_ps(_mm256_set1_ps(scores[(g0 + g) * L + t]), v, a[g]);
      }
      for (int g = 0; g < gn; ++g) _mm256_storeu_ps(out + (g0 + g) * D + d, a[g]);
    }
  }
}
#endif

using AttendFn = void (*)(const float*, int64_t, int64_t, int64_t, const float* const*,
                          const float* const*, float*, float*, float*);

AttendFn pick_attend(int64_t D) {
#ifdef NINFER_X86
  __builtin_cpu_init();
  if (D % 8 == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return attend_avx2;
#endif
  return attend;
}

ffi::Error DecodeAttention(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k_cache,
                           ffi::Buffer<ffi::F32> v_cache, ffi::Buffer<ffi::S32> page_table,
                           ffi::Buffer<ffi::S32> lengths, ffi::ResultBuffer<ffi::F32> out,
                           float scale) {
  auto qd = q.dimensions(), cd = k_cache.dimensions(), td = page_table.dimensions();
  if (qd.size() != 3 || cd.size() != 4 || td.size() != 2)
    return ffi::Error::InvalidArgument("q [B, H, D], caches [P, K, S, D], table [B, W]");
  const int64_t B = qd[0], H = qd[1], D = qd[2];
  const int64_t P = cd[0], K = cd[1], S = cd[2], W = td[1];
  if (cd[3] != D || H % K || td[0] != B || lengths.dimensions()[0] != B)
    return ffi::Error::InvalidArgument("q, caches, table and lengths do not agree");
  const int64_t G = H / K;
  const float* qp = q.typed_data();
  const float* kp = k_cache.typed_data();
  const float* vp = v_cache.typed_data();
  const int32_t* table = page_table.typed_data();
  const int32_t* lens = lengths.typed_data();
  float* op = out->typed_data();
  std::vector<float> scores, qs(G * D), acc(G * D);
  std::vector<const float*> keys, values;
  const AttendFn attend_fn = pick_attend(D);
  for (int64_t b = 0; b < B; ++b) {
    // As the reference: at least the row's first key, at most what its table covers; page ids
    // clamped into the pool (jnp.take's clip).
    const int64_t L = std::min<int64_t>(std::max<int32_t>(lens[b], 1), W * S);
    scores.resize(G * L);
    keys.resize(L);
    values.resize(L);
    for (int64_t kh = 0; kh < K; ++kh) {
      for (int64_t t = 0; t < L; ++t) {
        const int64_t page =
            std::min<int64_t>(std::max<int32_t>(table[b * W + t / S], 0), P - 1);
        const int64_t at = ((page * K + kh) * S + t % S) * D;
        keys[t] = kp + at;
        values[t] = vp + at;
      }
      const float* qrow = qp + (b * H + kh * G) * D;
      for (int64_t i = 0; i < G * D; ++i) qs[i] = qrow[i] * scale;
      attend_fn(qs.data(), G, D, L, keys.data(), values.data(), scores.data(), acc.data(),
             op + (b * H + kh * G) * D);
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ninfer_paged_decode_attention, DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));
