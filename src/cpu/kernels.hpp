// Small dense-math kernels of the CPU backend, templated on the precision
// (float or double). Plain loops written so that GCC/Clang vectorise them at
// -O2/-O3 without reassociation flags: fixed-width partial sums and column tiles
// that stay in registers. Every length they see is a multiple of 16 (512, 576,
// 256, 128, 64) except the reduction length of matmul, which is arbitrary.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>

namespace dsmla::cpu {

// sum_i a[i] * b[i], n a multiple of 8. Eight independent partial sums give the
// compiler vector lanes without changing the result between runs.
template <class Real>
Real dot(const Real* a, const Real* b, int n) {
  constexpr int kLanes = 8;
  Real acc[kLanes] = {};
  for (int i = 0; i < n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += a[i + k] * b[i + k];
  Real sum = 0;
  for (int k = 0; k < kLanes; ++k) sum += acc[k];
  return sum;
}

// c[i][0:n] = sum_k a[i][k] * B_k[0:n] for i in [0, m); n a multiple of 16.
// Row k of B is b_row(k), a contiguous run of at least n values, so a plain
// matrix (b + k * ldb) and rows gathered from a key table use the same kernel.
// A 16-wide tile of c's row stays in registers over the whole k loop, and the
// k x 16 tile of B is reused from L1/L2 by every row of a.
template <class Real, class BRow>
void matmul(int m, int n, int k, const Real* a, std::size_t lda, BRow b_row, Real* c, std::size_t ldc) {
  constexpr int kCols = 16;
  for (int j0 = 0; j0 < n; j0 += kCols) {
    for (int i = 0; i < m; ++i) {
      Real acc[kCols] = {};
      const Real* a_row = a + i * lda;
      for (int kk = 0; kk < k; ++kk) {
        const Real x = a_row[kk];
        const Real* b = b_row(kk) + j0;
        for (int j = 0; j < kCols; ++j) acc[j] += x * b[j];
      }
      std::copy(acc, acc + kCols, c + i * ldc + j0);
    }
  }
}

// The same with B a row-major matrix of leading dimension ldb.
template <class Real>
void matmul(int m, int n, int k, const Real* a, std::size_t lda, const Real* b, std::size_t ldb, Real* c,
            std::size_t ldc) {
  matmul(m, n, k, a, lda, [b, ldb](int kk) { return b + kk * ldb; }, c, ldc);
}

// Turns n >= 1 scores into softmax probabilities in place; returns their
// log-sum-exp (natural log).
template <class Real>
Real softmax_in_place(Real* s, int n) {
  const Real m = *std::max_element(s, s + n);
  Real sum = 0;
  for (int i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    sum += s[i];
  }
  const Real inv = Real(1) / sum;
  for (int i = 0; i < n; ++i) s[i] *= inv;
  return m + std::log(sum);
}

}  // namespace dsmla::cpu
