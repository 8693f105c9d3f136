#!/usr/bin/env bash
# Getting deploytool (and TVM) onto a borrowed GPU machine that cannot reach PyPI, through a
# transfer limit of 64 MiB per call (the apache-tvm wheel alone is 100 MB). See DEVELOPERS.md,
# "NVIDIA GPUs". Here (once):
#     tools/gpu_machine.sh prepare        # downloads the cp312 wheels, splits TVM into .gpu1/ .gpu2/ .gpu3/
# There, in consecutive calls (the machine stays warm ~30 s between calls):
#     tools/gpu_machine.sh stage          # carry .gpu1, then again carrying .gpu2: parts kept under ~/dt
#     tools/gpu_machine.sh setup          # carry .gpu3: joins, installs TVM + deploytool into ~/site
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
    for d in .gpu1 .gpu2 .gpu3; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
    mkdir -p .whl .gpu1 .gpu2 .gpu3
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
      apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 tornado==6.6.1 xgboost-cpu==3.2.0
    rm -f .gpu1/* .gpu2/* .gpu3/*
    # three parts of ~34 MB (the last with the small wheels): each call carries one plus the repo
    # (13 MB with the tuning logs), under the 64 MiB a call may carry
    split -n 3 ".whl/$TVM_WHEEL" .gpu1/tvm.part.
    mv .gpu1/tvm.part.ab .gpu2/ && mv .gpu1/tvm.part.ac .gpu3/
    cp .whl/apache_tvm_ffi-*.whl .whl/tornado-*.whl .whl/xgboost_cpu-*.whl .gpu3/
    du -sh .gpu1 .gpu2 .gpu3
    ;;
  stage)
    set -euo pipefail
    mkdir -p "$DT" && cp "$REPO"/.gpu[12]/tvm.part.* "$DT/" 2>/dev/null; ls -la "$DT"
    ;;
  setup)
    set -euo pipefail
    test -f "$DT/tvm.part.aa" -a -f "$DT/tvm.part.ab" || { echo "the machine is fresh: run stage twice first"; exit 3; }
    cat "$DT/tvm.part.aa" "$DT/tvm.part.ab" "$REPO/.gpu3/tvm.part.ac" > "$DT/$TVM_WHEEL"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
      "$DT/$TVM_WHEEL" "$REPO"/.gpu3/*.whl
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
    test -f "$SITE/tvm/__init__.py" || { echo "the machine is fresh: run stage (x2) and setup first"; return 3 2>/dev/null || exit 3; }
    for d in targets schedules cost_model; do ln -sfn "../$d" "$REPO/deploytool/$d"; done
    export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1
    ;;
  *)
    echo "usage: $0 prepare|stage|setup|env" >&2; exit 2 ;;
esac
