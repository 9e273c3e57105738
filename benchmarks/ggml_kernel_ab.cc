// A/B of the CPU block kernel's row loops without JAX: an old version of ggml_matmul.cc against
// the working tree's, in one process, alternating, min of N calls each (quantization and the
// dots timed apart), plus whether any output differs in its bits.
//   git show OLD:ninfer_jax/kernels/quant_matmul/cpu/ggml_matmul.cc | \
//       sed '/^XLA_FFI_DEFINE_HANDLER_SYMBOL/,$d' > /tmp/old.cc
//   sed '/^XLA_FFI_DEFINE_HANDLER_SYMBOL/,$d' ninfer_jax/kernels/quant_matmul/cpu/ggml_matmul.cc \
//       > /tmp/new.cc
//   g++ -std=c++17 -O3 -w -I$(python -c "import jax.ffi; print(jax.ffi.include_dir())") \
//       -I/tmp benchmarks/ggml_kernel_ab.cc -o /tmp/ggml_ab
//   /tmp/ggml_ab K N M PATH [FMT [ITERS]]   # PATH 2 avx2, 3 avx512vnni; FMT 0 q8_0, 1 q4_0, 2 q4_1
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>
#include <immintrin.h>
#include "xla/ffi/api/ffi.h"
#include <chrono>
#include <cstdio>
#include <random>
namespace oldk {
#include "old.cc"  // from -I/tmp
}
namespace newk {
#include "new.cc"
}
template <class NS_Path, class QRowT, class QF>
double run(NS_Path p, QF quant, int fmt, const std::vector<uint8_t>& w, int K, int N, int M, const std::vector<float>& x, std::vector<float>& y, double* tq, int iters) {
  int nb = K / 32, bb = (int)(w.size() / ((size_t)N * nb));
  std::vector<int8_t> q(M * K); std::vector<float> d(M * nb), ds(M * nb); std::vector<QRowT> rows(M);
  double best = 1e9, bestq = 1e9;
  for (int it = 0; it < iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    for (int m = 0; m < M; ++m) {
      quant(fmt, x.data() + m * K, K, q.data() + m * K, d.data() + m * nb, ds.data() + m * nb);
      rows[m] = {q.data() + m * K, d.data() + m * nb, ds.data() + m * nb};
    }
    auto t1 = std::chrono::steady_clock::now();
    p.fn(fmt, w.data(), nb * bb, 0, N, nb, rows.data(), M, y.data(), N);
    auto t2 = std::chrono::steady_clock::now();
    bestq = std::min(bestq, std::chrono::duration<double>(t1 - t0).count());
    best = std::min(best, std::chrono::duration<double>(t2 - t1).count());
  }
  *tq = bestq * 1e6; return best * 1e6;
}
int main(int argc, char** argv) {
  int K = atoi(argv[1]), N = atoi(argv[2]), M = atoi(argv[3]), which = atoi(argv[4]);
  int fmt = argc > 5 ? atoi(argv[5]) : 2;
  int iters = argc > 6 ? atoi(argv[6]) : 1000;
  int nb = K / 32, bb = fmt == 0 ? 34 : fmt == 1 ? 18 : 20;
  std::mt19937 g(1);
  std::vector<uint8_t> w((size_t)N * nb * bb);
  for (auto& v : w) v = g();
  for (int n = 0; n < N; ++n) for (int b = 0; b < nb; ++b) {
    uint8_t* p = &w[(size_t)n * nb * bb + b * bb];
    uint16_t h = oldk::float_to_half(0.01f * (1 + (g() % 100) / 100.f)); memcpy(p, &h, 2);
    if (fmt == 2) { h = oldk::float_to_half(-0.05f); memcpy(p + 2, &h, 2); }
  }
  std::vector<float> x((size_t)M * K);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(g);
  std::vector<float> y1((size_t)M * N), y2((size_t)M * N);
  auto po = oldk::path_named(which); auto pn = newk::path_named(which);
  double qo, qn, to = 1e9, tn = 1e9, a, qa, qb;
  qo = qn = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    a = run<decltype(po), oldk::QRow>(po, oldk::quantize_row, fmt, w, K, N, M, x, y1, &qa, iters); to = std::min(to, a); qo = std::min(qo, qa);
    a = run<decltype(pn), newk::QRow>(pn, pn.quantize, fmt, w, K, N, M, x, y2, &qb, iters); tn = std::min(tn, a); qn = std::min(qn, qb);
  }
  int diff = 0; for (size_t i = 0; i < y1.size(); ++i) diff += memcmp(&y1[i], &y2[i], 4) != 0;
  printf("%-10s K=%4d N=%5d M=%2d fmt=%d  quant old %6.2f new %6.2f us | dots old %8.2f new %8.2f us (%.2f / %.2f ns per block dot) | %d outputs differ in bits\n",
         pn.name, K, N, M, fmt, qo, qn, to, tn, to * 1e3 / ((double)N * nb * M), tn * 1e3 / ((double)N * nb * M), diff);
}
