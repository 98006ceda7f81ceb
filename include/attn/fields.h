// A struct's fields named once: a tuple of (name, member pointer) written next to the struct, which the
// serialisers and the bindings walk, so a field added to the list is written, read, checked and bound
// everywhere (config.json, the Python module) without being spelled out again. Not reflection: the list
// is kept by hand, in the struct's order.
#pragma once
#include <tuple>

namespace attn {

template <class S, class T>
struct Field {
  using Struct = S;
  using Type = T;
  const char* name;  // the key in config.json and the name in Python
  T S::*member;
};

// ATTN_FIELD(GptConfig, n_head): the field n_head of GptConfig under the name "n_head".
#define ATTN_FIELD(S, f) ::attn::Field<S, decltype(S::f)>{#f, &S::f}

// f(name, object.*member) for every field of `fields`, in order; `object` may be const.
template <class Fields, class S, class F>
void for_each_field(const Fields& fields, S& object, F&& f) {
  std::apply([&](const auto&... x) { (f(x.name, object.*(x.member)), ...); }, fields);
}

}  // namespace attn
