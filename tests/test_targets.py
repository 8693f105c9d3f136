import json

import pytest

from deploytool import targets
from deploytool.errors import TargetError

pytestmark = pytest.mark.fast


def test_every_preset_loads_and_has_the_common_fields():
    names = targets.preset_names()
    for required in ("x86", "x86-avx2", "x86-avx512", "arm", "cuda", "cortex-m4", "cortex-m7"):
        assert required in names
    for n in names:
        t = targets.load(n)
        assert t.name == n
        assert t.artifact in ("so", "c-bundle")
        assert t.tvm["kind"] in ("llvm", "cuda", "c")
        assert t.device["kind"] in ("local", "rpc", "qemu-user", "qemu-system")
        assert "cc" in t.toolchain


def test_x86_detects_this_cpu_and_never_requires_a_flag_it_lacks():
    t = targets.load("x86")
    flags = targets.host_cpu_flags()
    assert t.tvm["mcpu"] not in ("native", "generic", "")
    assert t.num_cores == targets.physical_cores()
    assert set(t.required_features) <= flags
    assert targets.missing_features(t.required_features, t.arch) == []


def test_portable_presets_require_their_isa():
    assert {"avx2", "fma"} <= set(targets.load("x86-avx2").required_features)
    avx512 = targets.load("x86-avx512")
    assert {"avx512f", "avx512bw", "avx512vl"} <= set(avx512.required_features)
    assert avx512.vector_bits == 512 and targets.load("x86-avx2").vector_bits == 256
    assert targets.load("arm").vector_bits == 128


def test_missing_features_reads_cpuinfo():
    cpuinfo = "processor : 0\nflags : fpu sse4_2 avx avx2 fma\n"
    assert targets.missing_features(["avx2", "fma"], targets.host_arch(), cpuinfo) == []
    assert targets.missing_features(["avx512f", "avx2"], targets.host_arch(), cpuinfo) == ["avx512f"]
    assert targets.missing_features(["asimd"], "aarch64" if targets.host_arch() != "aarch64" else "x86_64") != []


def test_cpu_name_tells_cpu_generations_apart():
    """A VM's bare "AMD EPYC" is Zen 4 on one machine and Zen 5 on another: the x86 family and
    model numbers make them two machines in tuning logs (the first processor's numbers)."""
    zen = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {f}\nmodel\t\t: {m}\nmodel name\t: AMD EPYC\n" \
          "flags\t\t: fpu avx512f\n\nprocessor\t: 1\ncpu family\t: 99\nmodel\t\t: 9\nmodel name\t: Other\n"
    zen4, zen5 = targets.cpu_name(zen.format(f=25, m=17)), targets.cpu_name(zen.format(f=26, m=2))
    assert zen4 == "AMD EPYC (family 25 model 17)" and zen5 == "AMD EPYC (family 26 model 2)"
    from deploytool.tuninglog import _processor, device_name

    assert _processor(device_name({"cpu": zen5, "threads": 2})) == zen5
    board = "processor\t: 0\nBogoMIPS\t: 48.00\nCPU part\t: 0xd08\n\nHardware\t: BCM2835\nModel\t\t: Raspberry Pi 4\n"
    assert targets.cpu_name(board) == "Raspberry Pi 4"  # a board's model, after the processors' blocks


def test_unknown_target_names_the_choices():
    with pytest.raises(TargetError) as e:
        targets.load("x87")
    msg = str(e.value)
    assert "unknown target 'x87'" in msg and "x86-avx2" in msg and "\n" not in msg


def test_preset_from_a_json_file(tmp_path):
    p = tmp_path / "mybox.json"
    p.write_text(json.dumps({"name": "mybox", "family": "x86", "arch": "x86_64",
                             "tvm": {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}}))
    t = targets.load(str(p))
    assert t.name == "mybox" and "avx2" in t.required_features  # derived from the mcpu
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "bad", "family": "x86", "arch": "x86_64", "tvm": "llvm -mcpu=haswell"}))
    with pytest.raises(TargetError, match="TVM target dict"):
        targets.load(str(bad))


def test_peak_counts_full_width_fma_pipes_where_the_cpu_has_them():
    """The % of peak in benchmark tables: Zen 5 (family 26) runs AVX-512 on two full 512-bit FMA
    pipes (64 FP32 FLOP a cycle), Zen 4 (family 25) as two halves (32), AVX2-only machines 32."""
    from deploytool.benchmark import fma_flop_per_cycle

    amd = "vendor_id\t: AuthenticAMD\ncpu family\t: {f}\nflags\t\t: fpu avx2 {x}\n"
    assert fma_flop_per_cycle(amd.format(f=26, x="avx512f")) == 64
    assert fma_flop_per_cycle(amd.format(f=25, x="avx512f")) == 32
    assert fma_flop_per_cycle(amd.format(f=25, x="")) == 32
    intel = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nflags\t\t: fpu avx2 {x}\n"
    assert fma_flop_per_cycle(intel.format(x="avx512f amx_tile")) == 64
    assert fma_flop_per_cycle(intel.format(x="")) == 32
