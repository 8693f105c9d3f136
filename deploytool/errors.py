"""The deploytool exception hierarchy.

Every error a user can cause is a :class:`DeploytoolError` whose message is one line that
names the problem and the fix. Only the CLI turns them into exit codes (2); library callers
catch them like any other exception.
"""

from __future__ import annotations


class DeploytoolError(Exception):
    """Base class: a user-facing problem with a one-line message naming the fix."""

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}: {fix}" if fix else problem)


class ModelError(DeploytoolError):
    """The model file is missing, unreadable, invalid or uses something we cannot import."""


class UnsupportedOperatorError(ModelError):
    """One or more operators have no converter. ``ops`` maps op type -> count."""

    def __init__(self, ops: dict[str, int], fix: str | None = None):
        self.ops = dict(ops)
        listed = ", ".join(f"{op} (x{n})" if n > 1 else op for op, n in sorted(ops.items()))
        super().__init__(
            f"{len(ops)} unsupported operator type(s): {listed}",
            fix or "replace them in the exporter, or file an issue with the model attached",
        )


class ShapeError(ModelError):
    """An input has dynamic or wrong dimensions."""


class TargetError(DeploytoolError):
    """Unknown target, unavailable preset, or a CPU that cannot run an artifact."""


class BuildError(DeploytoolError):
    """Lowering or code generation failed."""


class ArtifactError(DeploytoolError):
    """A compiled artifact is missing, corrupt, or lacks deploytool metadata."""


class InputError(DeploytoolError):
    """Inputs given to run/bench do not match the model (name, shape, dtype, file)."""


class CheckError(DeploytoolError):
    """Outputs differ from the onnxruntime reference beyond the tolerance (exit code 1)."""

    exit_code = 1

    def __init__(self, problem: str, fix: str | None = None, report=None):
        self.report = report
        super().__init__(problem, fix)


class ToolchainError(DeploytoolError):
    """A compiler, linker or emulator the target needs is not installed."""


class DeviceError(DeploytoolError):
    """A board or tracker can't be reached, has no free board, or was lost mid-way."""


def describe(exc: BaseException, limit: int = 300) -> str:
    """One line for a foreign exception: its type and last message line, or, for bare asserts,
    the source line that failed."""
    import os
    import traceback

    # TVM's script printer ends an IR dump with "# Metadata omitted. ...": not the message
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip() and not ln.strip().startswith("# ")]
    if "Offending call:" in lines[:-1]:  # VM codegen: the message, then the Relax call it could not emit
        call = lines[lines.index("Offending call:") + 1]
        return f"{type(exc).__name__}: {lines[0]} Offending call: {call}"[:limit]
    if lines:
        return f"{type(exc).__name__}: {lines[-1]}"[:limit]
    tb = traceback.extract_tb(exc.__traceback__)
    if tb:
        frame = tb[-1]
        return f"{type(exc).__name__} in {os.path.basename(frame.filename)}:{frame.lineno}: {frame.line}"[:limit]
    return type(exc).__name__
