"""C bundles for microcontrollers: kernels from TVM's C code generator, an ahead-of-time executor
generated here, weights as const arrays, and ONE static arena planned by liveness.

    out/
      model.h          the API: model_run(inputs, outputs), names/shapes/sizes as compile-time constants
      model.c          the AOT executor: calls the kernels in order; no interpreter, no malloc
      kernels.c        TVM's C output (packed-signature functions; asserts compiled out)
      weights.c        every constant as a const array (flash)
      runtime.c        the shim: a LIFO workspace allocator inside the arena, and TVM's error hook
      include/         the few TVM / tvm-ffi / DLPack headers the sources include
      Makefile         builds libmodel.a with the target's arm-none-eabi-gcc flags (or CC=gcc for the host)
      memory_plan.json every arena buffer (offset, size, lifetime), the lower bound, the footprint

The arena holds every intermediate tensor and every kernel's workspace. Its layout is planned
from lifetimes (greedy by size, each buffer at the lowest offset that no overlapping-lifetime
buffer occupies): the lower bound is the largest number of bytes live at any one step (tensors plus
that step's workspace). Inputs and outputs live in the caller's buffers, never copied.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deploytool.errors import BuildError

ALIGN = 16
_HEADERS = {  # file in the bundle's include/ -> (package, path inside its include dir)
    "tvm/ffi/c_api.h": ("tvm_ffi", "tvm/ffi/c_api.h"),
    "tvm/ffi/extra/c_env_api.h": ("tvm_ffi", "tvm/ffi/extra/c_env_api.h"),
    "dlpack/dlpack.h": ("tvm_ffi", "dlpack/dlpack.h"),
    "tvm/runtime/base.h": ("tvm", "tvm/runtime/base.h"),
    "tvm/runtime/c_backend_api.h": ("tvm", "tvm/runtime/c_backend_api.h"),
}


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


# ----------------------------------------------------------------------------- memory planning
@dataclass
class Buffer:
    name: str
    nbytes: int          # aligned
    first: int           # step that writes it
    last: int            # last step that reads it
    kind: str = "tensor"  # or "workspace"
    offset: int = -1

    def overlaps(self, other: "Buffer") -> bool:
        return not (self.last < other.first or other.last < self.first)


@dataclass
class MemoryPlan:
    buffers: list[Buffer]
    arena_bytes: int
    lower_bound: int
    peak_step: int

    @property
    def ratio(self) -> float:
        return self.arena_bytes / self.lower_bound if self.lower_bound else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"arena_bytes": self.arena_bytes, "lower_bound": self.lower_bound, "peak_step": self.peak_step,
                "ratio": round(self.ratio, 4), "buffers": [asdict(b) for b in self.buffers]}


def lower_bound(buffers: list[Buffer]) -> tuple[int, int]:
    """(bytes, step): the most bytes live at any one step."""
    steps = {s for b in buffers for s in (b.first, b.last)}
    best = (0, 0)
    for s in sorted(steps):
        live = sum(b.nbytes for b in buffers if b.first <= s <= b.last)
        if live > best[0]:
            best = (live, s)
    return best


def plan_memory(buffers: list[Buffer]) -> MemoryPlan:
    """Offsets for every buffer: largest first, each at the lowest offset where it fits between the
    buffers already placed whose lifetimes overlap its own (best fit among the gaps)."""
    placed: list[Buffer] = []
    for b in sorted(buffers, key=lambda x: (-x.nbytes, x.first)):
        conflicts = sorted((p for p in placed if p.overlaps(b)), key=lambda p: p.offset)
        best_off, best_gap, cur = None, None, 0
        for p in conflicts:
            gap = p.offset - cur
            if gap >= b.nbytes and (best_gap is None or gap < best_gap):
                best_off, best_gap = cur, gap
            cur = max(cur, p.offset + p.nbytes)
        b.offset = best_off if best_off is not None else cur
        placed.append(b)
    arena = max((b.offset + b.nbytes for b in buffers), default=0)
    lb, step = lower_bound(buffers)
    return MemoryPlan(sorted(buffers, key=lambda x: (x.first, x.offset)), arena, lb, step)


# ----------------------------------------------------------------------------- the graph
@dataclass
class Tensor:
    name: str            # C identifier
    shape: tuple[int, ...]
    dtype: str
    role: str            # input | output | weight | arena
    index: int = -1      # input/output position, weight number
    data: Any = None     # weights: the numpy array

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class Step:
    kernel: str
    args: list[str]       # tensor names, inputs first then outputs
    workspace: int = 0


@dataclass
class Graph:
    tensors: dict[str, Tensor] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


def _sinfo(s) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of a relax TensorType (TVM 0.27 calls struct info "types")."""
    return tuple(int(d) for d in s.shape), str(s.dtype)


def extract_graph(mod) -> Graph:
    """The kernels of ``main`` in order, with every tensor they touch."""
    import tvm
    from tvm import relax

    E = tvm.ir.expr  # TVM 0.27 keeps relax's expression classes here
    Constant, Var, Call = E.Constant, E.Var, E.Call
    Tuple, TupleGetItem = getattr(E, "Tuple", relax.Tuple), getattr(E, "TupleGetItem", relax.TupleGetItem)
    call_tir = tvm.ir.Op.get("relax.call_tir")
    main = mod["main"]
    g = Graph()
    alias: dict[Any, str] = {}
    for i, p in enumerate(main.params):
        shape, dtype = _sinfo(p.ty)
        g.tensors[f"in{i}"] = Tensor(f"in{i}", shape, dtype, "input", i)
        alias[p] = f"in{i}"
    consts: dict[int, str] = {}
    consts_obj: dict[int, Any] = {}

    def ref(e) -> str:
        if isinstance(e, Constant):
            # keyed by the TVM object (hash: its handle), kept alive in the table: id() of the Python
            # wrapper would be reused by the next temporary and merge different constants
            key = hash(e)
            if key in consts and not consts_obj[key].same_as(e):
                raise BuildError("two constants share a key in the C bundle", "report it")
            consts_obj.setdefault(key, e)
            if key not in consts:
                arr = (e.value if hasattr(e, "value") else e.data).numpy()
                name = f"w{len(consts)}"
                consts[key] = name
                g.tensors[name] = Tensor(name, tuple(arr.shape), str(arr.dtype), "weight", len(consts) - 1, arr)
            return consts[key]
        if e in alias:
            return alias[e]
        raise BuildError(f"the C bundle can't pass '{type(e).__name__}' to a kernel",
                         "report it with the model attached")

    body = main.body
    blocks = body.blocks if isinstance(body, relax.SeqExpr) else []
    for block in blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, Call) and v.op == call_tir:
                outs = v.ty_args[0]
                out_list = list(outs.fields) if isinstance(outs, relax.TupleType) else [outs]
                names = []
                for o in out_list:
                    shape, dtype = _sinfo(o)
                    name = f"t{len(g.tensors)}"
                    g.tensors[name] = Tensor(name, shape, dtype, "arena")
                    names.append(name)
                g.steps.append(Step(v.args[0].name_hint, [ref(a) for a in v.args[1].fields] + names))
                alias[b.var] = names[0] if len(names) == 1 else names  # type: ignore[assignment]
            elif isinstance(v, Var) and v in alias:
                alias[b.var] = alias[v]
            elif isinstance(v, Tuple):
                alias[b.var] = [ref(f) for f in v.fields]  # type: ignore[assignment]
            elif isinstance(v, TupleGetItem) and v.tuple_value in alias:
                alias[b.var] = alias[v.tuple_value][v.index]  # type: ignore[index]
            else:
                raise BuildError(f"the C bundle has no executor step for '{v.op if isinstance(v, Call) else type(v).__name__}'",
                                 "report it with the model attached")
    ret = body.body if isinstance(body, relax.SeqExpr) else body
    outs = alias.get(ret, None) if not isinstance(ret, Tuple) else [ref(f) for f in ret.fields]
    if outs is None:
        raise BuildError("the model's outputs could not be traced in the C bundle", "report it with the model attached")
    g.outputs = outs if isinstance(outs, list) else [outs]
    for i, name in enumerate(g.outputs):
        t = g.tensors[name]
        if t.role == "arena":
            t.role, t.index = "output", i
    return g


def kernel_workspaces(c_source: str) -> dict[str, int]:
    """Per kernel, the bytes of workspace its generated C asks for (TVMBackendAllocWorkspace calls,
    aligned as the shim allocates them; all of them live at once: a safe bound for LIFO use)."""
    out: dict[str, int] = {}
    current = None
    for line in c_source.splitlines():
        m = re.match(r"^TVM_DLL int32_t __tvm_ffi_(\w+)\(.*\{$", line)
        if m:
            current = m.group(1)
            out[current] = 0
            continue
        if current:
            for size in re.findall(r"TVMBackendAllocWorkspace\(\d+, \w+, \(uint64_t\)(\d+)", line):
                out[current] += _align(int(size))
    return out


def arena_buffers(g: Graph) -> list[Buffer]:
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for s, step in enumerate(g.steps):
        for a in step.args:
            first.setdefault(a, s)
            last[a] = s
    bufs = [Buffer(n, _align(t.nbytes), first[n], last[n]) for n, t in g.tensors.items()
            if t.role == "arena" and n in first]
    bufs += [Buffer(f"ws{s}", st.workspace, s, s, "workspace") for s, st in enumerate(g.steps) if st.workspace]
    return bufs


# ----------------------------------------------------------------------------- code generation
_DL = {"float": 2, "int": 0, "uint": 1, "bool": 1}


def _dl_dtype(dtype: str) -> tuple[int, int]:
    if dtype == "bool":
        return 1, 8
    m = re.match(r"([a-z]+)(\d+)$", dtype)
    return _DL[m.group(1)], int(m.group(2))


def _c_type(dtype: str) -> str:
    return {"float32": "float", "float64": "double", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t",
            "int32": "int32_t", "int64": "int64_t", "bool": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
            "uint64": "uint64_t"}.get(dtype, "uint8_t")


def _weights_c(g: Graph) -> str:
    lines = ["/* The model's constants, in flash. Generated by deploytool; do not edit. */", "#include <stdint.h>", ""]
    for t in g.tensors.values():
        if t.role != "weight":
            continue
        flat = np.ascontiguousarray(t.data).reshape(-1)
        if t.dtype == "float32":
            vals = [float(x).hex() + "f" for x in flat.astype(np.float32)]
        elif t.dtype == "float64":
            vals = [float(x).hex() for x in flat]
        elif t.dtype == "float16":
            vals = [str(int(x)) for x in flat.view(np.uint16)]
        else:
            vals = [str(int(x)) for x in flat]
        ctype = _c_type(t.dtype) if t.dtype != "float16" else "uint16_t"
        rows = [", ".join(vals[i:i + 8]) for i in range(0, len(vals), 8)] or ["0"]
        lines.append(f"const {ctype} dt_{t.name}[{max(1, len(vals))}] __attribute__((aligned({ALIGN}))) = {{\n  "
                     + ",\n  ".join(rows) + "\n};")
    return "\n".join(lines) + "\n"


def _model_h(g: Graph, prefix: str, plan: MemoryPlan, names: dict[str, str]) -> str:
    P = prefix.upper()
    ins = [t for t in g.tensors.values() if t.role == "input"]
    outs = [g.tensors[n] for n in g.outputs]
    lines = [f"/* {prefix}: a model compiled by deploytool. Generated; do not edit.",
             " *",
             f" *   int {prefix}_run(const void* const inputs[{P}_NUM_INPUTS], void* const outputs[{P}_NUM_OUTPUTS]);",
             " *",
             " * One pointer per input and per output, in the order below; each buffer holds the tensor in",
             " * C order and its dtype, 16-byte aligned is best. Outputs are written in place. Returns 0, or",
             f" * -1 with {prefix}_last_error() naming the failing check. Not reentrant: one static arena",
             f" * of {P}_ARENA_BYTES bytes holds every intermediate tensor and workspace. */",
             f"#ifndef {P}_H_", f"#define {P}_H_", "", "#include <stddef.h>", "#include <stdint.h>", "",
             "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
             f"#define {P}_NUM_INPUTS {len(ins)}", f"#define {P}_NUM_OUTPUTS {len(outs)}",
             f"#define {P}_ARENA_BYTES {plan.arena_bytes}", ""]
    for kind, ts in (("INPUT", ins), ("OUTPUT", outs)):
        for i, t in enumerate(ts):
            lines += [f"#define {P}_{kind}_{i}_NAME {json.dumps(names.get(f'{kind.lower()}{i}', t.name))}",
                      f"#define {P}_{kind}_{i}_DTYPE \"{t.dtype}\"",
                      f"#define {P}_{kind}_{i}_NDIM {len(t.shape)}",
                      f"#define {P}_{kind}_{i}_SHAPE {{{', '.join(map(str, t.shape)) or '1'}}}",
                      f"#define {P}_{kind}_{i}_BYTES {t.nbytes}", ""]
    lines += [f"int {prefix}_run(const void* const inputs[{P}_NUM_INPUTS], void* const outputs[{P}_NUM_OUTPUTS]);",
              f"const char* {prefix}_last_error(void);", "", "#ifdef __cplusplus", "}", "#endif", f"#endif  /* {P}_H_ */", ""]
    return "\n".join(lines)


def _model_c(g: Graph, prefix: str, plan: MemoryPlan) -> str:
    P = prefix.upper()
    offsets = {b.name: b.offset for b in plan.buffers}
    order = list(g.tensors)
    idx = {n: i for i, n in enumerate(order)}
    lines = ["/* The ahead-of-time executor: the kernels in order over one static arena. Generated by deploytool. */",
             f'#include "{prefix}.h"', '#include "tvm/ffi/c_api.h"', "", "void dt_workspace(uint8_t* base, size_t size);",
             "const char* dt_error(void);", ""]
    for k in sorted({s.kernel for s in g.steps}):
        lines.append(f"int32_t __tvm_ffi_{k}(void* self, void* args, int32_t num_args, void* result);")
    for t in g.tensors.values():
        if t.role == "weight":
            lines.append(f"extern const {_c_type(t.dtype) if t.dtype != 'float16' else 'uint16_t'} dt_{t.name}[];")
    lines += ["", f"static uint8_t dt_arena[{max(plan.arena_bytes, ALIGN)}] __attribute__((aligned({ALIGN})));", ""]
    for t in g.tensors.values():
        lines.append(f"static int64_t dt_shape_{t.name}[{max(1, len(t.shape))}] = {{{', '.join(map(str, t.shape)) or '1'}}};")
    lines += ["", f"static DLTensor dt_t[{len(order)}] = {{"]
    for n in order:
        t = g.tensors[n]
        code, bits = _dl_dtype(t.dtype)
        if t.role == "weight":
            data = f"(void*)dt_{n}"
        elif t.role == "arena":
            data = f"dt_arena + {offsets[n]}" if n in offsets else "dt_arena"
        else:
            data = "NULL"
        lines.append(f"  {{{data}, {{kDLCPU, 0}}, {len(t.shape)}, {{{code}, {bits}, 1}}, dt_shape_{n}, NULL, 0}},  /* {n} {t.role} */")
    lines += ["};", "", f"const char* {prefix}_last_error(void) {{ return dt_error(); }}", "",
              f"int {prefix}_run(const void* const inputs[{P}_NUM_INPUTS], void* const outputs[{P}_NUM_OUTPUTS]) {{",
              f"  TVMFFIAny args[{max(len(s.args) for s in g.steps)}];", "  TVMFFIAny ret;"]
    for n in order:
        t = g.tensors[n]
        if t.role == "input":
            lines.append(f"  dt_t[{idx[n]}].data = (void*)inputs[{t.index}];")
        elif t.role == "output":
            lines.append(f"  dt_t[{idx[n]}].data = outputs[{t.index}];")
    ws = {b.first: b for b in plan.buffers if b.kind == "workspace"}
    for s, step in enumerate(g.steps):
        lines.append(f"  /* step {s}: {step.kernel} */")
        for j, a in enumerate(step.args):
            lines.append(f"  args[{j}].type_index = kTVMFFIDLTensorPtr; args[{j}].zero_padding = 0; args[{j}].v_int64 = 0; "
                         f"args[{j}].v_ptr = &dt_t[{idx[a]}];")
        w = ws.get(s)
        lines.append(f"  dt_workspace(dt_arena + {w.offset}, {w.nbytes});" if w else "  dt_workspace(NULL, 0);")
        lines.append(f"  if (__tvm_ffi_{step.kernel}(NULL, args, {len(step.args)}, &ret) != 0) return -1;")
    # an output that is an input or a constant is copied
    for i, n in enumerate(g.outputs):
        t = g.tensors[n]
        if t.role in ("input", "weight"):
            lines.append(f"  for (size_t i = 0; i < {t.nbytes}; ++i) ((uint8_t*)outputs[{i}])[i] = ((const uint8_t*)dt_t[{idx[n]}].data)[i];")
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


_RUNTIME_C = """/* The runtime shim: what TVM's generated kernels call. Generated by deploytool. */
#include <stddef.h>
#include <stdint.h>
#include "tvm/runtime/c_backend_api.h"
#include "tvm/ffi/c_api.h"

/* Workspace: the executor hands each kernel its slice of the arena; the kernel's allocations are
 * LIFO, so a stack suffices. */
static uint8_t* dt_ws_base;
static size_t dt_ws_size, dt_ws_top;
static const char* dt_last_error = "";

void dt_workspace(uint8_t* base, size_t size) {
  dt_ws_base = base;
  dt_ws_size = size;
  dt_ws_top = 0;
}

const char* dt_error(void) { return dt_last_error; }

void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes, int dtype_code_hint,
                               int dtype_bits_hint) {
  size_t n = (size_t)((nbytes + 15u) & ~(uint64_t)15u);
  (void)device_type; (void)device_id; (void)dtype_code_hint; (void)dtype_bits_hint;
  if (dt_ws_top + n > dt_ws_size) {
    dt_last_error = "workspace exhausted";
    return NULL;
  }
  void* p = dt_ws_base + dt_ws_top;
  dt_ws_top += n;
  return p;
}

int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  (void)device_type; (void)device_id;
  dt_ws_top = (size_t)((uint8_t*)ptr - dt_ws_base);
  return 0;
}

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** message_parts, int32_t num_parts) {
  dt_last_error = num_parts > 0 ? message_parts[0] : kind;
}
"""


def _makefile(target, prefix: str) -> str:
    flags = " ".join(target.toolchain.get("cflags", []))
    return f"""# Builds libmodel.a for {target.name} ({target.description}).
# The kernels: kernels_thumb.o (LLVM, thumbv7em; the default on the MCU) or kernels.c (TVM's portable C).
# Host build (tests, desktop): make host
ifeq ($(origin CC),default)
CC      := {target.toolchain.get('cc', 'arm-none-eabi-gcc')}
endif
ifeq ($(origin AR),default)
AR      := arm-none-eabi-ar
endif
CFLAGS  ?= {flags}
KERNELS ?= $(if $(wildcard kernels_thumb.o),kernels_thumb.o,kernels.o)
OBJS    := {prefix}.o weights.o runtime.o $(KERNELS)

libmodel.a: $(OBJS)
\t$(AR) rcs $@ $^

%.o: %.c
\t$(CC) $(CFLAGS) -std=gnu11 -ffunction-sections -fdata-sections -Iinclude -c $< -o $@

host:
\t$(MAKE) clean
\t$(MAKE) CC=gcc AR=ar CFLAGS=-O2 KERNELS=kernels.o libmodel.a

clean:
\trm -f {prefix}.o weights.o runtime.o kernels.o libmodel.a
"""


def copy_headers(dst: Path) -> None:
    import tvm
    import tvm_ffi

    roots = {"tvm": Path(tvm.__file__).parent / "include", "tvm_ffi": Path(tvm_ffi.__file__).parent / "include"}
    for rel, (pkg, src) in _HEADERS.items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(roots[pkg] / src, dst / rel)


def _kernel_module(mod):
    import tvm
    from tvm import tirx

    return tvm.IRModule({gv: f.with_attr("global_symbol", gv.name_hint) for gv, f in mod.functions.items()
                         if isinstance(f, tirx.PrimFunc)})


def kernels_object(mod, llvm_target: dict, path: Path) -> Path:
    """The kernels compiled by LLVM for the microcontroller (thumbv7em): 2.4x (KWS DS-CNN) to 3.7x
    (micro CNN) fewer instructions than TVM's C compiled by arm-none-eabi-gcc -O2 (bench/mcu.py).
    TVM's C carries no ``restrict``: the accumulator, a one-element float array, may alias the
    float inputs, so gcc stores and reloads it on every multiply-add; TVM's LLVM code generator
    marks the buffers noalias."""
    import tvm

    with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_assert": True}):
        rt = tvm.tirx.build(_kernel_module(mod), target=tvm.target.Target(llvm_target))
    rt.write_to_file(str(path))
    return path


def kernels_c(mod, target) -> str:
    """TVM's C for every kernel of the module (asserts compiled out: the executor passes exactly
    the tensors each kernel was compiled for)."""
    import tvm

    with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_assert": True}):
        rt = tvm.tirx.build(_kernel_module(mod), target=tvm.target.Target(target.tvm))
    return rt.inspect_source()


def write_bundle(mod, target, out_dir: str | Path, prefix: str = "model",
                 io_names: dict[str, str] | None = None) -> tuple[Path, MemoryPlan, Graph]:
    """Write the C bundle of a partitioned (and scheduled) module into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    g = extract_graph(mod)
    src = kernels_c(mod, target)
    ws = kernel_workspaces(src)
    for step in g.steps:
        step.workspace = ws.get(step.kernel, 0)
    plan = plan_memory(arena_buffers(g))
    (out / "kernels.c").write_text(src)
    llvm = target.toolchain.get("kernels_llvm")
    if llvm:
        kernels_object(mod, llvm, out / "kernels_thumb.o")
    (out / "weights.c").write_text(_weights_c(g))
    (out / f"{prefix}.h").write_text(_model_h(g, prefix, plan, io_names or {}))
    (out / f"{prefix}.c").write_text(_model_c(g, prefix, plan))
    (out / "runtime.c").write_text(_RUNTIME_C)
    (out / "Makefile").write_text(_makefile(target, prefix))
    copy_headers(out / "include")
    tensors = {n: {"shape": list(t.shape), "dtype": t.dtype, "role": t.role, "bytes": t.nbytes}
               for n, t in g.tensors.items()}
    (out / "memory_plan.json").write_text(json.dumps({"steps": [asdict(s) for s in g.steps], "tensors": tensors,
                                                      **plan.to_dict()}, indent=1))
    return out, plan, g


# ----------------------------------------------------------------------------- footprint
def section_sizes(size_tool: str, path: str | Path) -> dict[str, int]:
    """Bytes per section of an ELF file (``size -A``), subsections (``.text.foo``) summed into their
    section; keys without the dot: text, rodata, data, bss, heap, ..."""
    import subprocess

    out: dict[str, int] = {}
    for line in subprocess.run([size_tool, "-A", str(path)], capture_output=True, text=True).stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith(".") and parts[1].isdigit():
            name = parts[0].split(".")[1]
            out[name] = out.get(name, 0) + int(parts[1])
    return out


def _code_and_data(sections: dict[str, int]) -> dict[str, int]:
    return {k: sections.get(k, 0) for k in ("text", "rodata", "data", "bss")}


def footprint(out_dir: str | Path, target, prefix: str = "model") -> dict[str, Any]:
    """Build the bundle's objects with the target's compiler and measure them: flash (code, weights)
    and RAM (arena, the workspace inside it, stack: the executor's frame plus the deepest kernel's)."""
    import subprocess
    import tempfile

    from deploytool.errors import ToolchainError

    out = Path(out_dir)
    cc = target.toolchain.get("cc", "arm-none-eabi-gcc")
    size_tool = cc[:-3] + "size" if cc.endswith("gcc") else "size"
    if not shutil.which(cc) or not shutil.which(size_tool):
        raise ToolchainError(f"'{cc}' is not installed: the footprint needs it",
                             "install Debian's gcc-arm-none-eabi (`make toolchains`)")
    sizes: dict[str, dict[str, int]] = {}
    stack: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for src in (f"{prefix}.c", "kernels.c", "weights.c", "runtime.c"):
            obj = Path(tmp) / src.replace(".c", ".o")
            r = subprocess.run([cc, *target.toolchain.get("cflags", []), "-std=gnu11", "-ffunction-sections",
                                "-fdata-sections", "-fstack-usage", f"-I{out / 'include'}", "-c", str(out / src),
                                "-o", str(obj)], capture_output=True, text=True)
            if r.returncode != 0:
                raise BuildError(f"{cc} failed on {src}: {r.stderr.strip()[:300]}", "report it with the bundle attached")
            sizes[src] = _code_and_data(section_sizes(size_tool, obj))
            su = obj.with_suffix(".su")
            if su.exists():
                for line in su.read_text().splitlines():
                    fn, nbytes = line.split("\t")[0].rsplit(":", 1)[-1], int(line.split("\t")[1])
                    stack[fn] = nbytes
    if (out / "kernels_thumb.o").exists():  # what ships to the MCU: the LLVM-built kernels (the C
        # ones were compiled above for their -fstack-usage only)
        sizes["kernels.c"] = _code_and_data(section_sizes(size_tool, out / "kernels_thumb.o"))
    plan = json.loads((out / "memory_plan.json").read_text())
    kernels = [v for k, v in stack.items() if k.startswith("__tvm_ffi_")]
    code = sum(s["text"] + s["rodata"] for n, s in sizes.items() if n != "weights.c")
    weights = sizes["weights.c"]["rodata"] + sizes["weights.c"]["text"]
    ws = max((b["nbytes"] for b in plan["buffers"] if b["kind"] == "workspace"), default=0)
    fp = {"target": target.name,
          "flash": {"code": code, "weights": weights, "total": code + weights},
          "ram": {"arena": plan["arena_bytes"], "workspace_in_arena": ws,
                  "stack": stack.get(f"{prefix}_run", 0) + max(kernels, default=0),
                  "other": sum(s["data"] + s["bss"] for s in sizes.values()) - plan["arena_bytes"]},
          "arena_lower_bound": plan["lower_bound"], "arena_ratio": plan["ratio"],
          "objects": sizes, "note": "objects only: libc/libm functions the kernels call (expf...) come on top"}
    fp["ram"]["total"] = fp["ram"]["arena"] + fp["ram"]["stack"] + max(0, fp["ram"]["other"])
    (out / "footprint.json").write_text(json.dumps(fp, indent=1))
    return fp
