// attn/precision.h: the per-thread precision an Autocast sets.
#include "attn/precision.h"

#include "attn/check.h"

namespace attn {

namespace {
thread_local Precision t_precision = Precision::f32;
}  // namespace

const char* to_string(Precision p) { return p == Precision::bf16 ? "bf16" : "f32"; }
Precision parse_precision(const std::string& s) {
  if (s == "f32" || s == "float32") return Precision::f32;
  if (s == "bf16" || s == "bfloat16") return Precision::bf16;
  ATTN_CHECK(false, "Expected a dtype f32 (float32) or bf16 (bfloat16), but got '", s, "' instead");
  return Precision::f32;
}
Precision matmul_precision() { return t_precision; }
Autocast::Autocast(Precision p) : saved_(t_precision) { t_precision = p; }
Autocast::~Autocast() { t_precision = saved_; }

}  // namespace attn
