"""Rerun the ONNX node conformance and rewrite tests/conformance/expected_failures.json:
every failing case with the reason deploytool.conformance.reason gives it. Review the diff.

    python tools/update_conformance.py [--jobs N]
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from deploytool import conformance

p = argparse.ArgumentParser()
p.add_argument("--jobs", type=int)
p.add_argument("--from-json", help="use a report written by `python -m deploytool.conformance --json`")
a = p.parse_args()
if a.from_json:
    d = json.loads(Path(a.from_json).read_text())
    results = [conformance.CaseResult(**r) for r in d["results"]]
    summary = json.dumps(d["counts"])
else:
    rep = conformance.run(jobs=a.jobs)
    results, summary = rep.results, rep.summary()
fails = {r.name: conformance.reason(r) for r in results if r.status != "pass"}
out = Path(__file__).resolve().parents[1] / "tests" / "conformance" / "expected_failures.json"
doc = {"about": "ONNX node tests (onnx.backend.test) deploytool fails today, each with its reason; "
                "tests/test_conformance.py fails when a case not listed here fails or a listed one passes. "
                "Regenerate with tools/update_conformance.py and review the diff.",
       "passing": sum(1 for r in results if r.status == "pass"), "counted": len(results),
       "by_reason": dict(Counter(fails.values()).most_common()),
       "cases": dict(sorted(fails.items()))}
out.write_text(json.dumps(doc, indent=1) + "\n")
print(summary, file=sys.stderr)
print(f"wrote {out}: {len(fails)} expected failures, {doc['passing']} of {doc['counted']} pass")
