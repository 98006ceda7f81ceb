"""Two builds of one benchmark program, A and B, interleaved: A, B, A, B, ... each run once per round,
then per case the median rate of each and the ratio B / A. For a change to a kernel measured against
the build before it (BENCHMARKS.md's rule: interleave A/B, medians). Not a benchmark itself: it runs
build/gemm_candidates (--attn-only: attn's GFLOP/s per shape) or build/bench_kernels (GFLOP/s per
benchmark, or 1/time where a benchmark has no GFLOP/s counter) and reads their output.

  python bench/ab.py OLD/gemm_candidates build/gemm_candidates --rounds 5 -- --threads 1 --shapes 4096x16x512NT
  python bench/ab.py OLD/bench_kernels build/bench_kernels --rounds 5 -- --benchmark_filter='BM_Flash/'
  --cpu: rates by CPU time (a busy machine's preemptions left out), for programs run on one thread
  (gemm_candidates --threads 1, bench_kernels --threads 1).
"""
import argparse
import json
import re
import statistics
import subprocess
import sys


def gemm_rates(out):
    """{'threads 1, 4096x16x512 NT': GFLOP/s of attn} from gemm_candidates' tables."""
    rates, threads = {}, None
    for line in out.splitlines():
        m = re.match(r"threads (\d+),", line)
        if m:
            threads = m.group(1)
            continue
        m = re.match(r".{13} +(\d+x\d+x\d+ [NT]{2}) +([\d.]+)", line)
        if m and threads:
            rates[f"threads {threads}, {m.group(1)}"] = float(m.group(2))
    return rates


def benchmark_rates(out, cpu):
    """{'BM_Flash/L:1024/causal:0': GFLOP/s, or 1e3/time where there is no GFLOP/s} from JSON output; with
    cpu, by the CPU time instead of the wall clock."""
    rates = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        t = b["cpu_time"] if cpu else b["real_time"]
        rates[b["name"]] = b["GFLOP/s"] * b["real_time"] / t if "GFLOP/s" in b else 1e3 / t
    return rates


def run(binary, args, cpu):
    google = "bench_kernels" in binary
    cmd = [binary] + args + (["--benchmark_format=json"] if google
                             else ["--attn-only"] + (["--cpu-time"] if cpu else []))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return benchmark_rates(out, cpu) if google else gemm_rates(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="the program of build A (before)")
    ap.add_argument("b", help="the same program of build B (after)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu", action="store_true",
                    help="rates by CPU time, not the wall clock (a busy machine: run the programs on 1 thread)")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: the program's own flags
    o = ap.parse_args(argv[:cut])
    o.args = argv[cut + 1:]
    runs = {"A": [], "B": []}
    for r in range(o.rounds):
        for name, binary in (("A", o.a), ("B", o.b)):
            runs[name].append(run(binary, o.args, o.cpu))
        print(f"round {r + 1}/{o.rounds} done", file=sys.stderr)
    clock = "CPU time" if o.cpu else "wall clock"
    print(f"median of {o.rounds} interleaved rounds; A = {o.a}, B = {o.b}; rate (GFLOP/s, or 1/ms) by {clock}")
    print(f"{'case':48} {'A':>9} {'B':>9} {'B/A':>6}")
    for case in runs["A"][0]:
        a = statistics.median(r[case] for r in runs["A"])
        b = statistics.median(r[case] for r in runs["B"])
        print(f"{case:48} {a:9.1f} {b:9.1f} {b / a:6.3f}")


if __name__ == "__main__":
    main()
