"""The layout rules the project keeps (scripts/check-style: 120 columns, no tabs, no trailing blanks, a final
newline in every tracked C++ and Python file) hold, and the check fails on a file that breaks them."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "check-style"


def test_the_tree_keeps_the_layout_rules():
    r = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_check_finds_each_rule_broken(tmp_path):
    bad = tmp_path / "bad.cpp"
    bad.write_text("int a;\n" + "x" * 121 + "\n\tint b;\nint c;  \nint d;")
    r = subprocess.run([sys.executable, str(CHECK), str(bad)], capture_output=True, text=True)
    assert r.returncode == 1, r.stdout
    for line, what in ((2, "121 characters"), (3, "a tab"), (4, "trailing blanks"), (5, "no final newline")):
        assert f"{bad}:{line}: {what}" in r.stdout, r.stdout
    good = tmp_path / "good.py"
    good.write_text("x = 1  # " + "y" * 111 + "\n")  # exactly 120 characters
    assert subprocess.run([sys.executable, str(CHECK), str(good)]).returncode == 0
