#!/usr/bin/env bash
# Builds, on a machine WITHOUT a GPU, the wheel the GPU run installs (docs/design.md, "The GPU wheel
# and the one-call run"): cp312 (the GPU image's Python), sm_90a, every GPU part (cuBLASLt dot, cuDNN
# dot, hopper_mx, _nvshmem) against the FFI 0.1 headers of jaxlib 0.8.0 and NVSHMEM 3.4.5, the
# oldest NVSHMEM we support (both are the build backend's pins: a plain `pip wheel` with isolation).
# The GPU machine then only runs `pip install --no-index --no-deps --target DIR` (scripts/gpu_run.sh).
#
#   scripts/gpu_wheel.sh            build into .whl/ (git-ignored; the device tool carries it)
#   scripts/gpu_wheel.sh --check    exit 1 unless .whl/ holds a wheel built from this tree's package
#                                   sources (run it before spending device time)
#   scripts/gpu_wheel.sh --deps     only (re)fetch .whl/deps/ (below)
#
# The GPU machine has no network and installs with --no-deps, so .whl/deps/ also holds the wheels of
# the package's runtime dependencies that the GPU image may lack (every [project] dependency but
# jax, jaxlib, numpy and ml_dtypes, which the image has in its own CUDA builds and must keep):
# cp312, manylinux_2_28 or older, so they load on the image's glibc.
# .whl/deps/tokamax/ holds tokamax and what it imports that the image lacks (TOKAMAX_WHEELS below),
# for bench_ragged_dot's baseline: gpu_run.sh installs them for that step only, into a folder of
# their own (GPU_WHEEL_TOKAMAX=0 leaves them out: ~36 MB, most of it xprof).
#
# Writes .whl/jax_gpuext-*.whl, .whl/wheel.json (commit, dirty, size, sha256, build time, the shared
# libraries and glibc/libstdc++ symbol versions each module needs) and .whl/build.log.
# Environment: GPU_WHEEL_PYTHON (a CPython 3.12; default: python3.12, then pyenv's),
# GPU_WHEEL_ARCHS (default 90a-real), GPU_WHEEL_MAX_GLIBC (default 2.34: fail above it),
# GPU_WHEEL_SMOKE_PYTHON (a python 3.12 with jax: install the wheel with --target and run `info`).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.whl
# What goes into the wheel: a change to any of these since the wheel's commit makes it stale.
PACKAGE_INPUTS=(jax_gpuext csrc ffi cmake CMakeLists.txt pyproject.toml build_backend)
MAX_GLIBC=${GPU_WHEEL_MAX_GLIBC:-2.34}

die() { echo "gpu_wheel: $*" >&2; exit 1; }

check() {
  local meta=$OUT/wheel.json
  [ -f "$meta" ] || die "no $meta: build the wheel first (scripts/gpu_wheel.sh)"
  local commit dirty wheel
  read -r commit dirty wheel < <(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["commit"], m["dirty"], m["wheel"])' "$meta")
  [ -f "$OUT/$wheel" ] || die "$meta names $wheel, which is not in $OUT/"
  [ "$(ls "$OUT"/jax_gpuext-*.whl | wc -l)" = 1 ] || die "more than one jax_gpuext wheel in $OUT/"
  ls "$OUT"/deps/*.whl >/dev/null 2>&1 || die "no runtime dependencies in $OUT/deps/: scripts/gpu_wheel.sh --deps"
  [ "$dirty" = False ] || die "$wheel was built from a tree with uncommitted changes: rebuild from a clean tree"
  git cat-file -e "$commit^{commit}" 2>/dev/null || die "$wheel's commit $commit is not in this repository"
  if ! git diff --quiet "$commit" -- "${PACKAGE_INPUTS[@]}" || [ -n "$(git status --porcelain -- "${PACKAGE_INPUTS[@]}")" ]; then
    echo "gpu_wheel: $wheel is STALE: built from $commit, and the package sources changed since:" >&2
    git diff --stat "$commit" -- "${PACKAGE_INPUTS[@]}" >&2
    git status --short -- "${PACKAGE_INPUTS[@]}" >&2
    exit 1
  fi
  echo "gpu_wheel: $wheel is current (built from $commit; package sources unchanged since)"
}

find_python() {
  local c
  for c in "${GPU_WHEEL_PYTHON:-}" python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
    [ -n "$c" ] && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null && { echo "$c"; return; }
  done
  die "no CPython 3.12 found (the GPU image's Python): set GPU_WHEEL_PYTHON"
}

# needs FILE: the shared libraries FILE needs (NEEDED) and the newest GLIBC_/GLIBCXX_ version it uses.
needs() {
  local needed glibc glibcxx
  needed=$(readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd, -)
  glibc=$(objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
  glibcxx=$(objdump -T "$1" | grep -o 'GLIBCXX_[0-9.]*' | sed 's/GLIBCXX_//' | sort -uV | tail -1)
  echo "$needed $glibc ${glibcxx:-none}"
}

# tokamax 0.0.17 (pure Python, jax >= 0.11.1) and the packages `import tokamax` needs that the GPU
# image (Python 3.12, jax 0.11.2, flax 0.12 and its dependencies) does not have, as found by
# importing it from a --target folder beside such an environment: pinned to the versions that
# imported there and ran its ragged_dot (docs/design.md, "Benchmarks that measure the hardware").
# xprof: tokamax's Op base class imports xprof.cli at import time (2.23.1 or newer has it).
TOKAMAX_WHEELS=(tokamax==0.0.17 annotated-types==0.8.0 einshape==1.0 fire==0.7.1 immutabledict==4.3.1
  jaxtyping==0.3.11 wadler-lindig==0.1.7 pydantic==2.14.4 pydantic-core==2.50.5 qwix==0.1.8 six==1.17.0
  termcolor==3.3.0 tqdm==4.70.1 typing-extensions==4.16.0 typing-inspection==0.4.5 xprof==2.24.2)

# deps PY: the runtime dependencies' wheels into $OUT/deps (the image keeps its own jax/numpy/ml_dtypes),
# and tokamax's into $OUT/deps/tokamax.
deps() {
  local reqs
  reqs=$("$1" -c '
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
keep = ("jax", "jaxlib", "numpy", "ml-dtypes")
print(" ".join(d for d in deps if re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower().replace("_", "-") not in keep))')
  rm -rf "$OUT/deps"; mkdir -p "$OUT/deps"
  [ -n "$reqs" ] || return 0
  # shellcheck disable=SC2086  # requirements without spaces
  "$1" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUT/deps" $reqs 2>&1 | { grep -v "^WARNING: Location" >&2 || true; }
  [ -n "$(ls "$OUT/deps")" ] || die "could not fetch the runtime dependencies' wheels: $reqs"
  echo "gpu_wheel: runtime dependencies for the GPU machine: $(cd "$OUT/deps" && ls *.whl | paste -sd' ' -)"
  [ "${GPU_WHEEL_TOKAMAX:-1}" = 0 ] && return 0
  mkdir -p "$OUT/deps/tokamax"
  "$1" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$OUT/deps/tokamax" "${TOKAMAX_WHEELS[@]}" 2>&1 \
    | { grep -v "^WARNING: Location" >&2 || true; }
  [ "$(ls "$OUT/deps/tokamax" | wc -l)" = "${#TOKAMAX_WHEELS[@]}" ] \
    || die "fetched $(ls "$OUT/deps/tokamax" | wc -l) of the ${#TOKAMAX_WHEELS[@]} tokamax wheels (GPU_WHEEL_TOKAMAX=0 skips them)"
  echo "gpu_wheel: tokamax for bench_ragged_dot ($(du -sh "$OUT/deps/tokamax" | cut -f1)): $(cd "$OUT/deps/tokamax" && ls | paste -sd' ' -)"
}

[ "${1:-}" = --check ] && { check; exit; }
[ "${1:-}" = --deps ] && { deps "$(find_python)"; exit; }
[ $# -eq 0 ] || die "unknown argument $1 (usage: scripts/gpu_wheel.sh [--check])"
command -v nvcc >/dev/null || die "needs nvcc (every GPU part is compiled here)"
PY=$(find_python)
commit=$(git rev-parse HEAD)
[ -z "$(git status --porcelain)" ] || echo "gpu_wheel: WARNING: the tree has uncommitted changes; the wheel records dirty=true and --check will refuse it" >&2
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "gpu_wheel: building with $PY ($("$PY" -V)), nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), log in $OUT/build.log"
start=$SECONDS
# ON everywhere: a part that cannot be built stops the build instead of leaving a partial wheel.
if ! JAX_GPUEXT_CUDA=ON JAX_GPUEXT_CUDNN=ON JAX_GPUEXT_NVSHMEM=ON \
     JAX_GPUEXT_CUDA_ARCHITECTURES="${GPU_WHEEL_ARCHS:-90a-real}" \
     "$PY" -m pip wheel -v --no-deps -w "$tmp" . > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log" >&2
  die "the build failed (whole log: $OUT/build.log)"
fi
seconds=$((SECONDS - start))
wheel=$(cd "$tmp" && ls jax_gpuext-*.whl)
case "$wheel" in *-cp312-cp312-*) ;; *) die "expected a cp312 wheel, got $wheel" ;; esac
rm -f "$OUT"/jax_gpuext-*.whl
mv "$tmp/$wheel" "$OUT/"

# What is inside: every module, every part built, NVSHMEM 3.4.5, the commit.
unzip -q "$OUT/$wheel" -d "$tmp/x"
pkg=$tmp/x/jax_gpuext
for m in _cpu _cuda _nvshmem; do ls "$pkg"/$m.*.so >/dev/null 2>&1 || die "$wheel has no $m module"; done
modules_json=$(for so in "$pkg"/_cpu.*.so "$pkg"/_cuda.*.so "$pkg"/_nvshmem.*.so; do
  read -r needed glibc glibcxx < <(needs "$so")
  printf '"%s": {"needed": "%s", "glibc": "%s", "glibcxx": "%s"}\n' "$(basename "$so" | cut -d. -f1)" "$needed" "$glibc" "$glibcxx"
done | paste -sd, -)
"$PY" - "$pkg" "$OUT/$wheel" "$commit" "$seconds" "$MAX_GLIBC" "{$modules_json}" > "$OUT/wheel.json" <<'EOF'
import datetime, hashlib, json, os, re, subprocess, sys

pkg, wheel, commit, seconds, max_glibc, modules = sys.argv[1:]
modules = json.loads(modules)
parts = json.load(open(os.path.join(pkg, "build_parts.json")))
source = json.load(open(os.path.join(pkg, "build_source.json")))
missing = [p for p, r in parts.items() if not r.get("built")]
assert not missing, f"parts not built: {missing}"
assert parts["nvshmem_allreduce"].get("version") == "3.4.5", parts["nvshmem_allreduce"]
assert source["commit"] == commit, (source, commit)
# Only the C/C++ runtime (and, for _nvshmem, NVSHMEM's host library, which the nvidia-nvshmem wheel
# provides at run time); cudart is static, everything else is dlopened (docs/design.md, "Build").
allowed = {"libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6", "libdl.so.2", "libpthread.so.0",
           "librt.so.1", "ld-linux-x86-64.so.2"}
version = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
for name, m in modules.items():
    extra = set(filter(None, m["needed"].split(","))) - allowed - ({"libnvshmem_host.so.3"} if name == "_nvshmem" else set())
    assert not extra, f"{name} needs {sorted(extra)}: not available on every machine"
    assert version(m["glibc"]) <= version(max_glibc), f"{name} needs GLIBC_{m['glibc']} > {max_glibc}"
meta = {
    "wheel": os.path.basename(wheel), "size_bytes": os.path.getsize(wheel),
    "sha256": hashlib.sha256(open(wheel, "rb").read()).hexdigest(),
    "commit": source["commit"], "dirty": source["dirty"],
    "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "build_seconds": int(seconds), "nvshmem_build_version": parts["nvshmem_allreduce"]["version"],
    "parts": {p: r["detail"] for p, r in parts.items()}, "modules": modules,
}
print(json.dumps(meta, indent=2))
EOF
deps "$PY"
echo "gpu_wheel: $OUT/$wheel, $(du -h "$OUT/$wheel" | cut -f1), built in ${seconds} s from $commit"
cat "$OUT/wheel.json"

if [ -n "${GPU_WHEEL_SMOKE_PYTHON:-}" ]; then
  # What the GPU machine does, with this machine's stand-ins: install with --target, import, info.
  "$GPU_WHEEL_SMOKE_PYTHON" -m pip install -q --no-index --no-deps --target "$tmp/site" "$OUT/$wheel"
  (cd / && PYTHONPATH="$tmp/site" "$GPU_WHEEL_SMOKE_PYTHON" -P -m jax_gpuext info) | head -30
fi
