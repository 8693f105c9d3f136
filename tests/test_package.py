"""`deploytool package`: bundles for x86 and aarch64 with TVM's runtime-only libraries and a native
runner; the runner runs natively (x86) and under qemu-user (aarch64) with outputs matching
onnxruntime; the C++ embedding example builds with CMake and runs; load-time checks refuse .so files
for another runtime, architecture or CPU."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile

import numpy as np
import pytest

pytestmark = pytest.mark.models


def _unpack(bundle, dest):
    with tarfile.open(bundle) as t:
        t.extractall(dest, filter="data")
    (root,) = [p for p in dest.iterdir() if p.is_dir()]
    return root


def _inputs(tmp_path, model):
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    sess = ort.InferenceSession(str(model))
    feed, files = {}, []
    for i, inp in enumerate(sess.get_inputs()):
        a = rng.random([d if isinstance(d, int) else 1 for d in inp.shape]).astype(np.float32)
        feed[inp.name] = a
        files.append(tmp_path / f"in{i}.npy")
        np.save(files[-1], a)
    return feed, files, dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))


def _check_outputs(outdir, ref):
    for name, want in ref.items():
        got = np.load(outdir / (name.replace("/", "_").replace(":", "_") + ".npy"))
        assert got.shape == want.shape and np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), name


def test_x86_bundle_runs_natively_and_embeds(cli, tiny_model, tiny_so, tmp_path):
    if not shutil.which("cmake"):
        pytest.skip("cmake not installed (`make toolchains` installs it)")
    bundle = tmp_path / "tiny-x86.tar.gz"
    r = cli("package", tiny_so, "-o", bundle, "--json")
    assert r.code == 0, r
    info = json.loads(r.out)
    root = _unpack(bundle, tmp_path / "x")
    assert root.name == "tiny-x86"
    assert {"run", "tiny.so", "lib/libtvm_runtime.so", "lib/libtvm_ffi.so", "include/deploytool_model.h",
            "example/CMakeLists.txt", "README.md", "bundle.json"} <= set(info["files"]) | {"bundle.json"}
    assert not [f for f in info["files"] if "compiler" in f]  # runtime only
    meta = json.loads((root / "bundle.json").read_text())
    assert meta["runtime_bytes"] < 8 * 2**20, meta  # a few MB plus the model
    # the runner: no Python involved (a clean environment, only the bundle's own lib/)
    feed, files, ref = _inputs(tmp_path, tiny_model)
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.run(["./run", "tiny.so", "--inputs", *map(str, files), "--outdir", str(out)], cwd=root,
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    _check_outputs(out, ref)
    d = subprocess.run(["./run", "tiny.so", "--describe"], cwd=root, capture_output=True, text=True)
    assert "input  in/img: float32[1, 3, 8, 8]" in d.stdout and "output out:gate: float32[1, 5]" in d.stdout
    bad = subprocess.run(["./run", "tiny.so", "--inputs", str(files[0])], cwd=root, capture_output=True, text=True)
    assert bad.returncode == 2 and "takes 2 input(s), got 1" in bad.stderr
    # the C++ embedding example, built with CMake against the bundle
    b = subprocess.run(["cmake", "-S", "example", "-B", "build"], cwd=root, capture_output=True, text=True)
    assert b.returncode == 0, b.stderr
    b = subprocess.run(["cmake", "--build", "build"], cwd=root, capture_output=True, text=True)
    assert b.returncode == 0, b.stdout + b.stderr
    e = subprocess.run(["./build/example", "tiny.so"], cwd=root, capture_output=True, text=True)
    assert e.returncode == 0, e.stderr
    import onnxruntime as ort

    pattern = {k: (np.arange(v.size) % 17 / 17.0).astype(np.float32).reshape(v.shape) for k, v in feed.items()}
    want = ort.InferenceSession(str(tiny_model)).run(None, pattern)
    for name, arr in zip(["out/logits", "out:gate"], want):
        line = [ln for ln in e.stdout.splitlines() if ln.startswith(f"output {name}:")][0]
        assert abs(float(line.split("sum ")[1].split(",")[0]) - float(arr.sum())) < 1e-4, (line, arr.sum())


def test_aarch64_bundle_runs_under_qemu(cli, tiny_model, tmp_path):
    for tool in ("aarch64-linux-gnu-g++", "qemu-aarch64"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} not installed (`make toolchains` installs it)")
    so = tmp_path / "tiny-arm.so"
    assert cli("compile", tiny_model, "--target", "arm", "-o", so, "-q").code == 0
    r = cli("package", so)
    assert r.code == 0 and "aarch64" in r.out, r
    root = _unpack(tmp_path / "tiny-arm-bundle.tar.gz", tmp_path / "x")
    assert "ARM aarch64" in subprocess.run(["file", root / "run"], capture_output=True, text=True).stdout
    assert "ARM aarch64" in subprocess.run(["file", root / "lib" / "libtvm_runtime.so"], capture_output=True,
                                           text=True).stdout
    feed, files, ref = _inputs(tmp_path, tiny_model)
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.run(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "./run", "tiny-arm.so", "--inputs",
                        *map(str, files), "--outdir", str(out)], cwd=root, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    _check_outputs(out, ref)


def test_runner_refuses_foreign_artifacts(cli, tiny_so, tmp_path):
    bundle = tmp_path / "b.tar.gz"
    assert cli("package", tiny_so, "-o", bundle, "-q").code == 0
    root = _unpack(bundle, tmp_path / "x")
    data = tiny_so.read_bytes()

    def variant(name, old, new):
        assert old in data, old
        (root / name).write_bytes(data.replace(old, new))  # same length: the ELF stays valid
        return subprocess.run(["./run", name, "--describe"], cwd=root, capture_output=True, text=True)

    import tvm

    v = tvm.__version__.encode()
    p = variant("oldtvm.so", b'"tvm_version":"' + v + b'"', b'"tvm_version":"' + v.replace(b"0.", b"9.", 1) + b'"')
    assert p.returncode == 2 and "was built with TVM 9." in p.stderr and "package it again" in p.stderr, p.stderr
    import deploytool

    feat = deploytool.metadata(tiny_so)["target"]["required_features"][0].encode()
    p = variant("cpu.so", b'"required_features":["' + feat + b'"', b'"required_features":["' + b"Z" * len(feat) + b'"')
    assert p.returncode == 2 and "needs CPU features this machine lacks: ZZ" in p.stderr, p.stderr
    p = variant("fmt.so", b'"format":"deploytool-artifact/1"', b'"format":"deploytool-artifact/9"')
    assert p.returncode == 2 and "artifact format 'deploytool-artifact/9'" in p.stderr, p.stderr
    (root / "notelf.so").write_text("hello")
    p = subprocess.run(["./run", "notelf.so", "--describe"], cwd=root, capture_output=True, text=True)
    assert p.returncode == 2 and "is not a shared library" in p.stderr
