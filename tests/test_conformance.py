"""ONNX conformance: every node test of onnx.backend.test through deploytool's import + compile + run
(deploytool/conformance.py), in shards that pytest-xdist spreads over its workers. A case that
fails must be listed, with its reason, in tests/conformance/expected_failures.json; a listed case
that passes must be taken off the list. Either way the shard fails, naming the cases.

Refresh the list after a coverage change: python tools/update_conformance.py (then review the diff).

Tiers: CI runs every case but the function-body expansions (``*_expanded``: the op's ONNX function
body, a graph of other ops that have cases of their own; 422 cases, a third of the time); the slow
tier (``make test-slow``) runs those. Both check against the same list.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.conformance

SHARDS = 6  # CI tier
SLOW_SHARDS = 2  # the expansions, slow tier
_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")
EXPECTED = Path(__file__).parent / "conformance" / "expected_failures.json"


def _shard(name: str) -> tuple[str, int]:
    if _EXPANDED.search(name):
        return "expanded", zlib.crc32(name.encode()) % SLOW_SHARDS
    return "node", zlib.crc32(name.encode()) % SHARDS


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    return json.loads(EXPECTED.read_text())["cases"]


@pytest.mark.parametrize("shard", [pytest.param(("node", i), id=f"node{i}") for i in range(SHARDS)]
                         + [pytest.param(("expanded", i), id=f"expanded{i}", marks=pytest.mark.slow)
                            for i in range(SLOW_SHARDS)])
def test_node_conformance(shard, expected):
    from deploytool import conformance

    names, _ = conformance.case_names()
    mine = [n for n in names if _shard(n) == shard]
    rep = conformance.run(names=mine, jobs=1)
    print(rep.summary())
    regressed = [f"{r.name} ({r.status}: {r.message[:120]})" for r in rep.results
                 if r.status != "pass" and r.name not in expected]
    fixed = [r.name for r in rep.results if r.status == "pass" and r.name in expected]
    assert not regressed, f"{len(regressed)} case(s) not on the expected-failure list fail:\n" + "\n".join(regressed)
    assert not fixed, (f"{len(fixed)} case(s) on the expected-failure list pass now: take them off "
                       f"(python tools/update_conformance.py):\n" + "\n".join(fixed))


def test_expected_failures_are_real_cases_with_reasons(expected):
    from deploytool import conformance

    names, skipped = conformance.case_names()
    unknown = sorted(set(expected) - set(names))
    assert not unknown, f"expected failures that are not (counted) cases: {unknown[:10]}"
    assert all(isinstance(v, str) and len(v) > 10 for v in expected.values())
    # CI leaves the expansions to the slow tier because the case each one expands runs in CI
    expansions = [n for n in names if _EXPANDED.search(n)]
    assert expansions and all(_EXPANDED.sub("", n) in names for n in expansions)
    # the left-out cases are exactly the categories
    assert set(skipped.values()) <= {"training op", "training operator", "string operator",
                                     "sequence value at the interface", "optional value at the interface",
                                     "map value at the interface", "string tensor at the interface"}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # onnx's case generators overflow casts on purpose
def test_onnx_backend_test_drives_deploytool():
    """onnx's own BackendTest runs a few node cases through DeploytoolBackend."""
    import unittest

    import onnx.backend.test

    from deploytool.onnx_backend import DeploytoolBackend

    bt = onnx.backend.test.BackendTest(DeploytoolBackend, __name__)
    bt.include(r"^test_(relu|add_bcast|conv_with_strides_padding|softmax_axis_1|gemm_default_scalar_bias)_cpu$")
    suite = unittest.TestSuite()
    for case in bt.test_cases.values():
        suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=0).run(suite)
    ran = result.testsRun - len(result.skipped)  # BackendTest skips every case not included
    assert ran == 5 and result.wasSuccessful(), result.failures + result.errors
