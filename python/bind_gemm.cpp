// Python binding of attn's GEMM: gemm(a, b, c, ...) writes c = alpha·op(a)·op(b) + beta·c in place, on
// numpy float32/float64 arrays read through their strides (rows may be strided, columns must be unit
// stride); gemm_bf16(a, b, c, ...) the bf16 product (a, b: float32, or uint16/int16 holding bf16 bits,
// as torch's bfloat16 tensors viewed as int16; c float32, or bf16 bits); gemm_kernel() names what runs. For
// benchmarks against torch.mm and for tests; not an autograd op and no broadcasting.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "attn/gemm.h"
#include "numpy_view.h"

namespace py = pybind11;
using namespace attn;

namespace {

// op(A) (M, K) and op(B) (K, N) against C (M, N): the sizes, or an Error naming the three shapes.
void check_shapes(const Shape& a, const Shape& b, const Shape& c, bool ta, bool tb, int64_t* M, int64_t* N,
                  int64_t* K) {
  ATTN_CHECK(a.size() == 2 && b.size() == 2 && c.size() == 2, "Expected 2-D a, b and c, but got ", to_string(a), ", ",
             to_string(b), " and ", to_string(c), " instead");
  *M = ta ? a[1] : a[0], *K = ta ? a[0] : a[1], *N = tb ? b[0] : b[1];
  ATTN_CHECK((tb ? b[1] : b[0]) == *K && c[0] == *M && c[1] == *N,
             "Expected op(a) (M, K), op(b) (K, N) and c (M, N), but got a ", to_string(a), ", b ", to_string(b),
             " and c ", to_string(c), " instead");
}

template <typename T>
void gemm_arrays(py::array a, py::array b, py::array c, bool ta, bool tb, double alpha,
                 double beta) {
  View<const T> A = py_util::view_of<const T>(a, "a"), B = py_util::view_of<const T>(b, "b");
  View<T> C = py_util::view_of<T>(c, "c");
  int64_t M, N, K;
  check_shapes(A.shape, B.shape, C.shape, ta, tb, &M, &N, &K);
  ATTN_CHECK(A.stride(1) == 1 && B.stride(1) == 1 && C.stride(1) == 1,
             "Expected unit column strides for gemm, but got strides ", to_string(A.strides), ", ",
             to_string(B.strides), " and ", to_string(C.strides), " instead");
  py::gil_scoped_release nogil;
  gemm(ta, tb, M, N, K, static_cast<T>(alpha), A.data, A.stride(0), B.data, B.stride(0), static_cast<T>(beta), C.data,
       C.stride(0));
}

// A bf16 operand: float32 (rounded as it is packed) or 16-bit integers holding bf16 bits. `x` is the
// caller's array, replaced by what the view reads (view_of may make an aligned copy).
struct Bf16Operand {
  View<const float> f;
  View<const uint16_t> h;
  bool half = false;
  Shape shape() const { return half ? h.shape : f.shape; }
  int64_t ld() const { return half ? h.stride(0) : f.stride(0); }
  bool unit_cols() const { return half ? h.stride(1) == 1 : f.stride(1) == 1; }
};
Bf16Operand bf16_operand(py::array& x, const char* name) {
  Bf16Operand o;
  o.half = x.dtype().is(py::dtype::of<uint16_t>()) || x.dtype().is(py::dtype::of<int16_t>());
  if (o.half) {
    x = x.attr("view")("uint16").cast<py::array>();
    o.h = py_util::view_of<const uint16_t>(x, name);
  } else {
    o.f = py_util::view_of<const float>(x, name);
  }
  return o;
}

void gemm_bf16_arrays(py::array a, py::array b, py::array c, bool ta, bool tb, double beta) {
  const Bf16Operand A = bf16_operand(a, "a"), B = bf16_operand(b, "b");
  const bool c16 = c.dtype().is(py::dtype::of<uint16_t>()) || c.dtype().is(py::dtype::of<int16_t>());
  if (c16) c = c.attr("view")("uint16").cast<py::array>();
  View<float> C = c16 ? View<float>{} : py_util::view_of<float>(c, "c");
  View<uint16_t> C16 = c16 ? py_util::view_of<uint16_t>(c, "c") : View<uint16_t>{};
  const Shape& cs = c16 ? C16.shape : C.shape;
  int64_t M, N, K;
  check_shapes(A.shape(), B.shape(), cs, ta, tb, &M, &N, &K);
  ATTN_CHECK(A.unit_cols() && B.unit_cols() && (c16 ? C16.stride(1) : C.stride(1)) == 1,
             "Expected unit column strides for gemm_bf16, but got a, b and c of shapes ", to_string(A.shape()), ", ",
             to_string(B.shape()), " and ", to_string(cs), " with a strided column instead");
  ATTN_CHECK(!A.half || B.half,
             "Expected a and b both float32, both bf16 bits, or a float32 and b bf16, but got a bf16 and b float32 "
             "instead");
  ATTN_CHECK(!c16 || A.half, "Expected bf16 bits for a and b with a bf16 c, but got a float32 a instead");
  py::gil_scoped_release nogil;
  const float bt = static_cast<float>(beta);
  if (c16) return gemm_bf16(ta, tb, M, N, K, A.h.data, A.ld(), B.h.data, B.ld(), bt, C16.data, C16.stride(0));
  if (A.half) gemm_bf16(ta, tb, M, N, K, A.h.data, A.ld(), B.h.data, B.ld(), bt, C.data, C.stride(0));
  else if (B.half) gemm_bf16(ta, tb, M, N, K, A.f.data, A.ld(), B.h.data, B.ld(), bt, C.data, C.stride(0));
  else gemm_bf16(ta, tb, M, N, K, A.f.data, A.ld(), B.f.data, B.ld(), bt, C.data, C.stride(0));
}

}  // namespace

void bind_gemm(py::module_& m) {
  m.def(
      "gemm",
      [](const py::array& a, const py::array& b, const py::array& c, bool trans_a, bool trans_b, double alpha,
         double beta) {
        if (c.dtype().is(py::dtype::of<double>())) gemm_arrays<double>(a, b, c, trans_a, trans_b, alpha, beta);
        else gemm_arrays<float>(a, b, c, trans_a, trans_b, alpha, beta);
      },
      py::arg("a"), py::arg("b"), py::arg("c"), py::arg("trans_a") = false, py::arg("trans_b") = false,
      py::arg("alpha") = 1.0, py::arg("beta") = 0.0,
      "c = alpha * op(a) @ op(b) + beta * c, in place (float32 or float64, c's dtype decides).");
  m.def("gemm_bf16", &gemm_bf16_arrays, py::arg("a"), py::arg("b"), py::arg("c"), py::arg("trans_a") = false,
        py::arg("trans_b") = false, py::arg("beta") = 0.0,
        "c = op(a) @ op(b) + beta * c in place, bf16 products with fp32 sums (AMX's arithmetic, in groups of 32 k; "
        "the same bits on every CPU); a, b float32 or bf16 bits as uint16/int16; c float32, or bf16 bits "
        "(uint16/int16, with bf16 a and b): the fp32 result rounded once.");
  m.def("gemm_kernel", &gemm_kernel, "Which GEMM kernel runs: backend, SIMD target, register block.");
}
