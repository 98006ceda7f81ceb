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
