"""Data-parallel training from the outside: `mpirun -np N attn train` (scripts/mpirun-local, loopback only)
follows one process's trajectory on the same global batch, its checkpoint resumes with -np 1 and -np 3 on
the same trajectory, a rank killed mid-run ends the job with a nonzero exit and an error that says so and
leaves the last checkpoint loadable, errors met by every rank are said once, and attn.Trainer under mpirun
trains one model. Skipped, with the reason, when attn was built without MPI. The exact per-step
comparisons (1e-5 relative, bits on repeat) are tests/dist/test_data_parallel.cpp's.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import _attn
import attn
from cli_bin import attn_exe

REPO = Path(__file__).resolve().parents[2]
MPIRUN = REPO / "scripts" / "mpirun-local"

pytestmark = pytest.mark.skipif(
    not getattr(_attn, "HAVE_MPI", False) or shutil.which("mpirun") is None,
    reason="attn was built without MPI (apt install libopenmpi-dev openmpi-bin, then configure again)")

# The reversal task's defaults (tiny model, batch 32, 1 thread per process) with a short schedule.
TASK = ["--steps", "20", "--eval-iters", "2", "--log-every", "1"]


def exe():
    path = attn_exe()
    assert path.is_file(), f"no attn binary at {path}"
    return str(path)


def mpirun(np_, *args, timeout=300):
    return subprocess.run([str(MPIRUN), "-np", str(np_), *args], capture_output=True, text=True, timeout=timeout)


def train(np_, *args):
    cmd = [exe(), "train", *args]
    r = mpirun(np_, *cmd) if np_ > 1 else subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"np {np_}: {r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def losses(out):
    """{step: loss} from the progress lines ("step 3/20  loss 2.1234  ...")."""
    return {int(m[1]): float(m[2]) for m in re.finditer(r"^step (\d+)/\d+  loss ([0-9.]+)", out, re.M)}


def metrics(ck):
    return json.loads((Path(ck) / "config.json").read_text())["metrics"]


def tensor_bytes(ck):
    """model.safetensors after its header (whose metadata holds the checkpoint's own id)."""
    raw = (Path(ck) / "model.safetensors").read_bytes()
    return raw[8 + int.from_bytes(raw[:8], "little"):]


def close(a, b, rel=1e-5):
    return abs(a - b) <= rel * abs(b)


def test_np2_follows_one_process_and_resumes_on_np1_and_np3(tmp_path):
    one = train(1, "--out", str(tmp_path / "one"), "--eval-every", "0", *TASK)
    two = train(2, "--out", str(tmp_path / "two"), "--eval-every", "0", *TASK)
    assert "data parallel: 2 processes, 16 rows of each batch per process" in two.stdout, two.stdout
    assert re.search(r"^all-reduce: .* per step in \d+ buckets?: [0-9.]+ ms per step after the backward", two.stdout,
                     re.M), two.stdout
    assert two.stdout.count("memory: about") == 1, "rank 0 alone prints"
    want, got = losses(one.stdout), losses(two.stdout)
    assert len(want) == 20 and got.keys() == want.keys()
    for s in want:  # printed to 4 decimals: the same digits (within one rounding step)
        assert abs(got[s] - want[s]) <= 1.5e-4, (s, got[s], want[s])
    for k in ("train_loss", "val_loss"):
        assert close(metrics(tmp_path / "two")[k], metrics(tmp_path / "one")[k]), k

    # A checkpoint of -np 2 at step 10 continues on 1 and on 3 processes along the uninterrupted run.
    half = tmp_path / "half"
    train(2, "--out", str(half), "--eval-every", "0", "--lr-decay-steps", "20",
          *[a if a != "20" else "10" for a in TASK])
    for np_ in (1, 3):
        ck = tmp_path / f"resumed{np_}"
        shutil.copytree(half, ck)
        r = train(np_, "--out", str(ck), "--resume", "--steps", "20", "--lr-decay-steps", "20", "--log-every", "1")
        assert "(from 10)" in r.stdout
        if np_ == 3:
            assert "data parallel: 3 processes, 10 or 11 rows" in r.stdout, r.stdout
        rest = losses(r.stdout)
        assert sorted(rest) == list(range(11, 21))
        for s in rest:
            assert abs(rest[s] - want[s]) <= 1.5e-4, (np_, s, rest[s], want[s])
        for k in ("train_loss", "val_loss"):
            assert close(metrics(ck)[k], metrics(tmp_path / "one")[k]), (np_, k)


def test_np2_repeats_bit_for_bit(tmp_path):
    a = train(2, "--out", str(tmp_path / "a"), "--eval-every", "0", *TASK)
    b = train(2, "--out", str(tmp_path / "b"), "--eval-every", "0", *TASK)
    assert losses(a.stdout) == losses(b.stdout)
    assert tensor_bytes(tmp_path / "a") == tensor_bytes(tmp_path / "b")  # weights and AdamW moments


def test_an_error_every_rank_meets_is_said_once(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    r = mpirun(2, exe(), "train", "--out", str(tmp_path / "taken"), *TASK)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "notes.txt" in errors[0], r.stderr
    # A batch smaller than the processes: every rank refuses it, rank 0 says why.
    r = mpirun(3, exe(), "train", "--out", str(tmp_path / "small"), "--batch", "2", *TASK)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode != 0 and len(errors) == 1 and "Expected batch >= 3" in errors[0], r.stderr


def children(pid):
    """Processes whose parent is pid, as {pid: environment}."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                env = dict(e.split("=", 1) for e in (d / "environ").read_bytes().decode(errors="replace").split("\0")
                           if "=" in e)
                found[int(d.name)] = env
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.parametrize("victim", [0, 1])
def test_a_killed_rank_ends_the_job_and_leaves_the_last_checkpoint(tmp_path, victim):
    text = tmp_path / "t.txt"
    text.write_text("".join(f"line {i}: to be or not to be, that is the question\n" for i in range(300)))
    ck = tmp_path / "ck"
    p = subprocess.Popen([str(MPIRUN), "-np", "2", exe(), "train", "--data", str(text), "--config", "tiny",
                          "--block", "32", "--batch", "4", "--steps", "1000000", "--eval-every", "3",
                          "--eval-iters", "1",
                          "--threads", "1", "--out", str(ck)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.time() + 120
        while not (ck / "config.json").exists():  # the first checkpoint
            assert p.poll() is None and time.time() < deadline, p.communicate()
            time.sleep(0.05)
        time.sleep(0.3)  # mid-run: the next steps and saves are under way
        ranks = {int(env.get("OMPI_COMM_WORLD_RANK", -1)): pid for pid, env in children(p.pid).items()}
        assert victim in ranks, ranks
        os.kill(ranks[victim], signal.SIGKILL)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0
    assert re.search(rf"rank {victim} with PID \d+ .*exited on signal 9", err.replace("\n", " ")), err
    model, tok = attn.GPT.load(str(ck))  # the last checkpoint: complete and verified
    step = json.loads((ck / "config.json").read_text())["step"]
    assert step > 0 and step % 3 == 0
    t = attn.Trainer.resume(str(ck))
    assert t.step_count == step


SCRIPT = textwrap.dedent("""
    import json, sys
    import attn
    t = attn.Trainer(steps=12, threads=1, eval_iters=2)
    ls = [t.step()["loss"] for _ in range(12)]
    ev = t.evaluate()
    t.save(sys.argv[1])  # every rank calls it; rank 0 writes
    if t.rank == 0:
        print(json.dumps({"losses": ls, "eval": ev, "world": t.world_size, "allreduce": t.allreduce}))
    if len(sys.argv) > 2 and t.rank == int(sys.argv[2]):
        raise RuntimeError("rank failed on purpose")
    t.step()  # the others wait here for the failed rank
""")


def test_python_trainer_under_mpirun(tmp_path):
    script = tmp_path / "dp.py"
    script.write_text(SCRIPT)
    alone = subprocess.run([sys.executable, str(script), str(tmp_path / "a")], capture_output=True, text=True,
                           timeout=300)
    assert alone.returncode == 0, alone.stderr
    r = mpirun(2, sys.executable, str(script), str(tmp_path / "b"))
    assert r.returncode == 0, r.stdout + r.stderr
    a, b = json.loads(alone.stdout), json.loads(r.stdout)
    assert a["world"] == 1 and a["allreduce"] is None
    assert b["world"] == 2 and b["allreduce"]["steps"] == 12 and b["allreduce"]["bytes_per_step"] > 0
    assert all(close(x, y) for x, y in zip(b["losses"], a["losses"])), (b["losses"], a["losses"])
    assert all(close(x, y) for x, y in zip(b["eval"], a["eval"]))
    assert attn.Trainer.resume(str(tmp_path / "b")).step_count == 12

    # An uncaught exception on one rank ends every process instead of leaving them waiting.
    t0 = time.time()
    r = mpirun(2, sys.executable, str(script), str(tmp_path / "c"), "1", timeout=120)
    assert r.returncode != 0 and "rank failed on purpose" in r.stderr, r.stderr
    assert "error: rank 1 of 2: an uncaught Python exception" in r.stderr, r.stderr
    assert time.time() - t0 < 100


def test_ctrl_c_under_mpirun_saves_the_step_every_rank_reached(tmp_path):
    """SIGINT to the process group, as a terminal's Ctrl-C sends it to mpirun and every rank: the ranks
    agree to stop after one step, rank 0 saves it, and the checkpoint is that step's (no eval needed)."""
    ck = tmp_path / "ck"
    p = subprocess.Popen([str(MPIRUN), "-np", "2", exe(), "train", "--steps", "1000000", "--eval-every", "0",
                          "--eval-iters", "1", "--log-every", "1", "--threads", "1", "--out", str(ck)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in p.stdout:  # rank 0's plain lines
            if line.startswith("step 5/"):
                break
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    # The checkpoint is the step every rank reached: after the last step line (a line is printed once the
    # ranks agreed to go on, so every printed step was followed by another on every rank). mpirun stops
    # forwarding output while it waits to kill the ranks, and lines in flight then may be lost (seen: the
    # checkpoint at 280 after a last line of 278), so the lines read are a prefix of those printed; the
    # "interrupted at step N" line may not get through either; when it does, it names that step.
    assert (ck / "config.json").is_file(), out[-2000:] + err[-2000:]
    step = json.loads((ck / "config.json").read_text())["step"]
    last = max([5] + [int(x) for x in re.findall(r"^step (\d+)/", out, re.M)])  # step 5 was read above
    assert step > last and step >= 5, (step, last)
    m = re.search(r"interrupted at step (\d+): checkpoint saved", out)
    assert m is None or int(m.group(1)) == step, out[-2000:]
    attn.GPT.load(str(ck))
    assert attn.Trainer.resume(str(ck)).step_count == step


def test_ranks_may_run_different_thread_counts(tmp_path):
    # Issue 23: per-rank --threads were refused as "different options", though no result depends on them.
    same = train(2, "--out", str(tmp_path / "same"), "--eval-every", "0", "--threads", "1", *TASK)
    cmd = ["train", "--out", str(tmp_path / "mixed"), "--eval-every", "0", *TASK]
    r = subprocess.run([str(MPIRUN), "-np", "1", exe(), *cmd, "--threads", "1", ":", "-np", "1", exe(), *cmd,
                        "--threads", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert losses(r.stdout) == losses(same.stdout)
    assert tensor_bytes(tmp_path / "mixed") == tensor_bytes(tmp_path / "same")
