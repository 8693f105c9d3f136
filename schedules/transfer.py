"""Schedules carried over from other models' kernels: a pretrained schedule library.

A cost model pretrained on other models ranks a new kernel's candidates from their features; what
it cannot do is propose the tilings that won on kernels like it. The tuning logs it learned from
hold those too: the best traces of every kernel. This module keeps them, compactly, and adapts
them to a new kernel:

* **Which kernels are alike.** Two kernels whose design spaces are the same program of schedule
  instructions (the same blocks, loops, rules and literal arguments: BERT-base's FFN matmul with
  its bias and GELU and the MiniLM-size encoder's) differ only in their loop extents, which the
  sampled tile sizes multiply to. Each trace is keyed by that program (``skeleton``, the trace up
  to its post-processing, decisions left out).
* **Adapting a trace.** Every sampled decision is kept, except tile sizes: each split keeps the
  donor's inner factors where they divide the new extent, shrunk to the nearest divisor where not,
  and its outer factor takes the rest (``adapt_tile``). A 4 x 64 register tile of a 1,536-wide
  matmul stays a 4 x 64 tile of a 3,072-wide one, with twice the outer blocks.
* **Which donors.** Kernels of the same program, nearest first by their extents (sum of
  |log(extent ratio)|), their best traces interleaved: the nearest kernel's best, the next one's
  best, then the second bests.

``tune`` measures a kernel's adapted donors in its first round, beside the cost model's own top
picks (``--schedule-library``); they enter the search's database like any measured record, so the
evolutionary search mutates the good ones. The library is built from tuning logs of one target
family (``python -m deploytool.cost_model.pretrain schedules``), leaving out models as the cost
model's training does (held-out benchmarks must leave the model out of both).

This module knows nothing of logs, the cost model or the CLI.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from deploytool.schedules.cpu import _divisor_at_most

FORMAT = "deploytool-schedule-library"
VERSION = 1
TILE = "SamplePerfectTile"
POSTPROC = "EnterPostproc"


def search_part(trace_json) -> tuple[list, list]:
    """(instructions, decisions) of a JSON trace up to its post-processing."""
    insts, decisions = trace_json[0], trace_json[1] if len(trace_json) > 1 else []
    end = next((i for i, inst in enumerate(insts) if inst[0] == POSTPROC), len(insts))
    return list(insts[:end]), [list(d) for d in decisions if d[0] < end]


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def skeleton(insts) -> str:
    """The key of a trace's program: its instructions (kind, inputs, attributes, outputs), hashed."""
    return _h(json.dumps(insts, separators=(",", ":")))


def decision_keys(insts, decisions) -> dict[int, str]:
    """Each decision's place in the program, independent of the instructions around it: the
    instruction's kind and attributes and, recursively, what its inputs are (a block by its name, a
    loop as the n-th loop of such a block, ...), numbered where several are alike. A tile size of
    loop 2 of block "matmul" keys the same in BERT's FFN kernel, whose epilogue inlines a bias and
    a residual, as in one that inlines the bias only."""
    var: dict[str, str] = {}
    seen: dict[str, int] = {}
    has = {i for i, _ in decisions}
    out = {}
    for i, (kind, inputs, attrs, outputs) in enumerate(insts):
        ins = [var.get(x, x) if isinstance(x, str) else x for x in inputs]
        base = _h(json.dumps([kind, ins, attrs], separators=(",", ":")))
        n = seen[base] = seen.get(base, 0) + 1
        for j, o in enumerate(outputs):
            var[o] = f"{base}.{n}#{j}"
        if i in has:
            out[i] = f"{kind}:{base}.{n}"
    return out


def signature(insts, decisions) -> str:
    """The key donors are filed under: the places of the program's tile sizes (``decision_keys``).
    Kernels of one signature tile the same loops of the same blocks the same way."""
    keys = decision_keys(insts, decisions)
    return _h(json.dumps(sorted(k for i, k in keys.items() if insts[i][0] == TILE)))


def extents(insts, decisions) -> list[int]:
    """The loop extents a trace tiles (the product of each tile-size decision), in the order of
    their ``decision_keys``."""
    keys = decision_keys(insts, decisions)
    return [math.prod(d) for k, d in sorted((keys[i], d) for i, d in decisions if insts[i][0] == TILE)]


def adapt_tile(factors: list[int], extent: int) -> list[int]:
    """A tile-size decision moved to a loop of ``extent``: inner factors kept (innermost first, each
    shrunk to the largest divisor of what is left where it does not divide it), the outer factor
    the rest. ``adapt_tile([1, 32, 1, 4], 128) == [1, 32, 1, 4]``, ``adapt_tile([6, 1, 1, 64], 768)
    == [12, 1, 1, 64]``, ``adapt_tile([8, 24], 20) == [1, 20]``."""
    left, inner = extent, []
    for f in reversed(factors[1:]):
        d = _divisor_at_most(left, f)
        inner.append(d)
        left //= d
    return [left] + inner[::-1]


def adapt(insts, decisions, donor_insts, donor_decisions) -> list:
    """A kernel's design-space trace (``insts``, its sampled ``decisions``) taking a donor's
    decisions wherever the donor has one at the same place (``decision_keys``), tile sizes moved to
    this kernel's extents; its other decisions stay as sampled."""
    mine = decision_keys(insts, decisions)
    keys = decision_keys(donor_insts, donor_decisions)
    theirs = {keys[i]: d for i, d in donor_decisions}
    out = []
    for i, d in decisions:
        got = theirs.get(mine.get(i))
        if got is not None:
            if insts[i][0] == TILE:
                got = adapt_tile(list(got), math.prod(d)) if len(got) == len(d) else d
            d = got
        out.append([i, d])
    return out


def distance(a: list[int], b: list[int]) -> float:
    """How far two kernels' extents are: sum of |log(ratio)|."""
    return sum(abs(math.log(x / y)) for x, y in zip(a, b)) if len(a) == len(b) else math.inf


@dataclass
class Donor:
    """One kernel's best traces of one ``signature``: (program key, decisions), best first."""
    model: str
    workload: str
    name: str
    extents: list[int]
    traces: list[list] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # their latencies (on the machine that logged them)


@dataclass
class ScheduleLibrary:
    family: str
    programs: dict[str, list] = field(default_factory=dict)        # skeleton -> instructions
    donors: dict[str, list[Donor]] = field(default_factory=dict)   # signature -> donors
    models: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)

    def add(self, model: str, workload: str, name: str, traces: list, seconds: list[float], top: int = 4) -> None:
        """A kernel's traces (JSON, best first) as donors, ``top`` per signature."""
        per: dict[str, Donor] = {}
        for tr, s in zip(traces, seconds):
            insts, dec = search_part(tr)
            if not any(insts[i][0] == TILE for i, _ in dec):
                continue  # tiles nothing: no structure to carry over
            sig, prog = signature(insts, dec), skeleton(insts)
            d = per.get(sig)
            if d is None:
                d = per[sig] = Donor(model, workload, name, extents(insts, dec))
                self.donors.setdefault(sig, []).append(d)
            if len(d.traces) < top and [prog, dec] not in d.traces:
                self.programs.setdefault(prog, insts)
                d.traces.append([prog, dec])
                d.seconds.append(float(s))
        if model not in self.models:
            self.models.append(model)

    def traces_for(self, space_traces: list, k: int, nearest: int = 3) -> list:
        """Up to ``k`` JSON traces (search part only) for a kernel whose design spaces' traces (JSON,
        with their sampled decisions) are ``space_traces``: each space of a signature the library
        has, taking the decisions of the ``nearest`` donors of that signature by extents (``adapt``),
        their best traces interleaved; spaces in their order."""
        out, seen = [], set()
        for sp in space_traces:
            insts, dec = search_part(sp)
            sig = signature(insts, dec)
            if sig not in self.donors or not any(insts[i][0] == TILE for i, _ in dec):
                continue  # a space that tiles nothing: no structure to carry over
            mine = extents(insts, dec)
            near = sorted(self.donors[sig], key=lambda d: distance(mine, d.extents))[:nearest]
            for rank in range(max((len(d.traces) for d in near), default=0)):
                for d in near:
                    if rank < len(d.traces):
                        prog, theirs = d.traces[rank]
                        new = adapt(insts, dec, self.programs[prog], theirs)
                        key = json.dumps(new)
                        if key not in seen:
                            seen.add(key)
                            out.append([insts, new])
                            if len(out) >= k:
                                return out
        return out

    def __len__(self) -> int:
        return len({(d.model, d.workload) for v in self.donors.values() for d in v})

    def save(self, path: str | Path) -> None:
        doc = {"format": FORMAT, "version": VERSION, "family": self.family, "models": sorted(self.models),
               "excluded": sorted(self.excluded), "programs": self.programs,
               "donors": {k: [vars(d) for d in v] for k, v in self.donors.items()}}
        text = json.dumps(doc, separators=(",", ":"))
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.suffix == ".gz":
            with gzip.open(p, "wt", compresslevel=9) as f:
                f.write(text)
        else:
            p.write_text(text)

    @classmethod
    def load(cls, path: str | Path) -> ScheduleLibrary:
        p = Path(path)
        with (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)) as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ValueError(f"{p} is not a deploytool schedule library (version {VERSION})")
        return cls(family=doc["family"], programs=doc["programs"],
                   donors={k: [Donor(**d) for d in v] for k, v in doc["donors"].items()},
                   models=doc["models"], excluded=doc["excluded"])
