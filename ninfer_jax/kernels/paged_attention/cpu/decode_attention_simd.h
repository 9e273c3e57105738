// The SIMD body of decode_attention.cc, written once over a vector traits class and included
// once per x86 ISA: before each include the .cc defines NINFER_TARGET (that ISA's target
// attribute, on every function here so the intrinsics inline) and names the traits `Simd`
// inside the namespace it opens. The traits give: V (a vector of kLanes floats), load() of
// f32 / bf16 / f16 rows widened to f32, the arithmetic used below, sum4() (four vectors'
// horizontal sums as one __m128), reduce_max() and exp().
//
// Per (row, kv head) and group of GN <= 4 query heads: the scores of four keys at a time (one
// transposing reduction for four dots instead of four), an exact two-pass softmax whose exp
// pass also sums, and the probability-weighted values with the GN x (kValueVectors vectors of
// D) accumulators in registers, divided by the total at the end as the reference does.

// Scores of heads g0..g0+GN-1 for keys 0..Lp-1 (rows past L repeat the last, see Head).
template <typename T, int GN>
NINFER_TARGET void group_scores(const Head<T>& h, int64_t g0) {
  using V = typename Simd::V;
  constexpr int64_t kAhead = 8;  // rows come from pages all over the pool, mostly from DRAM
  const int64_t D = h.D, bytes = D * int64_t(sizeof(T));
  for (int64_t t = 0; t < h.Lp; t += 4) {
    if (g0 == 0) {
      for (int64_t i = 0; i < 4; ++i) {
        const char* next = (const char*)h.keys[std::min(t + i + kAhead, h.Lp - 1)];
        const char* value = (const char*)h.values[t + i];
        for (int64_t b = 0; b < bytes; b += 64) {
          _mm_prefetch(next + b, _MM_HINT_T0);
          _mm_prefetch(value + b, _MM_HINT_T1);
        }
      }
    }
    V part[GN][4];
    for (int g = 0; g < GN; ++g)
      for (int i = 0; i < 4; ++i) part[g][i] = Simd::zero();
    for (int64_t d = 0; d < D; d += Simd::kLanes) {
      for (int i = 0; i < 4; ++i) {
        const V k = Simd::load(h.keys[t + i] + d);
        for (int g = 0; g < GN; ++g)
          part[g][i] = Simd::fma(Simd::load(h.q + (g0 + g) * D + d), k, part[g][i]);
      }
    }
    for (int g = 0; g < GN; ++g)
      _mm_storeu_ps(h.scores + (g0 + g) * h.Lp + t,
                    Simd::sum4(part[g][0], part[g][1], part[g][2], part[g][3]));
  }
}

// scores[g] <- exp(scores[g] - max) over 0..L-1 (0 past L); returns the sum.
NINFER_TARGET inline float exp_and_sum(float* s, int64_t L, int64_t Lp) {
  using V = typename Simd::V;
  const V lowest = Simd::set1(-INFINITY);
  for (int64_t t = L; t < Lp; ++t) s[t] = -INFINITY;
  V top = lowest;
  for (int64_t t = 0; t < Lp; t += Simd::kLanes) top = Simd::max(top, Simd::load(s + t));
  const V shift = Simd::set1(Simd::reduce_max(top));
  V total = Simd::zero();
  for (int64_t t = 0; t < Lp; t += Simd::kLanes) {
    const V e = Simd::exp(Simd::sub(Simd::load(s + t), shift));
    Simd::storeu(s + t, e);
    total = Simd::add(total, e);
  }
  return Simd::reduce_add(total);
}

// out[g0.., d0..d0 + NV * kLanes) = sum_t p[g, t] * v[t] / total[g].
template <typename T, int GN, int NV>
NINFER_TARGET void group_values(const Head<T>& h, int64_t g0, int64_t d0, const float* total) {
  using V = typename Simd::V;
  V acc[GN][NV];
  for (int g = 0; g < GN; ++g)
    for (int j = 0; j < NV; ++j) acc[g][j] = Simd::zero();
  for (int64_t t = 0; t < h.L; ++t) {
    V v[NV];
    for (int j = 0; j < NV; ++j) v[j] = Simd::load(h.values[t] + d0 + j * Simd::kLanes);
    for (int g = 0; g < GN; ++g) {
      const V p = Simd::set1(h.scores[(g0 + g) * h.Lp + t]);
      for (int j = 0; j < NV; ++j) acc[g][j] = Simd::fma(p, v[j], acc[g][j]);
    }
  }
  for (int g = 0; g < GN; ++g) {
    const V divisor = Simd::set1(total[g0 + g]);
    for (int j = 0; j < NV; ++j)
      Simd::storeu(h.out + (g0 + g) * h.D + d0 + j * Simd::kLanes,
                   Simd::div(acc[g][j], divisor));
  }
}

template <typename T, int GN>
NINFER_TARGET void group(const Head<T>& h, int64_t g0) {
  float* total = h.total;
  group_scores<T, GN>(h, g0);
  for (int64_t g = g0; g < g0 + GN; ++g)
    total[g] = exp_and_sum(h.scores + g * h.Lp, h.L, h.Lp);
  constexpr int NV = Simd::kValueVectors;
  int64_t d = 0;
  for (; d + NV * Simd::kLanes <= h.D; d += NV * Simd::kLanes)
    group_values<T, GN, NV>(h, g0, d, total);
  for (; d < h.D; d += Simd::kLanes) group_values<T, GN, 1>(h, g0, d, total);
}

// Needs D % kLanes == 0 and Lp % max(kLanes, 4) == 0 (Head's padding).
template <typename T>
NINFER_TARGET void attend(const Head<T>& h) {
  for (int64_t g0 = 0; g0 < h.G; g0 += 4) {
    switch (std::min<int64_t>(4, h.G - g0)) {
      case 1: group<T, 1>(h, g0); break;
      case 2: group<T, 2>(h, g0); break;
      case 3: group<T, 3>(h, g0); break;
      default: group<T, 4>(h, g0); break;
    }
  }
}
