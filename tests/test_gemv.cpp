// linear_rows (attn/gemv.h): the (in, out) layout has gemm()'s bits exactly, the (out, in) layout is
// within the float32 bound of a float64 product and the same for any thread count, on odd sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "attn/gemm.h"
#include "attn/gemv.h"
#include "attn/rng.h"
#include "attn/threads.h"

namespace attn {
namespace {

Tensor random(Shape shape, Rng& rng) {
  Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = float(rng.normal());
  return t;
}

TEST(LinearRows, InOutHasTheBitsOfGemm) {
  Rng rng(11);
  for (int64_t M : {1, 2, 4})
    for (int64_t K : {1, 7, 64, 129})
      for (int64_t N : {1, 15, 17, 513, 1031}) {
        Tensor x = random({M, K}, rng), w = random({K, N}, rng), b = random({N}, rng);
        Tensor want({M, N}), got({M, N});
        for (int64_t r = 0; r < M; ++r) std::memcpy(want.data() + r * N, b.data(), sizeof(float) * size_t(N));
        gemm(false, false, M, N, K, 1.0f, x.data(), K, w.data(), N, 1.0f, want.data(), N);  // bias + x·W
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          linear_rows(x.view(), w.view(), WeightLayout::in_out, b.view(), got.view());
          ASSERT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * size_t(M * N)), 0) << M << " " << K << " " << N;
        }
        set_num_threads(0);
      }
}

TEST(LinearRows, OutInIsADotProductWithinTheFloat32Bound) {
  Rng rng(12);
  for (int64_t M : {1, 3})
    for (int64_t K : {1, 15, 16, 17, 768, 1001})
      for (int64_t N : {1, 9, 300}) {
        Tensor x = random({M, K}, rng), w = random({N, K}, rng);
        Tensor got({M, N}), again({M, N});
        set_num_threads(1);
        linear_rows(x.view(), w.view(), WeightLayout::out_in, {}, got.view());
        set_num_threads(2);
        linear_rows(x.view(), w.view(), WeightLayout::out_in, {}, again.view());
        set_num_threads(0);
        ASSERT_EQ(std::memcmp(got.data(), again.data(), sizeof(float) * size_t(M * N)), 0);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double dot = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) {
              dot += double(x.data()[m * K + k]) * w.data()[n * K + k];
              mag += std::fabs(double(x.data()[m * K + k]) * w.data()[n * K + k]);
            }
            // a float32 sum of K products: |error| <= (K/16 + 4)·u·Σ|x·w| (16 lanes of K/16 terms, then a
            // tree of depth 4), u = 2^-24
            ASSERT_NEAR(got.data()[m * N + n], dot, (double(K) / 16 + 5) * 0x1p-24 * mag) << M << " " << K << " " << N;
          }
      }
  Tensor x({2, 5}), w({4, 6}), y({2, 4});
  EXPECT_THROW(linear_rows(x.view(), w.view(), WeightLayout::out_in, {}, y.view()), Error);
}

}  // namespace
}  // namespace attn
