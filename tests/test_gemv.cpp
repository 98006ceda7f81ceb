// linear_rows (attn/gemv.h): the (in, out) layout has gemm()'s bits exactly, the (out, in) layout is
// within the float32 bound of a float64 product and the same for any thread count, on odd sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "attn/gemm.h"
#include "attn/gemv.h"
#include "attn/kernels/half_kv.h"
#include "attn/nn.h"
#include "attn/precision.h"
#include "attn/rng.h"
#include "attn/threads.h"
#include "test_util.h"

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
          ASSERT_TRUE(test::same_bits(got, want)) << M << " " << K << " " << N;
        }
        set_num_threads(0);
      }
}

// linear() starts each element's chain from its bias (the GEMM writes the bias into each block as it computes it):
// the bits of gemm() from C filled with the bias, beta 1; and of gemm_bf16() so under a bf16 Autocast and over bf16
// weights. Many rows (A packed), few under Wᵀ (computed as Cᵀ), W (in, out), K of several K blocks and 0, a partial
// last block of columns, 1 and 2 threads.
TEST(Linear, BiasIsTheStartOfEachChain) {
  Rng rng(19);
  for (const auto& [n, in, out, io] : {std::tuple{200, 70, 131, false}, std::tuple{8, 700, 300, false},
                                       std::tuple{130, 1100, 65, true}, std::tuple{30, 0, 17, false}})
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      const Shape ws = io ? Shape{in, out} : Shape{out, in};
      const WeightLayout layout = io ? WeightLayout::in_out : WeightLayout::out_in;
      const int64_t ldw = io ? out : in;
      Tensor x = random({n, in}, rng), w = random(ws, rng), b = random({out}, rng);
      std::vector<uint16_t> w16(size_t(w.numel()));
      to_half(KvDtype::bf16, w.data(), w.numel(), w16.data());
      const auto from_bias = [&] {
        Tensor c({n, out});
        for (int64_t r = 0; r < n; ++r) std::memcpy(c.data() + r * out, b.data(), sizeof(float) * size_t(out));
        return c;
      };
      const std::string where = std::to_string(n) + "x" + std::to_string(out) + "x" + std::to_string(in) + ", " +
                                std::to_string(threads) + " thread(s)";
      Tensor want = from_bias(), got({n, out});
      gemm(false, !io, n, out, in, 1.0f, x.data(), in, w.data(), ldw, 1.0f, want.data(), out);
      linear<float>(x.view(), w.view(), b.view(), got.view(), layout);
      EXPECT_TRUE(test::same_bits(got, want)) << where;
      want = from_bias();
      gemm_bf16(false, !io, n, out, in, x.data(), in, w16.data(), ldw, 1.0f, want.data(), out);
      linear(x.view(), View<const uint16_t>(w16.data(), ws), b.view(), got.view(), layout);
      EXPECT_TRUE(test::same_bits(got, want)) << where << ", bf16 weights";
      want = from_bias();
      gemm_bf16(false, !io, n, out, in, x.data(), in, w.data(), ldw, 1.0f, want.data(), out);
      const Autocast scope(Precision::bf16);
      linear<float>(x.view(), w.view(), b.view(), got.view(), layout);
      EXPECT_TRUE(test::same_bits(got, want)) << where << ", bf16 Autocast";
    }
  set_num_threads(0);
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
        ASSERT_TRUE(test::same_bits(got, again));
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

// A weight of bf16 bits reads as the fp32 weight it widens to, bit for bit, in both layouts (vector body,
// lane tails, K tails); and a Linear with use_bf16_weights() takes it under a bf16 Autocast only: few rows
// through linear_rows, many through gemm_bf16 with the bits of rounding the fp32 weight in the product.
TEST(LinearRows, Bf16WeightsReadAsTheirWidenedFp32) {
  Rng rng(13);
  for (const WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in})
    for (int64_t M : {1, 3})
      for (int64_t K : {1, 17, 100})
        for (int64_t N : {1, 15, 33}) {
          const bool io = layout == WeightLayout::in_out;
          Tensor x = random({M, K}, rng), w = random(io ? Shape{K, N} : Shape{N, K}, rng), b = random({N}, rng);
          std::vector<uint16_t> w16(size_t(w.numel()));
          to_half(KvDtype::bf16, w.data(), w.numel(), w16.data());
          Tensor wide(w.shape());
          from_half(KvDtype::bf16, w16.data(), w.numel(), wide.data());
          Tensor want({M, N}), got({M, N});
          linear_rows(x.view(), wide.view(), layout, b.view(), want.view());
          linear_rows(x.view(), View<const uint16_t>(w16.data(), w.shape()), layout, b.view(), got.view());
          ASSERT_TRUE(test::same_bits(got, want)) << (io ? "in_out " : "out_in ") << M << " " << K << " " << N;
        }
  const int64_t in = 40, out = 24;
  Tensor w = random({out, in}, rng), b = random({out}, rng);
  Linear plain(Tensor::copy_of(w.view()), Tensor::copy_of(b.view())),
      bf16(Tensor::copy_of(w.view()), Tensor::copy_of(b.view()));
  bf16.use_bf16_weights();
  std::vector<uint16_t> w16(size_t(w.numel()));
  to_half(KvDtype::bf16, w.data(), w.numel(), w16.data());
  Tensor wide(w.shape());
  from_half(KvDtype::bf16, w16.data(), w.numel(), wide.data());
  for (const int64_t n : {kGemvRows, kGemvRows + 5}) {
    Tensor x = random({n, in}, rng);
    EXPECT_TRUE(test::same_bits(bf16.forward(x.view()), plain.forward(x.view())))
        << n << " rows: fp32 outside an Autocast";
    const Autocast scope(Precision::bf16);
    Tensor want({n, out});
    if (n <= kGemvRows) linear_rows(x.view(), wide.view(), WeightLayout::out_in, b.view(), want.view());
    else want = plain.forward(x.view());  // rounds the fp32 weight as it packs it
    EXPECT_TRUE(test::same_bits(bf16.forward(x.view()), want)) << n << " rows under Autocast(bf16)";
  }
}

// A Linear whose weight is packed once (an encoder's): the bits of the one that packs per call, for few rows
// (linear_rows, unchanged), the few-row one-pass product, many rows, either thread count, and under a bf16
// Autocast (which multiplies in bf16 and leaves the panels alone); a packed Linear given bf16 weights (a bf16
// encoder's: packed, then use_bf16_weights) packs those, the bits of the bf16 Linear that packs per call; panels
// of another matrix are refused.
TEST(LinearRows, PackedWeightKeepsTheBits) {
  Rng rng(17);
  const int64_t in = 700, out = 300;  // K 700: several K blocks at every L1d
  Tensor w = random({out, in}, rng), b = random({out}, rng);
  const auto linear_of_w = [&] { return Linear(Tensor::copy_of(w.view()), Tensor::copy_of(b.view())); };
  Linear plain = linear_of_w(), packed = linear_of_w(), plain16 = linear_of_w(), packed16 = linear_of_w();
  packed.pack_weight();
  packed16.pack_weight();
  packed16.use_bf16_weights();
  plain16.use_bf16_weights();
  for (const int64_t n : {int64_t(1), kGemvRows, kGemvRows + 1, int64_t(8), int64_t(48), int64_t(49), int64_t(200)})
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Tensor x = random({n, in}, rng);
      EXPECT_TRUE(test::same_bits(packed.forward(x.view()), plain.forward(x.view()))) << n << " rows, " << threads;
      const Autocast scope(Precision::bf16);
      EXPECT_TRUE(test::same_bits(packed.forward(x.view()), plain.forward(x.view()))) << n << " rows, bf16";
      EXPECT_TRUE(test::same_bits(packed16.forward(x.view()), plain16.forward(x.view())))
          << n << " rows, bf16 weights, " << threads;
    }
  set_num_threads(0);
  const Tensor w2 = Tensor::copy_of(w.view());
  const PackedB other = pack_b(true, in, out, w2.data(), in);  // the same values, another matrix
  Tensor x = random({8, in}, rng), y({8, out});
  EXPECT_THROW(linear(x.view(), w.view(), other, View<const float>{}, y.view()), Error);
  std::vector<uint16_t> w16(size_t(w.numel()));
  to_half(KvDtype::bf16, w.data(), w.numel(), w16.data());
  const std::vector<uint16_t> w16b = w16;
  const PackedB16 other16 = pack_b_bf16(true, in, out, w16b.data(), in);  // the same values, another matrix
  EXPECT_THROW(linear(x.view(), View<const uint16_t>(w16.data(), {out, in}), other16, View<const float>{}, y.view()),
               Error);
  Linear conv1d(random({in, out}, rng), Tensor(), WeightLayout::in_out);
  EXPECT_THROW(conv1d.pack_weight(), Error);
}

}  // namespace
}  // namespace attn
