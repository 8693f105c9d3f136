#!/usr/bin/env bash
# Getting deploytool (and TVM) onto a borrowed GPU machine that cannot reach PyPI, through a
# transfer limit of 64 MiB per call (the apache-tvm wheel alone is 100 MB). See DEVELOPERS.md,
# "NVIDIA GPUs". Here (once):
#     tools/gpu_machine.sh prepare        # downloads the cp312 wheels, splits TVM into .gpu1/ ... .gpuN/
#                                         # (as many parts as the tree leaves room for; rerun it when the tree grew)
# There, in consecutive calls (the machine stays warm ~30 s between calls):
#     tools/gpu_machine.sh stage          # carry .gpu1, then .gpu2, ... up to .gpuN-1: parts kept under ~/dt
#                                         # (and any *.jsonl put there: logs too big to travel in the tree)
#     tools/gpu_machine.sh setup          # carry .gpuN: joins, installs TVM + deploytool into ~/site
#     source tools/gpu_machine.sh env; ... # later calls: PYTHONPATH etc. (fails fast if the machine is fresh)
# (no `set -e` at the top: `source ... env` must not change the calling shell's options)
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DT="${HOME}/dt"
SITE="${HOME}/site"
TVM_WHEEL="apache_tvm-0.27.0.post1-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"

case "${1:-}" in
  prepare)
    set -euo pipefail
    cd "$REPO"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
      apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 tornado==6.6.1 xgboost-cpu==3.2.0
    rm -rf .gpu[0-9]*
    # Each call carries the tree (tracked + unignored files: the shipped tuning logs count) plus one
    # part; 60 MiB leaves room under the 64 MiB limit. The last part travels with the small wheels.
    tree=$( (git ls-files; git ls-files -o --exclude-standard) | xargs -d '\n' du -cb 2>/dev/null | tail -1 | cut -f1)
    small=$(du -cb .whl/apache_tvm_ffi-*.whl .whl/tornado-*.whl .whl/xgboost_cpu-*.whl | tail -1 | cut -f1)
    # staged parts fill what the tree leaves; the last part (which travels with the small wheels) takes the rest
    room=$(( 60 * 1048576 - tree ))
    size=$(stat -c %s ".whl/$TVM_WHEEL")
    test "$(( room - small ))" -gt 8000000 || { echo "the tree ($tree bytes) leaves no room for the wheel parts" >&2; exit 3; }
    # n equal parts, one more until the last one and the small wheels fit in a call together
    # (setting part=room instead, as before, left the last call 41 MB on a 28 MB tree: refused)
    n=$(( (size + small + room - 1) / room ))
    while :; do
      part=$(( (size + n - 1) / n )); last=$(( size - (n - 1) * part ))
      test "$part" -le "$room" && test "$(( last + small ))" -le "$room" && break
      n=$(( n + 1 ))
    done
    mkdir -p .gpuparts && split -b "$part" ".whl/$TVM_WHEEL" .gpuparts/tvm.part.
    i=0
    for f in .gpuparts/tvm.part.*; do i=$((i + 1)); mkdir -p ".gpu$i"; mv "$f" ".gpu$i/"; done
    rmdir .gpuparts
    cp .whl/apache_tvm_ffi-*.whl .whl/tornado-*.whl .whl/xgboost_cpu-*.whl ".gpu$i/"
    for d in .gpu*; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
    du -sh .gpu*; echo "stage carrying .gpu1 ... .gpu$((i - 1)) (one call each), then setup carrying .gpu$i"
    ;;
  stage)
    set -euo pipefail
    mkdir -p "$DT" "$HOME/dtlogs"
    for d in "$REPO"/.gpu[0-9]*; do cp "$d"/tvm.part.* "$DT/"; { cp "$d"/*.jsonl "$HOME/dtlogs/" 2>/dev/null || true; }; done
    ls -la "$DT" "$HOME/dtlogs"
    ;;
  setup)
    set -euo pipefail
    for d in "$REPO"/.gpu[0-9]*; do cp "$d"/tvm.part.* "$DT/"; last="$d"; done
    n_here=$(ls "$DT"/tvm.part.* | wc -l); n_all=$(ls "$last"/tvm.part.* | sed 's/.*part\.//')
    cat "$DT"/tvm.part.* > "$DT/$TVM_WHEEL"
    python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).testzip()" "$DT/$TVM_WHEEL" \
      || { echo "the machine is fresh or a part is missing ($n_here parts, the last is .$n_all): stage first" >&2; exit 3; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
      "$DT/$TVM_WHEEL" "$last"/*.whl
    export PYTHONPATH="$SITE"
    # deploytool itself, laid out as pyproject's package-dir installs it (targets/, schedules/ and
    # cost_model/ inside the package); no build backend needed there
    # (links in the checkout too: tests and benchmarks run from the repo root, where ./deploytool wins)
    rm -rf "$SITE/deploytool" && cp -r "$REPO/deploytool" "$SITE/deploytool"
    for d in targets schedules cost_model; do
      cp -r "$REPO/$d" "$SITE/deploytool/$d"; ln -sfn "../$d" "$REPO/deploytool/$d"
    done
    python3 -c "import tvm, deploytool; from deploytool import cuda; print('tvm', tvm.__version__, cuda.local_gpu())"
    ;;
  env)
    test -f "$SITE/tvm/__init__.py" || { echo "the machine is fresh: run stage (once per part) and setup first"; return 3 2>/dev/null || exit 3; }
    for d in targets schedules cost_model; do ln -sfn "../$d" "$REPO/deploytool/$d"; done
    export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1
    ;;
  *)
    echo "usage: $0 prepare|stage|setup|env" >&2; exit 2 ;;
esac
