"""deploytool: ship ONNX models, fast, to x86, aarch64, NVIDIA GPUs and Cortex-M.

The Python API mirrors the CLI command for command::

    import deploytool
    info = deploytool.inspect("model.onnx")
    res = deploytool.compile("model.onnx", target="x86", output="model.so")
    deploytool.run("model.so", check="model.onnx")
    deploytool.bench("model.so", compare="model.onnx")
    deploytool.tune("model.onnx", target="x86", output="model-x86.jsonl")
"""

__version__ = "0.1.0"

_API = ("inspect", "compile", "tune", "run", "bench", "profile", "metadata", "list_targets", "logs_show", "logs_merge",
        "logs_prune", "logs_check", "report")


def __getattr__(name):  # lazy, so that `import deploytool.errors` stays cheap and cycle-free
    if name in _API:
        from deploytool import api

        return getattr(api, name)
    raise AttributeError(f"module 'deploytool' has no attribute {name!r}")


__all__ = list(_API) + ["__version__"]
