"""Runners: the only code that loads artifacts, runs them and measures them.

``LocalRunner`` runs a .so on this machine through the TVM runtime; ``RPCRunner`` uploads it to a
board over TVM RPC and runs it there. Both: ``run(inputs) -> outputs`` and ``time(...)``.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from deploytool.artifact import Artifact
from deploytool.errors import ArtifactError, TargetError
from deploytool.targets import default_threads, host_arch, missing_features

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    """Latency statistics in milliseconds."""

    min_ms: float
    median_ms: float
    p90_ms: float
    mean_ms: float
    repeats: int
    warmup: int
    samples_ms: tuple[float, ...] = field(default=(), repr=False, compare=False)  # sorted

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "samples_ms"}

    @classmethod
    def from_samples(cls, samples_s: list[float], warmup: int) -> "Timing":
        ms = sorted(s * 1e3 for s in samples_s)
        p90 = ms[min(len(ms) - 1, int(round(0.9 * (len(ms) - 1))))]
        return cls(min_ms=ms[0], median_ms=statistics.median(ms), p90_ms=p90, mean_ms=statistics.fmean(ms),
                   repeats=len(ms), warmup=warmup, samples_ms=tuple(ms))

    @classmethod
    def pooled(cls, timings: list["Timing"]) -> "Timing":
        """One Timing over the samples of several (e.g. the rounds of a comparison)."""
        return cls.from_samples([m / 1e3 for t in timings for m in t.samples_ms], timings[0].warmup)


def time_callable(fn, *, warmup: int, repeats: int, min_seconds: float = 0.0) -> Timing:
    """Time ``fn`` (which must block until done): ``warmup`` untimed calls, then at least
    ``repeats`` timed ones (more while under ``min_seconds``)."""
    for _ in range(warmup):
        fn()
    samples = []
    start = time.perf_counter()
    while len(samples) < repeats or (time.perf_counter() - start) < min_seconds and len(samples) < 10000:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return Timing.from_samples(samples, warmup)


def set_threads(n: int | None) -> None:
    """Size TVM's CPU thread pool: ``n`` threads, or ``targets.default_threads()`` (the user's
    TVM_NUM_THREADS, else one per physical core).

    TVM sizes its pool once, when the first parallel kernel runs, from TVM_NUM_THREADS, and
    otherwise from half the logical CPUs (it assumes 2-way SMT: on a 2-core VM without SMT that
    is ONE thread, and runtime.config_threadpool can shrink the pool later but never grow it).
    So the count goes into the environment before the pool starts; a pool already running with
    another size is reconfigured."""
    import os

    n = int(n or default_threads())
    current = os.environ.get("TVM_NUM_THREADS")
    if current == str(n):
        return
    os.environ["TVM_NUM_THREADS"] = str(n)
    if current is not None:
        import tvm_ffi

        tvm_ffi.get_global_func("runtime.config_threadpool")(1, n)


def _require_so(a: Artifact) -> None:
    if a.metadata.get("target", {}).get("artifact", "so") != "so":
        raise ArtifactError(f"'{a.path}' is a {a.metadata['target']['artifact']}, not a .so", "run it with its bundle runner")


def _on_gpu(a: Artifact) -> bool:
    """A CUDA artifact: its kernels run on the GPU (the VM on the host CPU)."""
    return a.metadata.get("target", {}).get("family") == "cuda"


class _VMRunner:
    """Runs an artifact's relax VM on a device (this machine's CPU, or a board's over RPC)."""

    artifact: Artifact
    device = None
    vm = None

    def _start(self, lib) -> None:
        from tvm import relax

        self.vm = relax.VirtualMachine(lib, self.device)
        self._main = self.vm[self.artifact.metadata.get("entry", "main")]

    def to_device(self, inputs: dict[str, np.ndarray]) -> list:
        import tvm

        # np.asarray(order="C") keeps 0-d inputs 0-d (np.ascontiguousarray makes them 1-d)
        from deploytool.onnx_passes import widen_subbyte_array

        # 2/4-bit integer inputs travel as int8/uint8 (see onnx_passes.widen_subbyte_io)
        return [tvm.runtime.tensor(np.asarray(widen_subbyte_array(inputs[s.name]), order="C"), self.device)
                for s in self.artifact.inputs]

    def _collect(self, result) -> dict[str, np.ndarray]:
        outs = self.artifact.outputs
        if len(outs) == 1 and hasattr(result, "numpy"):
            return {outs[0].name: result.numpy()}
        return {s.name: r.numpy() for s, r in zip(outs, result)}

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._collect(self._main(*self.to_device(inputs)))

    def call(self, args: list):
        """One call of the model on inputs already on the device (to_device)."""
        return self._main(*args)


class LocalRunner(_VMRunner):
    """Loads a Linux .so artifact on this machine and runs it on the CPU, or on this machine's
    NVIDIA GPU for CUDA artifacts (inputs copied to the GPU, outputs back)."""

    def __init__(self, artifact: Artifact, threads: int | None = None):
        self.artifact = artifact
        self.check_loadable(artifact)
        import tvm

        set_threads(threads)
        if artifact.metadata.get("cublas"):  # its matmuls dlopen libcublas: find pip's or the toolkit's
            from deploytool import cublas

            cublas.preload()
        if artifact.metadata.get("cudnn"):  # its convolutions dlopen libcudnn: find pip's or the system's
            from deploytool import cudnn

            cudnn.preload()
        try:
            lib = tvm.runtime.load_module(str(artifact.path))
        except Exception as e:
            raise ArtifactError(f"the TVM runtime cannot load '{artifact.path}': {str(e).strip().splitlines()[-1][:300]}",
                                "rebuild it with this deploytool/TVM version") from None
        self.device = tvm.cuda(0) if _on_gpu(artifact) else tvm.cpu()
        self._start(lib)

    @staticmethod
    def check_loadable(a: Artifact) -> None:
        """Refuse, with a message, an artifact this machine cannot load (never a SIGILL)."""
        meta = a.metadata
        _require_so(a)
        if a.arch != host_arch():
            raise TargetError(f"'{a.path}' is built for {a.arch} and this machine is {host_arch()}",
                              "run it on a matching board (--device HOST:PORT), or rebuild with --target x86")
        lacking = missing_features(a.required_features, a.arch)
        if lacking:
            raise TargetError(f"'{a.path}' needs CPU features this machine lacks: {', '.join(lacking)}",
                              "rebuild for this machine with --target x86 (or a portable preset such as x86-avx2)")
        import tvm

        if _on_gpu(a):
            from deploytool import cuda

            cuda.require_gpu(meta["target"].get("tvm", {}).get("arch"), f"'{a.path}'")
        if meta.get("tvm_version") != tvm.__version__:
            raise ArtifactError(f"'{a.path}' was built with TVM {meta.get('tvm_version')}, this runtime is TVM {tvm.__version__}",
                                "rebuild it with this deploytool installation")

    def time(self, inputs: dict[str, np.ndarray], *, warmup: int = 3, repeats: int = 20, min_seconds: float = 0.0) -> Timing:
        args = self.to_device(inputs)

        def once():
            self._main(*args)
            self.device.sync()

        return time_callable(once, warmup=warmup, repeats=repeats, min_seconds=min_seconds)


class RPCRunner(_VMRunner):
    """Uploads a .so artifact to a board over TVM RPC and runs it there."""

    def __init__(self, artifact: Artifact, spec, threads: int | None = None):
        from deploytool import device as _device

        self.artifact = artifact
        meta = artifact.metadata
        _require_so(artifact)
        self.board = _device.open_board(spec)
        info = self.board.info
        if info.get("arch") and info["arch"] != artifact.arch:
            raise TargetError(f"'{artifact.path}' is built for {artifact.arch} and the board {self.board.name} is "
                              f"{info['arch']}", f"rebuild it for the board (e.g. --target {'arm' if info['arch'] == 'aarch64' else 'x86'})")
        if info.get("tvm") and info["tvm"] != meta.get("tvm_version"):
            raise ArtifactError(f"'{artifact.path}' was built with TVM {meta.get('tvm_version')}, the board runs TVM "
                                f"{info['tvm']}", "rebuild it with the TVM version the board runs, or update the board")
        if threads:
            log.info("--threads is set on the board (`deploytool device serve --threads`), not per run")
        sess = self.board.session
        name = f"deploytool-{(meta.get('model', {}).get('sha256') or 'model')[:12]}.so"
        try:
            sess.upload(str(artifact.path), name)
            lib = sess.load_module(name)
        except Exception as e:
            raise ArtifactError(f"the board {self.board.name} cannot load '{artifact.path}': "
                                f"{str(e).strip().splitlines()[-1][:200]}",
                                "check that it is built for this board's CPU and TVM runtime") from None
        # A CUDA artifact on a board (a Jetson serving `deploytool device serve`) runs on its GPU.
        self.device = sess.cuda(0) if _on_gpu(artifact) else sess.cpu()
        self._start(lib)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # A tuple result stays on the board as one remote object; the VM's stateful interface hands
        # its fields back one by one.
        entry = self.artifact.metadata.get("entry", "main")
        self.vm.set_input(entry, *self.to_device(inputs))
        self.vm.invoke_stateful(entry)
        return self._collect(self.vm.get_outputs(entry))

    def time(self, inputs: dict[str, np.ndarray], *, warmup: int = 3, repeats: int = 20, min_seconds: float = 0.0) -> Timing:
        """Timed on the board (TVM's time_evaluator), so the network is not in the numbers."""
        args = self.to_device(inputs)
        entry = self.artifact.metadata.get("entry", "main")
        for _ in range(warmup):
            self._main(*args)
        f = self.vm.time_evaluator(entry, self.device, number=1, repeat=repeats,
                                   min_repeat_ms=int(min_seconds * 1000 / max(repeats, 1)))
        return Timing.from_samples([float(x) for x in f(*args).results], warmup)


def runner_for(artifact: Artifact, device=None, threads: int | None = None):
    """The runner of an artifact: on this machine, or on the board ``device`` (a DeviceSpec)."""
    return RPCRunner(artifact, device, threads) if device is not None else LocalRunner(artifact, threads)
