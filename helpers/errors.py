"""One exception tree for everything the kit raises on purpose.

Every error a user's input, file or machine can cause is a :class:`KitError`; the CLI catches
that one type, prints its message and exits 2. Each class also keeps the built-in base it had
before this tree existed (``ValueError``, ``OSError``, ``RuntimeError``), so ``except ValueError``
in older code still works. Errors from lower layers (safetensors, XLA, the OS) are translated
into these where the kit calls them, with the problem and the fix in the message.

>>> issubclass(FileError, KitError) and issubclass(FileError, ValueError)
True
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "BadInputError",
    "ChildProcessFailed",
    "CompileOutOfMemory",
    "FileError",
    "InUseError",
    "JaxAlreadyStartedError",
    "KitError",
    "MeasurementFailed",
    "NoGpuError",
    "PathError",
    "SizeError",
]


class KitError(Exception):
    """Base of every error the kit raises on purpose; the message names the problem and the fix."""


class BadInputError(KitError, ValueError):
    """An argument the kit cannot use: an unknown mode, backend, device or strategy name."""


class SizeError(BadInputError):
    """A size string or number that cannot be a number of bytes."""


class FileError(BadInputError):
    """A file that is not a readable safetensors file; the message names file and problem."""

    def __init__(self, path, problem: str, fix: str = ""):
        self.path, self.problem, self.fix = str(path), problem, fix
        super().__init__(f"{path}: {problem}" + (f" ({fix})" if fix else ""))


class PathError(KitError, OSError):
    """A path the kit cannot write to: a missing folder, a directory, no disk space."""

    def __str__(self) -> str:  # OSError's own str would print the errno tuple
        return str(self.args[0]) if self.args else "path error"


class BackendError(KitError, RuntimeError):
    """JAX could not start the backend a call needs (a bad JAX_PLATFORMS, a broken plugin, a
    variable JAX refuses at import); the message says which and points to the doctor."""


class NoGpuError(KitError, RuntimeError):
    """Something needs an NVIDIA GPU with JAX's CUDA backend, and this machine has none."""


class JaxAlreadyStartedError(KitError, RuntimeError):
    """A setting that must come before JAX starts its backends came too late."""


class InUseError(KitError, RuntimeError):
    """A tool that exists once per process (a transfer trace owns file descriptor 2) is busy."""


class MeasurementFailed(KitError, RuntimeError):
    """A measurement failed: the memory sampler running in the background (the cause is
    chained), or XLA compiling the step to be priced."""


class CompileOutOfMemory(MeasurementFailed):
    """XLA ran out of device memory while compiling a step: on a GPU its autotuner runs
    candidate kernels at the step's own sizes, so a step this large cannot run with the memory the
    device has free."""


class ChildProcessFailed(KitError, RuntimeError):
    """A child process the kit started (a probe, a measurement) failed; the message says how it
    ended (exit code or signal) and quotes the end of its stderr."""

    def __init__(self, message: str, *, result=None):
        super().__init__(message)
        #: the child's ``ChildResult`` (exit code, stderr, timed out), where there is one
        self.result = result
