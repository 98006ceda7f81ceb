// The GEMM candidates side by side on the shapes that matter to attn: attn's packed GEMM, OpenBLAS (the
// core as OPENBLAS_CORETYPE says: run the program once per setting, the variable is read when the library
// loads), oneDNN (dnnl_sgemm), BLIS (bli_sgemm) and libxsmm (libxsmm_sgemm), each compiled in only where
// CMake found it. Interleaved (every candidate once per round), median of the rounds, GFLOP/s.
// Not a Google Benchmark program and not part of the library: the project depends on none of these.
//
//   build/gemm_candidates [--threads 1,2] [--rounds 7] [--quick] [--only 512x128x4096] [--attn-only]
//                         [--shapes 4096x16x512NT,768x48x64NN]   (these shapes instead of the list below)
//                         [--cpu-time]   (time by the process's CPU time: with --threads 1 on a busy machine)
//                         [--tunings "pack_a=4;pack_a=1000"]   (attn only, once per forced tuning (attn/tune.h;
//                             keys mr keep_b kc mc nt pack_a pack_at, 0 = derived), interleaved round by round:
//                             a blocking choice measured against another in one process, the first the reference)
// Shapes (M, N, K, op): 2048³; the training shapes M = B·T in {768, 4096} against N, K in {128, 512}:
// forward y = x·Wᵀ (NT), dx = dy·W (NN), dW = dyᵀ·x (TN, the summed dimension is B·T); the MHA
// projections at E = 512, L = 4096 (in_proj (4096, 1536, 512) and out_proj (4096, 512, 512), NT).
#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <cblas.h>

#include "attn/cpu.h"
#include "attn/gemm.h"
#include "attn/info.h"
#include "attn/threads.h"
#include "attn/tune.h"

#ifdef ATTN_HAVE_DNNL
#include <dnnl.h>
#endif
#ifdef ATTN_HAVE_BLIS
#include <blis-openmp/blis.h>
#endif
#ifdef ATTN_HAVE_XSMM
#include <libxsmm.h>
#endif
#if defined(ATTN_HAVE_DNNL)
#include <omp.h>
#endif

extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_corename();

namespace {

struct Shape {
  const char* what;
  int64_t M, N, K;
  bool ta, tb;
};

// Row-major C (M, N) = op(A) · op(B), C not read (beta = 0), tight leading dimensions.
struct Operands {
  Shape s;
  std::vector<float> a, b, c;
  int64_t lda() const { return s.ta ? s.M : s.K; }
  int64_t ldb() const { return s.tb ? s.K : s.N; }
  explicit Operands(const Shape& sh) : s(sh), a(sh.M * sh.K), b(sh.K * sh.N), c(sh.M * sh.N) {
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& x : a) x = u(gen);
    for (float& x : b) x = u(gen);
  }
};

struct Candidate {
  std::string name;
  std::function<void(Operands&)> run;
  std::function<void(int)> set_threads;
};

void attn_gemm(Operands& o) {
  attn::gemm(o.s.ta, o.s.tb, o.s.M, o.s.N, o.s.K, 1.f, o.a.data(), o.lda(), o.b.data(), o.ldb(), 0.f, o.c.data(),
             o.s.N);
}
void attn_threads(int n) { attn::set_num_threads(n); }

std::vector<Candidate> candidates() {
  std::vector<Candidate> out;
  out.push_back({"attn", attn_gemm, attn_threads});
  out.push_back({std::string("OpenBLAS ") + openblas_get_corename(),
                 [](Operands& o) {
                   cblas_sgemm(CblasRowMajor, o.s.ta ? CblasTrans : CblasNoTrans, o.s.tb ? CblasTrans : CblasNoTrans,
                               o.s.M, o.s.N, o.s.K, 1.f, o.a.data(), o.lda(), o.b.data(), o.ldb(), 0.f, o.c.data(),
                               o.s.N);
                 },
                 [](int n) { openblas_set_num_threads(n); }});
#ifdef ATTN_HAVE_DNNL
  out.push_back({"oneDNN", [](Operands& o) {  // dnnl_sgemm is row-major
                   dnnl_sgemm(o.s.ta ? 'T' : 'N', o.s.tb ? 'T' : 'N', o.s.M, o.s.N, o.s.K, 1.f, o.a.data(), o.lda(),
                              o.b.data(), o.ldb(), 0.f, o.c.data(), o.s.N);
                 },
                 [](int n) { omp_set_num_threads(n); }});
#endif
#ifdef ATTN_HAVE_BLIS
  out.push_back({"BLIS", [](Operands& o) {  // any strides: row-major directly
                   float one = 1.f, zero = 0.f;
                   bli_sgemm(o.s.ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, o.s.tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
                             o.s.M, o.s.N, o.s.K, &one, o.a.data(), o.lda(), 1, o.b.data(), o.ldb(), 1, &zero,
                             o.c.data(), o.s.N, 1);
                 },
                 [](int n) { bli_thread_set_num_threads(n); }});
#endif
#ifdef ATTN_HAVE_XSMM
  out.push_back({"libxsmm", [](Operands& o) {  // column-major: Cᵀ (N, M) = op(B)ᵀ · op(A)ᵀ
                   const libxsmm_blasint m = o.s.N, n = o.s.M, k = o.s.K, lda = o.ldb(), ldb = o.lda(), ldc = o.s.N;
                   const float one = 1.f, zero = 0.f;
                   const char ta = o.s.tb ? 'T' : 'N', tb = o.s.ta ? 'T' : 'N';
                   libxsmm_sgemm(&ta, &tb, &m, &n, &k, &one, o.b.data(), &lda, o.a.data(), &ldb, &zero, o.c.data(),
                                 &ldc);
                 },
                 [](int) {}});  // libxsmm_sgemm runs on the calling thread
#endif
  return out;
}

// attn under each forced tuning of `spec` ("pack_a=4;pack_a=1000,kc=256"), named by its settings; empty when a
// key or value is not understood (the message on stderr).
std::vector<Candidate> tuned_candidates(const std::string& spec) {
  static const std::pair<const char*, int64_t attn::Tuning::*> keys[] = {
      {"mr", &attn::Tuning::gemm_mr}, {"keep_b", &attn::Tuning::gemm_keep_b}, {"kc", &attn::Tuning::gemm_kc},
      {"mc", &attn::Tuning::gemm_mc}, {"nt", &attn::Tuning::gemm_nt},         {"pack_a", &attn::Tuning::gemm_pack_a},
      {"pack_at", &attn::Tuning::gemm_pack_at}};
  std::vector<Candidate> out;
  std::stringstream list(spec);
  for (std::string one; std::getline(list, one, ';');) {
    attn::Tuning t;
    std::stringstream kv(one);
    for (std::string item; std::getline(kv, item, ',');) {
      const std::string name = item.substr(0, item.find('='));
      const auto* key = std::find_if(std::begin(keys), std::end(keys), [&](const auto& k) { return name == k.first; });
      if (key == std::end(keys) || name == item) {
        std::fprintf(stderr, "Expected --tunings as key=value,...;... (keys mr keep_b kc mc nt pack_a pack_at), "
                             "but got '%s'\n", item.c_str());
        return {};
      }
      t.*(key->second) = std::atoll(item.c_str() + name.size() + 1);
    }
    out.push_back({"attn " + one,
                   [t](Operands& o) {
                     attn::force_tuning(t);
                     attn_gemm(o);
                   },
                   attn_threads});
  }
  return out;
}

double fma_peak_gflops();  // below

// The CPU header printed with every table: model name, the SIMD flags that matter, caches.
void print_cpu_header() {
  const attn::CpuInfo& cpu = attn::cpu_info();
  std::printf("CPU: %s\nfeatures: %s\ncaches: L1d %lld KiB, L2 %lld KiB (per core), L3 %lld KiB%s\n", cpu.name.c_str(),
              cpu.features.c_str(), static_cast<long long>(cpu.l1d >> 10), static_cast<long long>(cpu.l2 >> 10),
              static_cast<long long>(cpu.l3 >> 10), cpu.caches_read ? "" : " (assumed)");
  const char* ct = std::getenv("OPENBLAS_CORETYPE");
  std::printf("OPENBLAS_CORETYPE=%s (OpenBLAS runs %s)\n%s\n", ct ? ct : "(unset)", openblas_get_corename(),
              attn::gemm_kernel().c_str());
  std::printf("FMA peak of one core (measured now): %.1f GFLOP/s\n", fma_peak_gflops());
}

// The practical FMA peak of one core: attn's own measure (src/kernels/fma_peak.cpp) on one thread.
double fma_peak_gflops() {
  const int threads = attn::num_threads();
  attn::set_num_threads(1);
  const double g = attn::fma_peak_gflops();
  attn::set_num_threads(threads);
  return g;
}

bool g_cpu_time = false;  // --cpu-time: the process's CPU time, not the wall clock (a busy machine's
                          // preemptions left out; meaningful with --threads 1)

double seconds_of(const std::function<void()>& f) {
  if (g_cpu_time) {
    timespec a{}, b{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    f();
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    return double(b.tv_sec - a.tv_sec) + 1e-9 * double(b.tv_nsec - a.tv_nsec);
  }
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  int rounds = 7;
  bool quick = false, attn_only = false;
  std::string only;   // run only the shapes whose "MxNxK" starts with this
  std::string given;  // --shapes: the shapes to run
  std::string tunings;  // --tunings: attn once per forced tuning
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) threads.push_back(std::atoi(t.c_str()));
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--attn-only")) {
      attn_only = true;  // for profiling attn alone
    } else if (!std::strcmp(argv[i], "--cpu-time")) {
      g_cpu_time = true;
    } else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc) {
      given = argv[++i];
    } else if (!std::strcmp(argv[i], "--tunings") && i + 1 < argc) {
      tunings = argv[++i];
    }
  }
  std::vector<Shape> shapes;
  std::stringstream list(given);
  for (std::string t; std::getline(list, t, ',');) {
    long long m = 0, n = 0, k = 0;
    char op[3] = "NN";
    if (std::sscanf(t.c_str(), "%lldx%lldx%lld%2[NT]", &m, &n, &k, op) < 3 || m <= 0 || n <= 0 || k <= 0) {
      std::fprintf(stderr, "Expected --shapes as MxNxK[NN|NT|TN|TT],..., but got '%s' instead\n", t.c_str());
      return 2;
    }
    shapes.push_back({"given", m, n, k, op[0] == 'T', op[1] == 'T'});
  }
  if (shapes.empty()) {  // the list in the header
    shapes = {{"2048^3", 2048, 2048, 2048, false, false}};
    for (int64_t BT : {768, 4096})
      for (auto [out, in] : {std::pair<int64_t, int64_t>{128, 512}, {512, 128}, {512, 512}}) {
        shapes.push_back({"fwd x.W^T", BT, out, in, false, true});
        shapes.push_back({"dx = dy.W", BT, in, out, false, false});
        shapes.push_back({"dW = dy^T.x", out, in, BT, true, false});
      }
    shapes.push_back({"MHA in_proj", 4096, 1536, 512, false, true});
    shapes.push_back({"MHA out_proj", 4096, 512, 512, false, true});
    if (quick) shapes.resize(1);
    if (!only.empty())
      std::erase_if(shapes, [&](const Shape& s) {
        return (std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K)).rfind(only, 0) != 0;
      });
  }

  std::vector<Candidate> cands = tunings.empty() ? candidates() : tuned_candidates(tunings);
  if (cands.empty()) return 2;
  if (attn_only && tunings.empty()) cands.resize(1);
  print_cpu_header();
  for (int t : threads) {
    for (Candidate& c : cands) c.set_threads(t);
    std::printf("\nthreads %d, GFLOP/s (median of %d interleaved rounds); ratio = the first (attn) / the best other\n",
                t, rounds);
    std::printf("%-13s %16s", "shape", "M x N x K op");
    for (const Candidate& c : cands) std::printf(" %16s", c.name.c_str());
    std::printf(" %7s  max|diff| vs attn\n", "ratio");
    for (const Shape& s : shapes) {
      Operands o(s);
      const double flops = 2.0 * s.M * s.N * s.K;
      // Calls per timing: ~30 ms of work at ~100 GFLOP/s, so that small shapes are not all clock.
      const int reps = std::max<int>(1, static_cast<int>(3e9 / flops / t));
      std::vector<std::vector<double>> times(cands.size());
      std::vector<float> ref;
      double diff = 0;
      for (size_t ci = 0; ci < cands.size(); ++ci) {  // warm up, and check each result against attn's
        cands[ci].run(o);
        if (ci == 0) ref = o.c;
        for (size_t i = 0; i < ref.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(o.c[i] - ref[i])));
      }
      for (int r = 0; r < rounds; ++r)
        for (size_t ci = 0; ci < cands.size(); ++ci)
          times[ci].push_back(seconds_of([&] {
                                for (int i = 0; i < reps; ++i) cands[ci].run(o);
                              }) /
                              reps);
      char dims[64];
      std::snprintf(dims, sizeof dims, "%lldx%lldx%lld %c%c", static_cast<long long>(s.M), static_cast<long long>(s.N),
                    static_cast<long long>(s.K), s.ta ? 'T' : 'N', s.tb ? 'T' : 'N');
      std::printf("%-13s %16s", s.what, dims);
      std::vector<double> gf;
      for (auto& ts : times) {
        std::nth_element(ts.begin(), ts.begin() + ts.size() / 2, ts.end());
        gf.push_back(flops / ts[ts.size() / 2] * 1e-9);
        std::printf(" %16.1f", gf.back());
      }
      const double best_other = gf.size() > 1 ? *std::max_element(gf.begin() + 1, gf.end()) : gf[0];
      std::printf(" %7.2f  %.1e\n", gf[0] / best_other, diff);
      std::fflush(stdout);
    }
  }
  return 0;
}
