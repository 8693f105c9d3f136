"""Running a Cortex-M C bundle: built for this machine with gcc, or for the microcontroller with
arm-none-eabi-gcc and run under qemu-system-arm (mps2-an386: Cortex-M4, mps2-an500: Cortex-M7)
with semihosting, which carries the inputs and outputs as files.

The harness (generated) reads ``in<i>.bin``, calls ``model_run`` once, writes ``out<i>.bin``. Under
QEMU with ``-icount shift=0`` every instruction advances the virtual clock by 1 ns, so SysTick,
which counts the processor clock (25 MHz on MPS2), counts instructions in steps of 40: QEMU can't measure
time, but it can count instructions (calibrated: a loop of 3,000,000 instructions reads 75,000
ticks on mps2-an500 and 96,000 on mps3-an547, whose clock is 32 MHz).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from deploytool.artifact import Artifact
from deploytool.errors import BuildError, DeviceError, ToolchainError

EXAMPLES = Path("/usr/share/doc/gcc-arm-none-eabi/examples")
# target -> (startup file of the examples, QEMU CPU); the M55 boots with the M7's startup code (same
# vector table; Thumb-2 only).
_CORE = {"cortex-m4": ("ARMCM4", "cortex-m4"), "cortex-m7": ("ARMCM7", "cortex-m7"), "cortex-m55": ("ARMCM7", "cortex-m55")}
# Memory per QEMU machine (replaces the MEMORY block of the examples' gcc.ld), and the heap the
# harness may use for inputs and outputs. MPS2: 4 MB of SSRAM at 0 (code, weights) and 4 MB at
# 0x20000000 (data). MPS3 AN547 (Cortex-M55): all in its 512 KB ITCM at 0 (QEMU's semihosting
# reports the ITCM as the memory that heap and stack live in: rdimon's startup puts them there).
_MEM = {"mps2": (0x0, 0x400000, 0x20000000, 0x400000, 0x200000),
        "mps3-an547": (0x0, 0x30000, 0x30000, 0x50000, 0x10000)}
# SysTick runs at the machine's system clock: 25 MHz on MPS2, 32 MHz on MPS3 AN547. Under -icount
# shift=0 one instruction is 1 ns, so a tick is 40 (31.25) instructions (calibrated with a loop of
# 3 M instructions on both).
_NS_PER_TICK = {"mps3-an547": 31.25}
_MEM_LD = """MEMORY
{{
  FLASH (rx) : ORIGIN = {flash0:#x}, LENGTH = {flash:#x}
  RAM (rwx)  : ORIGIN = {ram0:#x}, LENGTH = {ram:#x}
}}
"""

_HARNESS = r"""/* Test harness: inputs from in<i>.bin, outputs to out<i>.bin (stdio: semihosting on the MCU). */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include "model.h"

#ifdef DT_MCU
#define SYST_CSR (*(volatile uint32_t*)0xE000E010)
#define SYST_RVR (*(volatile uint32_t*)0xE000E014)
#define SYST_CVR (*(volatile uint32_t*)0xE000E018)
#define CPACR (*(volatile uint32_t*)0xE000ED88)
/* Stack high-water mark: paint 48 KB below the current stack pointer, run, find the deepest word
 * overwritten. (rdimon's startup moves the stack to where QEMU's semihosting says memory ends, so
 * the linker script's stack symbols don't apply.) */
#define DT_PAINT (48u * 1024u)
static uint32_t __attribute__((noinline)) paint_stack(void) {
  uint32_t sp;
  __asm volatile("mov %0, sp" : "=r"(sp));
  for (uint32_t* p = (uint32_t*)(sp - DT_PAINT); p < (uint32_t*)(sp - 32); ++p) *p = 0xDEADBEEFu;
  return sp;
}
static uint32_t stack_used(uint32_t sp0) {
  uint32_t* p = (uint32_t*)(sp0 - DT_PAINT);
  while (p < (uint32_t*)sp0 && *p == 0xDEADBEEFu) ++p;
  return sp0 - (uint32_t)p;
}
void SystemInit(void) {
  CPACR |= (0xFu << 20);  /* the FPU: CP10 and CP11 full access */
  __asm volatile("dsb\n isb");
}
#endif

static void* alloc16(size_t n) {  /* newlib lacks posix_memalign */
  uintptr_t p = (uintptr_t)malloc(n + 16);
  return p ? (void*)((p + 15) & ~(uintptr_t)15) : NULL;
}

static void* load(const char* path, size_t n) {
  void* p = alloc16(n);
  FILE* f = fopen(path, "rb");
  if (!p || !f || fread(p, 1, n, f) != n) { printf("harness: cannot read %s\n", path); exit(3); }
  fclose(f);
  return p;
}

int main(void) {
  static const size_t in_bytes[] = {@IN_BYTES@};
  static const size_t out_bytes[] = {@OUT_BYTES@};
  const void* inputs[MODEL_NUM_INPUTS];
  void* outputs[MODEL_NUM_OUTPUTS];
  char name[32];
  for (int i = 0; i < MODEL_NUM_INPUTS; ++i) { snprintf(name, sizeof name, "in%d.bin", i); inputs[i] = load(name, in_bytes[i]); }
  for (int i = 0; i < MODEL_NUM_OUTPUTS; ++i) outputs[i] = alloc16(out_bytes[i]);
#ifdef DT_MCU
  /* SysTick down-counts the processor clock; 24 bits: 671 M instructions under -icount shift=0 */
  uint32_t sp0 = paint_stack();
  SYST_RVR = 0xFFFFFFu; SYST_CVR = 0; SYST_CSR = 5;
  uint32_t t0 = SYST_CVR;
#endif
  int rc = model_run(inputs, outputs);
#ifdef DT_MCU
  uint32_t t1 = SYST_CVR;
  uint32_t stack = stack_used(sp0);
  printf("ticks %lu\n", (unsigned long)((t0 - t1) & 0xFFFFFFu));
  printf("stack %lu\n", (unsigned long)stack);
#endif
  if (rc != 0) { printf("model_run failed: %s\n", model_last_error()); return 4; }
  for (int i = 0; i < MODEL_NUM_OUTPUTS; ++i) {
    snprintf(name, sizeof name, "out%d.bin", i);
    FILE* f = fopen(name, "wb");
    if (!f || fwrite(outputs[i], 1, out_bytes[i], f) != out_bytes[i]) { printf("harness: cannot write %s\n", name); return 5; }
    fclose(f);
  }
  printf("ok\n");
  return 0;
}
"""


@dataclass
class BundleRun:
    outputs: dict[str, np.ndarray]
    where: str                                   # "host" or the QEMU machine
    instructions: int | None = None              # under QEMU: instructions of one model_run (+-40)
    stack_bytes: int | None = None               # under QEMU: stack high-water mark of model_run
    image: dict[str, int] = field(default_factory=dict)  # ELF sections of the QEMU image: text, data, bss


def _sources(bundle: Path, mcu: bool = False) -> list[str]:
    """The bundle's sources; for the MCU, the LLVM-built kernels (kernels_thumb.o) when present."""
    kernels = "kernels_thumb.o" if mcu and (bundle / "kernels_thumb.o").exists() else "kernels.c"
    return [str(bundle / f) for f in ("model.c", kernels, "weights.c", "runtime.c")]


def _harness(art: Artifact, work: Path) -> Path:
    src = _HARNESS.replace("@IN_BYTES@", ", ".join(str(s.nbytes) for s in art.inputs)) \
                  .replace("@OUT_BYTES@", ", ".join(str(s.nbytes) for s in art.outputs))
    p = work / "harness.c"
    p.write_text(src)
    return p


def _run(cmd, cwd, what, timeout=600) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DeviceError(f"{what} did not finish within {timeout} s", "check the model size; QEMU is slow") from None
    return r


def run_bundle(bundle: str | Path, inputs: dict[str, np.ndarray], *, on: str = "qemu") -> BundleRun:
    """Build ``bundle`` with a harness and run it once on ``inputs``: on this machine ("host") or
    under QEMU ("qemu", the machine of the bundle's target)."""
    art = Artifact.open(bundle)
    bundle = art.path.resolve()  # the compilers run in a scratch folder
    target = art.target
    with tempfile.TemporaryDirectory(prefix="deploytool-mcu-") as tmp:
        work = Path(tmp)
        for i, s in enumerate(art.inputs):
            np.ascontiguousarray(inputs[s.name], dtype=s.dtype).tofile(work / f"in{i}.bin")
        harness = _harness(art, work)
        if on == "host":
            cc = shutil.which("gcc") or shutil.which("cc")
            if not cc:
                raise ToolchainError("no C compiler on this machine", "install gcc")
            r = _run([cc, "-O2", "-std=gnu11", f"-I{bundle}", f"-I{bundle / 'include'}", *_sources(bundle), str(harness),
                      "-lm", "-o", str(work / "app")], work, "gcc")
            if r.returncode != 0:
                raise BuildError(f"building the bundle for this machine failed: {r.stderr.strip()[:300]}",
                                 "report it with the bundle attached")
            r = _run([str(work / "app")], work, "the host build")
            where, instructions, image, stack_bytes = "host", None, {}, None
        else:
            core = target["name"]
            if core not in _CORE:
                raise DeviceError(f"no QEMU machine for target {core}", "run it with on='host'")
            machine = target.get("device", {}).get("machine", "mps2-an500")
            cc, qemu = "arm-none-eabi-gcc", "qemu-system-arm"
            for tool, pkg in ((cc, "gcc-arm-none-eabi"), (qemu, "qemu-system-arm")):
                if not shutil.which(tool):
                    raise ToolchainError(f"'{tool}' is not installed", f"install Debian's {pkg} (`make toolchains`)")
            startup = EXAMPLES / "startup" / f"startup_{_CORE[core][0]}.S"
            if not startup.exists():
                raise ToolchainError(f"{startup} is missing (the startup file from gcc-arm-none-eabi's examples)",
                                     "install Debian's gcc-arm-none-eabi with its documentation")
            import re

            flash0, flash, ram0, ram, heap = _MEM.get(machine, _MEM["mps2"])
            ld = (EXAMPLES / "ldscripts" / "gcc.ld").read_text()  # its MEMORY block is an 8 KB example
            mem = _MEM_LD.format(flash0=flash0, flash=flash, ram0=ram0, ram=ram).strip()
            (work / "gcc.ld").write_text(re.sub(r"MEMORY\s*\{[^}]*\}", lambda _: mem, ld, count=1))
            cflags = [f for f in target.get("toolchain", {}).get("cflags", [])]
            cmd = [cc, *cflags, "-std=gnu11", "-DDT_MCU", f"-I{bundle}", f"-I{bundle / 'include'}",
                   "-ffunction-sections", "-fdata-sections", "-D__STARTUP_CLEAR_BSS", "-D__STACK_SIZE=0x10000",
                   f"-D__HEAP_SIZE={heap:#x}", str(startup), *_sources(bundle, mcu=True), str(harness),
                   "--specs=rdimon.specs", "-u", "_printf_float", "-Wl,--gc-sections", f"-L{work}", "-T", "gcc.ld",
                   "-lm", "-o", str(work / "app.elf")]
            r = _run(cmd, work, cc)
            if r.returncode != 0:
                raise BuildError(f"building the bundle for {core} failed: {r.stderr.strip()[-400:]}",
                                 "report it with the bundle attached")
            from deploytool.cbundle import section_sizes

            sections = section_sizes("arm-none-eabi-size", work / "app.elf")
            image = {k: sections[k] for k in ("text", "data", "bss", "heap", "stack_dummy") if k in sections}
            r = _run([qemu, "-M", machine, "-cpu", _CORE[core][1], "-nographic", "-monitor", "none", "-serial", "none",
                      "-semihosting-config", "enable=on,target=native", "-icount", "shift=0",
                      "-kernel", str(work / "app.elf")], work, f"QEMU ({machine})")
            where = machine
            ticks = [ln for ln in r.stdout.splitlines() if ln.startswith("ticks ")]
            instructions = round(int(ticks[0].split()[1]) * _NS_PER_TICK.get(machine, 40)) if ticks else None
            stack = [ln for ln in r.stdout.splitlines() if ln.startswith("stack ")]
            stack_bytes = int(stack[0].split()[1]) if stack else None
        if r.returncode != 0 or "ok" not in r.stdout.split():
            raise DeviceError(f"the bundle failed on {where}: {(r.stdout + r.stderr).strip()[-300:] or 'exit ' + str(r.returncode)}",
                              "report it with the bundle attached")
        outs = {s.name: np.fromfile(work / f"out{i}.bin", dtype=s.dtype).reshape(s.shape)
                for i, s in enumerate(art.outputs)}
    return BundleRun(outs, where, instructions, stack_bytes, image)
