// Python bindings made from a struct's field list (include/attn/fields.h): a constructor with one
// keyword argument per field, in the list's order, each defaulted from the struct's own defaults, and the
// struct as a dict. So an options struct's defaults are written once, in its header; the Python wrappers
// read them from the module (TRANSFORMER_DEFAULTS, MHA_DEFAULTS). Not a reflection library: only
// construction and the dict.
#pragma once
#include <pybind11/pybind11.h>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "attn/fields.h"

namespace attn::py_util {
namespace py = pybind11;

// A struct as a dict of its fields.
template <class S, class Fields>
py::dict fields_dict(const S& s, const Fields& fields) {
  py::dict d;
  for_each_field(fields, s, [&](const char* name, const auto& v) { d[name] = v; });
  return d;
}

// kFields: a field list (a tuple of Field<S, T>) of static storage. The first kRequired fields are
// required arguments, the others default to S{}'s values.
template <const auto& kFields, size_t kRequired = 0,
          class Indices = std::make_index_sequence<std::tuple_size_v<std::remove_cvref_t<decltype(kFields)>>>>
struct FieldsInit;

template <const auto& kFields, size_t kRequired, size_t... I>
struct FieldsInit<kFields, kRequired, std::index_sequence<I...>> {
  using Fields = std::remove_cvref_t<decltype(kFields)>;
  using S = typename std::tuple_element_t<0, Fields>::Struct;
  template <size_t i>
  using T = typename std::tuple_element_t<i, Fields>::Type;

  static S make(T<I>... values) {
    S s;
    ((s.*(std::get<I>(kFields).member) = values), ...);
    return s;
  }
  template <size_t i>
  static auto arg(const S& defaults) {
    if constexpr (i < kRequired) return py::arg(std::get<i>(kFields).name);
    else return py::arg(std::get<i>(kFields).name) = defaults.*(std::get<i>(kFields).member);
  }
  // c.def(py::init(...)): f(S, extra...) builds the object from the struct and Extra arguments after the
  // fields (extra_args: their py::arg, as for any def).
  template <class... Extra, class C, class F, class... ExtraArgs>
  static C& def(C& c, F f, ExtraArgs&&... extra_args) {
    const S defaults{};
    return c.def(py::init([f](T<I>... values, Extra... extra) { return f(make(values...), extra...); }),
                 arg<I>(defaults)..., std::forward<ExtraArgs>(extra_args)...);
  }
};

}  // namespace attn::py_util
