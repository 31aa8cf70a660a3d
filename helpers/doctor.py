"""The doctor: a report of what JAX sees, under any environment, that never crashes.

:func:`diagnose` probes JAX in a fresh child process (:func:`helpers.devices.probe_in_child`).
When the child cannot answer, because ``import jax`` raised (``JAX_NUM_CPU_DEVICES=abc``, a
broken install), XLA aborted the process while parsing ``XLA_FLAGS``, or it hung, the failure
becomes the report: XLA's or Python's own line is quoted, the variable or flag at fault is named,
and the environment checks and package versions are still there. ``python -m helpers doctor``
prints it and exits 0.

This process never starts a JAX backend, so nothing here can abort it.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import sys
from collections.abc import Mapping
from types import MappingProxyType

from helpers import devices, settings
from helpers._internal import child, jaxcompat
from helpers.devices import DeviceReport, FailedBackend, versions
from helpers.errors import ChildProcessFailed
from helpers.settings import EnvWarning

__all__ = ["bug_report", "diagnose", "explain_child_failure", "redact"]

_GLOG = re.compile(r"^[EF]\d{4} [\d:.]+\s+\d+ (\S+?:\d+)\] (.*)$")  # absl/glog E and F lines
_PY_ERROR = re.compile(r"^((?:\w+\.)*\w*(?:Error|Exception)): (.*)$")
_BAD_FLAG = (
    re.compile(r"Unknown flags? in XLA_FLAGS: (.+)$"),
    re.compile(r"Couldn't interpret value (.+?) for flag (\S+?)\.?$"),
    re.compile(r'Could not open file "(.+?)" to read flags for environment variable "XLA_FLAGS"'),
)
_JAX_FLAG = re.compile(r'for (?:JAX flag|environment) \W?(\w+)')


def _xla_flag_hint(message: str) -> str | None:
    for i, pattern in enumerate(_BAD_FLAG):
        m = pattern.search(message)
        if not m:
            continue
        if i == 0 and "=" not in (flag := m.group(1).strip()):
            return (f"XLA does not know the flag {flag} as written, with no value: where its "
                    f"value follows after a space in XLA_FLAGS, join them with '=' "
                    f"({flag}=value); otherwise remove it (or check its spelling against the XLA "
                    "version jaxlib ships)")
        if i == 0:
            return (f"XLA does not know the flag {flag}: remove it from XLA_FLAGS (or check its "
                    "spelling against the XLA version jaxlib ships; a TensorFlow option such as "
                    "intra_op_parallelism_threads is no XLA flag)")
        if i == 1:
            return (f"XLA_FLAGS gives {m.group(2)} the value {m.group(1)}, which XLA cannot read: "
                    "fix the value or remove the flag")
        return (f"XLA_FLAGS={m.group(1)!r} does not start with '--', so XLA took it for a file "
                "of flags and could not open it: write flags as --name=value")
    return None


def _python_hint(kind: str, message: str, environ: Mapping[str, str]) -> str:
    if kind in ("ModuleNotFoundError", "ImportError") and "helpers" in message:
        return ("the probe could not import the kit itself: run the doctor from the kit's "
                "environment (`make doctor`), or `pip install -e .` there")
    if kind in ("ModuleNotFoundError", "ImportError"):
        return ("JAX cannot be imported in this environment: install it with "
                "`pip install -U jax` (or `make venv` in this kit) and check `pip show jax jaxlib` "
                "report the same version")
    m = _JAX_FLAG.search(message)
    if m:
        flag = m.group(1)
        var = flag.upper() if flag.lower().startswith("jax_") else flag
        value = environ.get(var)
        shown = f"={value!r}" if value is not None else ""
        return f"{var}{shown} is not a value JAX accepts: fix or unset it before starting Python"
    if "default_device" in message:
        value = environ.get("JAX_DEFAULT_DEVICE")
        return (f"JAX_DEFAULT_DEVICE={value!r} is not a platform JAX knows: set it to a platform "
                "name such as cpu or gpu, or unset it")
    if "JAX_PLATFORMS" in message or "Unable to initialize backend" in message:
        return "check JAX_PLATFORMS (unset it, or set JAX_PLATFORMS=cpu to skip a broken plugin)"
    return "the line above is JAX's own error; the environment checks below may name the cause"


def explain_child_failure(result: child.ChildResult, environ: Mapping[str, str]
                          ) -> FailedBackend:
    """Turn a child that gave no report into one named failure: the line XLA or Python wrote,
    and what to do."""
    lines = [x.strip() for x in result.stderr.splitlines() if x.strip()]
    xla = [m for m in (_GLOG.match(x) for x in lines) if m]
    if xla:  # XLA's fatal log: quote it (and the error line before it), name the flag
        quoted = " | ".join(f"[{m.group(1)}] {m.group(2)}" for m in xla[:2])
        hint = next((h for h in (_xla_flag_hint(m.group(2)) for m in xla) if h), None)
        return FailedBackend("(XLA start-up)", f"XLA stopped the process: {quoted}",
                             hint or "XLA's own message above names the cause; check XLA_FLAGS")
    py = [m for m in (_PY_ERROR.match(x) for x in lines) if m]
    if py:
        kind, message = py[-1].group(1), py[-1].group(2)
        short = kind.rsplit(".", 1)[-1]
        return FailedBackend("(jax import)", f"{short}: {message}",
                             _python_hint(short, message, environ))
    return FailedBackend("(child process)", result.describe_failure(),
                         "run `python -c 'import jax; print(jax.devices())'` to see JAX's "
                         "own output")


def _fallback_report(result: child.ChildResult, environ: Mapping[str, str]) -> DeviceReport:
    found, plugins = versions()
    return DeviceReport(
        backends=(),
        failed_backends=(explain_child_failure(result, environ),),
        default_backend=None,
        default_device=None,
        default_device_source="JAX did not start in the probe process (see below)",
        platforms_requested=environ.get("JAX_PLATFORMS") or None,
        environment=settings.read_environment(dict(environ)),
        warnings=settings.check_environment(dict(environ), this_process=False),
        versions=MappingProxyType(found),
        plugins=MappingProxyType(plugins),
    )


def diagnose(env: Mapping[str, str | None] | None = None, *, timeout: float = 120
             ) -> DeviceReport:
    """The doctor's report, probed in a fresh process under this environment plus ``env``
    (``None`` removes a variable). Never raises for anything JAX, XLA or the environment does:
    a child that cannot report becomes a report of why."""
    try:
        report = devices.probe_in_child(env, timeout=timeout)
    except ChildProcessFailed as err:
        return _fallback_report(err.result, child.child_env(env))
    if unused := _gpu_without_backend(report, child.child_env(env)):
        report = dataclasses.replace(report, warnings=(*report.warnings, unused))
    here = _caller_in_a_job()
    if here is not None:  # the child cannot join the caller's job: the caller's own view
        report = dataclasses.replace(report, processes=here)
    differs = _caller_differs(report)
    if differs is None or here is not None:  # a job's process sees every process's devices
        return report
    return dataclasses.replace(report, warnings=(*report.warnings, differs))


def _gpu_without_backend(report: DeviceReport, environ: Mapping[str, str]) -> EnvWarning | None:
    """A warning where the driver lists an NVIDIA GPU, JAX_PLATFORMS does not leave it out,
    and JAX started no GPU backend because no CUDA plugin is installed: the CPU-only jax on a
    GPU machine ("No GPU/TPU found, falling back to CPU", kuprel/min-dalle#22). None otherwise
    (a plugin that failed to start is under the backends that did not start)."""
    from helpers import gpu

    if any(b.name in ("cuda", "gpu", "rocm") for b in report.backends):
        return None
    platforms = {p.strip() for p in (environ.get("JAX_PLATFORMS") or "").split(",") if p.strip()}
    if platforms and not {"cuda", "gpu"} & platforms:
        return None  # the GPU left out on purpose
    if gpu.cuda_plugins() or not (found := gpu.gpus()):
        return None
    names = ", ".join(sorted({g.name for g in found}))
    started = ", ".join(b.name for b in report.backends) or "no backend"
    return EnvWarning(
        "gpu-without-jax-backend",
        f"the driver lists an NVIDIA GPU ({names}), but JAX started {started} only: no JAX CUDA "
        "plugin is installed, so JAX falls back to the CPU (\"No GPU/TPU found, falling back "
        "to CPU\"; the CPU-only jax, kuprel/min-dalle#22).",
        f"{gpu.INSTALL_HINT}, then restart Python",
    )


def _caller_in_a_job() -> devices.ProcessView | None:
    """The calling process's :class:`~helpers.devices.ProcessView` when it has joined a
    multi-process job (``jax.distributed.initialize``); None otherwise (never starts JAX)."""
    if "jax" not in sys.modules:
        return None
    import jax

    try:
        return devices.process_view() if jax.distributed.is_initialized() else None
    except Exception:  # pragma: no cover - a job whose backend cannot start
        return None


def _caller_differs(report: DeviceReport) -> EnvWarning | None:
    """A warning when the process that asked has started JAX with other devices than the
    fresh child saw (``jax_num_cpu_devices`` set in code, the environment changed since it
    started): the report describes a new process, not this one. None when they agree, or when
    JAX has not started here (the CLI)."""
    if not jaxcompat.backends_started():
        return None
    from jax.extend.backend import backends

    try:
        here = {name: len(client.devices()) for name, client in backends().items()}
    except Exception:  # pragma: no cover - backends started, so they answer
        return None
    there = {b.name: len(b.devices) for b in report.backends}
    if here == there:
        return None

    def say(counts: Mapping[str, int]) -> str:
        return ", ".join(f"{n} {name} device{'s' if n != 1 else ''}"
                         for name, n in sorted(counts.items())) or "no backend"

    return EnvWarning(
        "caller-differs",
        f"this report describes a fresh process started with the environment as it is now: it has "
        f"{say(there)}; the process that called the doctor has {say(here)}, set when its JAX "
        "started (jax.config in code, or variables changed since).",
        "to see this process, call helpers.devices.probe() in it; for a new process to match, "
        "set the variables before Python starts",
    )


# --- the bug report JAX asks for ---------------------------------------------------------------
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW(OR)?D|API_?KEY|ACCESS_?KEY|CREDENTIAL|AUTH", re.I)


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with nothing private left: the values of variables whose names say secret
    (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*API_KEY*``, ...), the home folder (as ``~``)
    and any ``/home/<name>`` or ``/Users/<name>`` path, the user name, and the host name.

    >>> redact("dump to /home/alice/x on node='box1'", {"HOME": "/home/alice", "USER": "alice"})
    "dump to ~/x on node='<host>'"
    """
    env = os.environ if environ is None else environ
    secrets = {v for k, v in env.items() if _SECRET_NAME.search(k) and v and len(v) >= 4}
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, "<redacted>")
    home = (env.get("HOME") or "").rstrip("/")
    if len(home) > 1:
        text = text.replace(home, "~")
    text = re.sub(r"/(?:home|Users)/[^/\s'\"]+", "~", text)
    user = env.get("USER") or env.get("LOGNAME") or ""
    if len(user) >= 3 and user != "root":
        text = re.sub(rf"\b{re.escape(user)}\b", "<user>", text)
    text = re.sub(r"node='[^']*'", "node='<host>'", text)  # print_environment_info's uname
    host = platform.node()
    if len(host) >= 4:
        text = re.sub(rf"\b{re.escape(host)}\b", "<host>", text)
    return text


def bug_report(report: DeviceReport | None = None, *,
               environ: Mapping[str, str] | None = None) -> str:
    """A Markdown block to paste into a JAX issue: ``jax.print_environment_info()``'s text (what
    JAX's issue template asks for), then the doctor's findings (backends, devices, settings,
    warnings, installed plugins) folded under it, with nothing private in it (:func:`redact`).
    ``report`` defaults to a fresh :func:`diagnose`."""
    report = diagnose() if report is None else report
    info = report.jax_environment_info.strip() or (
        "(not available: JAX did not start in the probe process; the doctor's report below "
        "says why)")
    plugins = ", ".join(f"{k} {v}" for k, v in report.plugins.items()) or "none"
    warned = ", ".join(w.code for w in report.warnings) or "none"
    text = "\n".join([
        "### System info",
        "",
        "`jax.print_environment_info()`:",
        "",
        "```text",
        info,
        "```",
        "",
        f"Plugins: {plugins}. Doctor's warnings: {warned}.",
        "",
        "<details><summary>JAX Device Kit doctor report "
        "(<code>python -m helpers doctor --bug-report</code>)</summary>",
        "",
        "```text",
        str(report),
        "```",
        "",
        "</details>",
    ])
    return redact(text, environ)
