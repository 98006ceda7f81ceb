#!/usr/bin/env bash
# The C++ package as a user meets it: `cmake --install` into an empty prefix, then examples/ built there
# as an outside project (find_package(attn CONFIG REQUIRED)) and once more with pkg-config alone, and
# both programs run. Not a test of the library's numbers. Usage: install_test.sh <build dir> [work dir]
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
work=${2:-$(mktemp -d)}
trap '[ -n "${2:-}" ] || rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/attn/sdpa.h include/attn/version.h bin/attn; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
ls "$prefix"/lib*/libattn_core.a "$prefix"/lib*/cmake/attn/attnConfig.cmake "$prefix"/lib*/pkgconfig/attn.pc >/dev/null

# 1. CMake: the outside project finds attn::attn and its dependencies transitively.
cmake -S "$src/examples" -B "$work/ex" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/ex" -j2 >/dev/null
"$work/ex/example_quickstart" | grep -q "out shape" || { echo "FAIL: example_quickstart via find_package"; exit 1; }

# 2. pkg-config: one compile line from attn.pc.
export PKG_CONFIG_PATH="$(dirname "$(ls "$prefix"/lib*/pkgconfig/attn.pc)"):${PKG_CONFIG_PATH:-}"
# shellcheck disable=SC2046
g++ -O1 "$src/examples/quickstart.cpp" -o "$work/quickstart_pc" $(pkg-config --cflags --libs attn)
"$work/quickstart_pc" | grep -q "out shape" || { echo "FAIL: example_quickstart via pkg-config"; exit 1; }

# The README's C++ is examples/quickstart.cpp itself (tests/python/test_readme.py checks they are the same):
# 1 and 2 built and ran it as a user pastes it.

"$prefix/bin/attn" --help >/dev/null
echo "install test: find_package(attn) and pkg-config attn both build and run examples/quickstart.cpp (the" \
  "README's C++)"
