// Tensor and View: shapes print like PyTorch, views are strided without copies, access is checked.
#include <gtest/gtest.h>

#include "attn/tensor.h"

using namespace attn;

TEST(Tensor, ShapePrintsLikePyTorch) {
  EXPECT_EQ(to_string(Shape{2, 8, 10, 64}), "(2, 8, 10, 64)");
  EXPECT_EQ(to_string(Shape{5}), "(5,)");
  EXPECT_EQ(to_string(Shape{}), "()");
}

TEST(Tensor, AlignedAndZeroed) {
  Tensor t({3, 5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data()[i], 0.f);
}

// A big tensor's block, freed, is the next block of its size class (an eighth of its power of two): the next
// batch's slightly smaller tensor touches no fresh pages. Zero-filled again all the same. (Under AddressSanitizer
// every block is freed, so only the values are checked there.)
TEST(Tensor, BigBlocksAreKeptForTheNextTensorOfTheirSize) {
  const int64_t n = int64_t(1) << 19;  // 2 MiB
  const float* first;
  {
    Tensor a = Tensor::uninitialized({n});
    for (int64_t i = 0; i < n; ++i) a.data()[i] = 7.0f;
    first = a.data();
  }
  Tensor b({n - 1000});  // 4000 bytes fewer: the same class
#if !defined(__SANITIZE_ADDRESS__)
  EXPECT_EQ(b.data(), first);
#endif
  int64_t nonzero = 0;
  for (int64_t i = 0; i < b.numel(); ++i) nonzero += b.data()[i] != 0.0f;
  EXPECT_EQ(nonzero, 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
}

TEST(Tensor, HeadSplitIsAViewOfTheSameBytes) {
  Tensor x({2, 10, 512});  // (B, L, E)
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = float(i);
  View<float> heads = x.view().reshape({2, 10, 8, 64}).transpose(1, 2);  // (B, H, L, D)
  EXPECT_EQ(heads.shape, (Shape{2, 8, 10, 64}));
  EXPECT_FALSE(heads.is_contiguous());
  EXPECT_EQ(heads.data, x.data());
  EXPECT_EQ(heads.at({1, 3, 7, 5}), x.view().at({1, 7, 3 * 64 + 5}));
  Tensor c = Tensor::copy_of(heads);
  EXPECT_EQ(c.view().at({1, 3, 7, 5}), heads.at({1, 3, 7, 5}));
  EXPECT_TRUE(c.view().is_contiguous());
}

TEST(Tensor, CheckedAccessNamesTheShape) {
  Tensor t({2, 3});
  try {
    t.view().at({2, 0});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(2, 3)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.view().at({0}), Error);
  EXPECT_THROW(t.view().transpose(0, 1).reshape({6}), Error);  // not contiguous
  EXPECT_THROW(t.view().reshape({4, 2}), Error);
  EXPECT_EQ(t.view().reshape({-1}).shape, (Shape{6}));
}

// Sizes never wrap: a shape whose element or byte count overflows, or that needs more than the
// machine's memory, is an Error before anything is allocated (it used to allocate a wrapped, small
// buffer and write past it).
TEST(Tensor, CheckedSizes) {
  EXPECT_EQ(numel({0, int64_t(1) << 62, 1}), 0);  // empty, and the other sizes still fit
  auto msg = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg([] { numel({int64_t(1) << 62, 4}); }).find("element count fits in 64 bits"), std::string::npos);
  EXPECT_NE(msg([] { numel({0, int64_t(1) << 62, 4}); }).find("element count fits in 64 bits"), std::string::npos);
  EXPECT_NE(msg([] { numel({2, -1}); }).find("non-negative sizes"), std::string::npos);
  EXPECT_NE(msg([] { Tensor t({int64_t(1) << 62}); }).find("byte count fits in 64 bits"), std::string::npos);
  const std::string big = msg([] { Tensor t({int64_t(1) << 40, 1024}); });  // 4 PiB
  EXPECT_NE(big.find("Expected a tensor of shape (1099511627776, 1024) to fit in the machine's"), std::string::npos)
      << big;
  EXPECT_NE(msg([] { checked_mul(int64_t(1) << 40, int64_t(1) << 40, "batch * block"); }).find("batch * block"),
            std::string::npos);
  EXPECT_EQ(checked_mul(3, 4, "x"), 12);
}

// narrow() keeps rank and strides; copy() walks any strides on both sides and checks the shapes.
TEST(Tensor, NarrowAndStridedCopy) {
  Tensor a({2, 5, 3});
  for (int64_t i = 0; i < a.numel(); ++i) a.data()[i] = float(i);
  View<float> mid = a.view().narrow(1, 1, 3);  // (2, 3, 3)
  EXPECT_EQ(mid.shape, Shape({2, 3, 3}));
  EXPECT_EQ(mid.strides, a.view().strides);
  EXPECT_EQ(mid.at({1, 2, 0}), a.view().at({1, 3, 0}));
  Tensor t({3, 3, 2});  // mid transposed into a contiguous buffer's (2, 3, 3) view
  copy(View<const float>(mid), t.view().transpose(0, 2));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(t.view().at({k, j, i}), mid.at({i, j, k}));
  EXPECT_THROW(a.view().narrow(1, 3, 3), Error);
  EXPECT_THROW(copy(View<const float>(mid), t.view()), Error);
}
