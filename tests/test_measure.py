"""How candidates are timed on this machine: the cold-cache hook between timed calls."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.fast


def _add_kernel(n: int):
    import tvm
    from tvm import te

    a, w = te.placeholder((n,), name="a"), te.placeholder((n,), name="w")
    c = te.compute((n,), lambda i: a[i] + w[i], name="c")
    mod = tvm.IRModule({"main": te.create_prim_func([a, w, c])})
    return tvm.tirx.build(mod, target=tvm.target.Target({"kind": "llvm"}))


def test_cpuinfo_flag(tmp_path):
    from deploytool import cpuflush

    with_opt, without = tmp_path / "a", tmp_path / "b"
    with_opt.write_text("processor\t: 0\nflags\t\t: fpu sse2 clflush clflushopt avx2\n")
    without.write_text("processor\t: 0\nflags\t\t: fpu sse2 clflush avx2\n")
    assert cpuflush.has_clflushopt(str(with_opt)) and not cpuflush.has_clflushopt(str(without))
    assert not cpuflush.has_clflushopt(str(tmp_path / "missing"))


def test_cold_timing_runs_the_hook_before_every_call_and_keeps_the_data():
    """time_cpu calls the flush hook once per timed call (repeat x COLD_CALLS), deploytool's own
    CLFLUSHOPT hook where the CPU has the instruction (TVM's CLFLUSH hook elsewhere), and flushing
    leaves every argument's contents as they were."""
    import tvm

    from deploytool import cpuflush, measure

    n = 1 << 16
    lib = _add_kernel(n)
    rng = np.random.default_rng(0)
    host = [rng.uniform(-1, 1, n).astype("float32") for _ in range(2)]
    ts = [tvm.runtime.tensor(x) for x in host] + [tvm.runtime.empty((n,), "float32")]
    settings = {"cache_flush": True, "repeat": 2, "number": 1, "min_repeat_ms": 0}

    calls = []
    tvm.register_global_func("deploytool.test.count_flush", lambda *args: calls.append(len(args)) and None,
                             override=True)
    lat = measure.time_cpu(lib, "main", tvm.cpu(), ts, settings, "deploytool.test.count_flush")
    assert len(lat) == 2 and min(lat) > 0
    assert calls == [3] * (2 * measure.COLD_CALLS)  # the hook sees the call's three arguments

    hook = cpuflush.hook_for(ts)
    assert hook == (cpuflush.HOOK if cpuflush.has_clflushopt() else cpuflush.TVM_HOOK)
    lat = measure.time_cpu(lib, "main", tvm.cpu(), ts, settings, hook)
    assert len(lat) == 2 and min(lat) > 0
    np.testing.assert_array_equal(ts[0].numpy(), host[0])
    np.testing.assert_array_equal(ts[1].numpy(), host[1])
    np.testing.assert_allclose(ts[2].numpy(), host[0] + host[1], rtol=1e-6)


@pytest.mark.skipif(not __import__("deploytool.cpuflush").cpuflush.has_clflushopt(), reason="no CLFLUSHOPT here")
def test_flush_helper_is_built_once_into_the_cache(tmp_path):
    from deploytool import cpuflush

    first = cpuflush._compile(tmp_path)
    assert first is not None and first.parent == tmp_path and first.suffix == ".so"
    mtime = first.stat().st_mtime_ns
    assert cpuflush._compile(tmp_path) == first and first.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left behind
