// Python binding of attn's GEMM: gemm(a, b, c, ...) writes c = alpha·op(a)·op(b) + beta·c in place, on
// numpy float32/float64 arrays read through their strides (rows may be strided, columns must be unit
// stride); gemm_kernel() names what runs. For benchmarks against torch.mm and for tests; not an
// autograd op and no broadcasting.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "attn/gemm.h"
#include "numpy_view.h"

namespace py = pybind11;
using namespace attn;

namespace {

template <typename T>
void gemm_arrays(py::array a, py::array b, py::array c, bool ta, bool tb, double alpha,
                 double beta) {
  View<const T> A = py_util::view_of<const T>(a, "a"), B = py_util::view_of<const T>(b, "b");
  View<T> C = py_util::view_of<T>(c, "c");
  ATTN_CHECK(A.rank() == 2 && B.rank() == 2 && C.rank() == 2, "Expected 2-D a, b and c, but got ",
             to_string(A.shape), ", ", to_string(B.shape), " and ", to_string(C.shape), " instead");
  const int64_t M = ta ? A.size(1) : A.size(0), K = ta ? A.size(0) : A.size(1);
  const int64_t N = tb ? B.size(0) : B.size(1), Kb = tb ? B.size(1) : B.size(0);
  ATTN_CHECK(Kb == K && C.size(0) == M && C.size(1) == N, "Expected op(a) (M, K), op(b) (K, N) and c (M, N), but got a ",
             to_string(A.shape), ", b ", to_string(B.shape), " and c ", to_string(C.shape), " instead");
  ATTN_CHECK(A.stride(1) == 1 && B.stride(1) == 1 && C.stride(1) == 1,
             "Expected unit column strides for gemm, but got strides ", to_string(A.strides), ", ",
             to_string(B.strides), " and ", to_string(C.strides), " instead");
  py::gil_scoped_release nogil;
  gemm(ta, tb, M, N, K, static_cast<T>(alpha), A.data, A.stride(0), B.data, B.stride(0), static_cast<T>(beta), C.data,
       C.stride(0));
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
  m.def("gemm_kernel", &gemm_kernel, "Which GEMM kernel runs: backend, SIMD target, register block.");
}
