// The `_attn` extension module; python/attn/ is the package users import.
#include <pybind11/pybind11.h>

#include "attn/check.h"
#include "attn/info.h"
#include "attn/simd.h"
#include "attn/threads.h"
#include "attn/version.h"

namespace py = pybind11;

void bind_sdpa(py::module_& m);
void bind_sdpa_backward(py::module_& m);
void bind_io(py::module_& m);
void bind_mha(py::module_& m);
void bind_viz(py::module_& m);
void bind_nn(py::module_& m);
void bind_gpt(py::module_& m);
void bind_gemm(py::module_& m);
void bind_dist(py::module_& m);
void bind_models(py::module_& m);

PYBIND11_MODULE(_attn, m) {
  m.doc() = "attn: multi-head attention in C++ (native core)";
  m.attr("__version__") = ATTN_VERSION;
  // attn's errors are ValueError (bad arguments) and RuntimeError too: torch raises RuntimeError for the
  // same misuse (q and k of different dtypes, wrong ranks), and code written against it catches that.
  py::register_exception<attn::Error>(m, "AttnError",
                                      py::make_tuple(py::handle(PyExc_ValueError), py::handle(PyExc_RuntimeError)));
  m.def("set_num_threads", &attn::set_num_threads, py::arg("n"), "Threads of attn's pool (every kernel and layer).");
  m.def("get_num_threads", &attn::num_threads);
  m.def(
      "info",
      [](bool strict) {
        const attn::RuntimeInfo i = attn::runtime_info();
        if (strict) attn::check_no_simd_fallback();
        py::dict d;
        d["cpu"] = i.cpu, d["features"] = i.features, d["l1d"] = i.l1d, d["l2"] = i.l2, d["l3"] = i.l3;
        d["caches_read"] = i.caches_read, d["caches_forced"] = i.caches_forced, d["bits"] = i.bits;
        d["simd_target"] = i.simd_target, d["simd_compiled"] = i.simd_compiled;
        d["simd_fallback"] = i.simd_fallback, d["gemm"] = i.gemm, d["gemm_bf16"] = i.gemm_bf16, d["tuning"] = i.tuning,
        d["threads"] = i.threads;
        d["max_threads"] = i.max_threads, d["wait_policy"] = i.wait_policy, d["text"] = attn::to_string(i);
        return d;
      },
      py::kw_only(), py::arg("strict") = false,
      "What attn runs here: CPU, SIMD target, GEMM kernel, threads ('text' is the header benchmarks print). "
      "strict=True raises AttnError if the kernels run a fallback.");
  bind_sdpa(m);
  bind_sdpa_backward(m);
  bind_io(m);
  bind_mha(m);
  bind_viz(m);
  bind_nn(m);
  bind_gpt(m);
  bind_gemm(m);
  bind_dist(m);  // after bind_gpt: adds to Trainer
  bind_models(m);
}
