"""ARM boards over TVM RPC, on the emulated aarch64 board (qemu-user): cross-compiled models run and
check against onnxruntime on the board, tuning measures through RPC (directly and across a tracker's
farm), a board killed mid-tuning stops the run cleanly and the rerun resumes, a farm goes on when one
of its boards dies, and the NEON report reads the cross-compiled kernels."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO

pytestmark = [pytest.mark.arm, pytest.mark.xdist_group("arm")]

SQUEEZENET = REPO / "deploytool" / "data" / "squeezenet1.0.onnx"
# A tiny budget; measuring under emulation is slow, so short repeats.
FEW = ["--batch", "4", "--repeat", "2", "--min-repeat-ms", "2"]


def _need_toolchains():
    missing = [t for t in ("qemu-aarch64", "aarch64-linux-gnu-g++", "aarch64-linux-gnu-objdump", "apt-get", "dpkg-deb")
               if not shutil.which(t)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (`make toolchains` installs them)")


@pytest.fixture(scope="module")
def board():
    """One emulated aarch64 board serving RPC on loopback (the sysroot is built once and cached)."""
    _need_toolchains()
    from deploytool import emulator

    b = emulator.start("arm")
    yield b
    b.stop()


def _records(log) -> list[dict]:
    if not os.path.exists(log):
        return []
    out = []
    for line in open(log).read().splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if obj.get("type") == "record":
            out.append(obj)
    return out


def _wait_records(log, n, proc, timeout=300):
    t0 = time.time()
    while len(_records(log)) < n:
        assert proc.poll() is None, f"tuning ended early: {proc.stderr.read() if proc.stderr else ''}"
        assert time.time() - t0 < timeout, f"fewer than {n} records after {timeout} s"
        time.sleep(0.5)


def _tune_proc(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "deploytool", "tune", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# ----------------------------------------------------------------------------- fast: failures without a board
@pytest.mark.fast
def test_tune_arm_needs_a_board(cli, tiny_model, tmp_path):
    r = cli("tune", tiny_model, "--target", "arm", "-o", tmp_path / "x.jsonl")
    assert r.code == 2, r
    assert "--rpc" in r.err and "device emulate arm" in r.err and r.err.count("\n") == 1
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.fast
def test_unreachable_board_and_tracker(cli, tiny_model, tiny_so, tmp_path):
    from deploytool.emulator import free_port

    port = free_port()
    r = cli("tune", tiny_model, "--target", "arm", "--rpc", f"127.0.0.1:{port}", "-o", tmp_path / "x.jsonl")
    assert r.code == 2 and f"cannot reach a board at 127.0.0.1:{port}" in r.err and "device serve" in r.err, r
    r = cli("run", tiny_so, "--tracker", f"127.0.0.1:{port}", "--key", "rpi4")
    assert r.code == 2 and f"cannot reach the RPC tracker at 127.0.0.1:{port}" in r.err, r
    r = cli("run", tiny_so, "--tracker", f"127.0.0.1:{port}")
    assert r.code == 2 and "--tracker needs --key" in r.err, r
    r = cli("bench", tiny_so, "--rpc", "board:99999")
    assert r.code == 2 and "is not HOST:PORT" in r.err, r


@pytest.mark.fast
def test_serve_warns_when_not_on_loopback(tmp_path):
    """The RPC server runs whatever is uploaded: binding beyond loopback says so."""
    from deploytool.emulator import free_port

    port = free_port("0.0.0.0")
    p = subprocess.Popen([sys.executable, "-m", "deploytool", "device", "serve", "--host", "0.0.0.0", "--port",
                          str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        first, second = p.stdout.readline(), p.stdout.readline()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert first.startswith("warning: binding to 0.0.0.0") and "executes whatever is uploaded" in first
    assert second.startswith(f"serving on 0.0.0.0:{port}")


@pytest.mark.fast
def test_tracker_lists_boards_and_refuses_unknown_key(cli, tiny_model, tmp_path):
    from deploytool import device
    from deploytool.emulator import free_port

    tport, bport = free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "deploytool", "tracker", "--port", str(tport)],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)]
    try:
        assert procs[0].stdout.readline().startswith(f"tracker on 127.0.0.1:{tport}")
        procs.append(subprocess.Popen([sys.executable, "-m", "deploytool", "device", "serve", "--port", str(bport),
                                       "--tracker", f"127.0.0.1:{tport}", "--key", "x86box"],
                                      stdout=subprocess.PIPE, text=True, start_new_session=True))
        assert "registered at tracker" in procs[1].stdout.readline()
        for _ in range(40):
            rows = device.list_devices(f"127.0.0.1:{tport}")
            if rows and rows[0]["free"]:
                break
            time.sleep(0.25)
        assert rows == [{"key": "x86box", "registered": 1, "free": 1, "pending": 0, "addresses": [f"127.0.0.1:{bport}"]}]
        r = cli("device", "list", "--tracker", f"127.0.0.1:{tport}")
        assert r.code == 0 and "x86box" in r.out and "1 registered, 1 free" in r.out, r
        r = cli("tune", tiny_model, "--target", "arm", "--tracker", f"127.0.0.1:{tport}", "--key", "rpi4",
                "-o", tmp_path / "x.jsonl")
        assert r.code == 2 and "no board is registered under key 'rpi4'" in r.err, r
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


# ----------------------------------------------------------------------------- on the emulated board
def test_compile_for_arm_and_check_on_the_board(cli, board, tmp_path):
    so = tmp_path / "squeezenet-arm.so"
    r = cli("compile", SQUEEZENET, "--target", "arm", "-o", so, "-q")
    assert r.code == 0, r
    assert subprocess.run(["file", so], capture_output=True, text=True).stdout.count("ARM aarch64") == 1
    r = cli("run", so, "--check", SQUEEZENET, "--device", board.address)
    assert r.code == 0 and "check passed" in r.out, r
    r = cli("bench", so, "--rpc", board.address, "--repeats", "2", "--warmup", "1")
    assert r.code == 0 and f"on board {board.address}" in r.out and "is emulated" in r.err, r
    r = cli("run", so)  # not on this x86 machine
    assert r.code == 2 and "built for aarch64" in r.err and "--device" in r.err, r


def test_neon_report(cli, tmp_path):
    """The default schedules vectorize for ARM: every conv/matmul kernel has NEON vector FMAs."""
    _need_toolchains()
    from deploytool import simd
    from deploytool.zoo import ds_cnn_1d
    import onnx

    model = tmp_path / "ds_cnn.onnx"
    onnx.save(ds_cnn_1d(), model)
    for m in (SQUEEZENET, model):
        so = tmp_path / f"{m.stem}-arm.so"
        assert cli("compile", m, "--target", "arm", "-o", so, "-q").code == 0
        arch, kernels = simd.report(so)
        dense = [k for k in kernels if simd.is_dense(k.name)]
        assert arch == "aarch64" and dense
        assert all(k.vector_fma > 0 and k.widest_bits >= 64 for k in dense), [k.to_dict() for k in dense]
        r = cli("simd", so, "--require-vector")
        assert r.code == 0 and f"{len(dense)} of {len(dense)} conv/matmul kernels use NEON" in r.out, r


def test_tune_through_rpc_then_replay_on_the_board(cli, board, tiny_model, tmp_path):
    log = tmp_path / "tiny-arm.jsonl"
    r = cli("tune", tiny_model, "--target", "arm", "--rpc", board.address, "--trials-per-task", "4", *FEW,
            "-o", log, "--json")
    assert r.code == 0, r
    summary = json.loads(r.out)
    assert summary["trials_new"] > 0
    header = json.loads(log.read_text().splitlines()[0])
    assert header["emulated"] == "qemu-aarch64" and header["device"]["arch"] == "aarch64"
    assert header["device"]["kind"] == "rpc" and header["device"]["port"] == board.port
    recs = _records(log)
    assert recs and all(r_["latency_s"] or r_["error"] for r_ in recs)
    assert sum(1 for r_ in recs if r_["latency_s"]) >= len(recs) // 2
    # emulated timings are not for shipping
    r = cli("logs", "check", log, tiny_model, "--target", "arm")
    assert r.code == 2 and "emulated board" in r.err and "--allow-emulated" in r.err, r
    assert cli("logs", "check", log, tiny_model, "--target", "arm", "--allow-emulated").code == 0
    # replay: a tuned aarch64 build that checks against onnxruntime on the board
    so = tmp_path / "tiny-arm.so"
    r = cli("compile", tiny_model, "--target", "arm", "--tuning-log", log, "--require-tuned", "-o", so)
    assert r.code == 0 and "emulated board" in r.err, r
    r = cli("run", so, "--check", tiny_model, "--rpc", board.address)
    assert r.code == 0 and "check passed" in r.out, r


def test_board_killed_mid_tuning_then_resume(tmp_path, tiny_model):
    """The only board dies: the run stops with one line, the log keeps every record, and rerunning
    the same command (board back) resumes without measuring anything twice."""
    _need_toolchains()
    from deploytool import emulator

    log = tmp_path / "tiny-arm.jsonl"
    b = emulator.start("arm")
    # 6 kernels: 6 default records, then search; the board dies past the first search batch
    args = [tiny_model, "--target", "arm", "--rpc", b.address, "--trials", "14", "--trials-per-task", "14",
            "--early-stop", "0", *FEW, "-o", log, "-q"]
    p = _tune_proc(*args)
    try:
        _wait_records(log, 10, p)
        b.stop()
        out, err = p.communicate(timeout=120)
    finally:
        b.stop()
        if p.poll() is None:
            p.kill()
    assert p.returncode == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("deploytool: error")]
    assert len(lines) == 1 and "lost every board" in lines[0] and "rerun the same command" in lines[0], err
    before = _records(log)
    assert len(before) >= 10
    b2 = emulator.start("arm", port=b.port)
    try:
        p = _tune_proc(*args[:-1])
        out, err = p.communicate(timeout=600)
    finally:
        b2.stop()
    assert p.returncode == 0, err
    after = _records(log)
    assert after[:len(before)] == before  # append-only
    cands = [r["candidate"] for r in after]
    assert len(cands) == len(set(cands)), "a candidate was measured twice"
    searched = sum(1 for r in after if r["source"] == "search")
    assert searched >= 12 and searched > sum(1 for r in before if r["source"] == "search")


@pytest.mark.slow  # 130-150 s in CI's tier (two emulated boards, ~25 s each to start): CI time; `make test-slow`
def test_farm_goes_on_when_a_board_dies(tmp_path, tiny_model):
    """Two boards under one key at a tracker: tuning spreads over both; one dies mid-run; its
    candidate is measured again on the other and the run finishes."""
    _need_toolchains()
    from deploytool import device, emulator

    tport = emulator.free_port()
    tracker = subprocess.Popen([sys.executable, "-m", "deploytool", "tracker", "--port", str(tport)],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    boards = []
    log = tmp_path / "tiny-farm.jsonl"
    try:
        assert tracker.stdout.readline().startswith("tracker on")
        boards = [emulator.start("arm", tracker=f"127.0.0.1:{tport}", key="pi") for _ in range(2)]
        for _ in range(40):
            if device.tracker_free(device.parse(tracker=f"127.0.0.1:{tport}", key="pi")) == (2, 2):
                break
            time.sleep(0.5)
        p = _tune_proc(tiny_model, "--target", "arm", "--tracker", f"127.0.0.1:{tport}", "--key", "pi",
                       "--trials", "24", "--trials-per-task", "24", "--early-stop", "0", *FEW, "-o", log)
        _wait_records(log, 14, p)
        boards[0].stop()
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        assert "measuring on 2 boards under key 'pi'" in err and f"board 127.0.0.1:{boards[0].port} lost" in err, err
        recs = _records(log)
        assert sum(1 for r in recs if r["source"] == "search") >= 16  # well past the 14 records at the loss
        assert not [r for r in recs if r["error"] and "session" in r["error"]], "a candidate was not measured again"
        header = json.loads(log.read_text().splitlines()[0])
        assert header["device"]["boards"] == 2 and header["device"]["key"] == "pi"
    finally:
        for b in boards:
            b.stop()
        os.killpg(tracker.pid, signal.SIGKILL)
        tracker.wait()


@pytest.mark.parametrize("preset,elf", [("arm-cortex-a53", "ARM aarch64"), ("arm-cortex-a55", "ARM aarch64"),
                                        ("arm-cortex-a76", "ARM aarch64"), ("arm-neoverse-n1", "ARM aarch64"),
                                        ("armv7", "32-bit LSB shared object, ARM, EABI5")])
def test_arm_variants_cross_compile_and_vectorize(cli, tiny_model, tmp_path, preset, elf):
    from deploytool import simd, targets

    t = targets.load(preset)
    if not shutil.which(t.toolchain["cc"]):
        pytest.skip(f"{t.toolchain['cc']} not installed (`make toolchains` installs it)")
    so = tmp_path / f"tiny-{preset}.so"
    r = cli("compile", tiny_model, "--target", preset, "-o", so, "-q")
    assert r.code == 0, r
    assert elf in subprocess.run(["file", so], capture_output=True, text=True).stdout
    meta = json.loads(cli("metadata", so).out)
    assert meta["target"]["name"] == preset and set(t.required_features) <= set(meta["target"]["required_features"])
    _, kernels = simd.report(so)
    conv = [k for k in kernels if "conv" in k.name]
    assert conv and all(k.vector_fma and k.widest_bits == 128 for k in conv), [k.to_dict() for k in conv]
