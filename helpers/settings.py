"""The environment variables that decide where JAX puts arrays and how much memory it takes,
and the known mistakes in them.

Capture only: :func:`read_environment` returns plain data, :func:`check_environment` returns
warnings for known mistakes, one small rule each (:data:`RULES`). Both read ``os.environ`` and
JAX's config; neither starts a backend. The wording of each warning comes from what JAX and XLA
were seen to do (JAX 0.10.2), not from guesses.

What is checked comes from what JAX itself reads: ``jaxlib/xla_client.py`` reads the
``XLA_PYTHON_CLIENT_*`` / ``XLA_CLIENT_MEM_FRACTION`` variables once, when the GPU backend
starts (:data:`ALLOCATOR_VARS`); ``jax`` reads ``JAX_PLATFORMS`` and ``JAX_DEFAULT_DEVICE`` once,
at ``import jax``.

>>> [w.code for w in check_environment({"XLA_PYTHON_CLIENT_PREALLOCATE": "no"})]
['preallocate-ambiguous']
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from helpers._internal import forks
from helpers._internal.jaxcompat import (
    ALLOCATOR_VARS,
    BOOL_FALSE,
    BOOL_TRUE,
    DEFAULT_MEM_FRACTION,
    PREALLOCATE_OFF,
    backend_start_snapshot,
    backends_started,
    config_global,
    expand_platform_alias,
    started_at,
    started_importing,
    x64_asked,
)
from helpers._internal.records import Display, Record
from helpers.units import format_bytes

__all__ = ["ALLOCATOR_VARS", "PROCESS_RULES", "RULES", "VARIABLES", "EnvVar", "EnvWarning",
           "ProcessCheck", "backend_start_snapshot", "check_environment", "check_process",
           "read_environment"]

#: name -> what it governs (one line, shown in the doctor report)
VARIABLES: dict[str, str] = {
    "JAX_PLATFORMS": "which backends JAX starts, in priority order (read at `import jax`)",
    "JAX_DEFAULT_DEVICE": "platform of the default device (read at `import jax`)",
    "JAX_NUM_CPU_DEVICES": "number of CPU devices (simulated devices; before backends start)",
    "JAX_TRANSFER_GUARD": "log or disallow implicit host<->device transfers",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "GPU: take the whole pool at the first allocation (default "
                                     "true); false grows it on demand, up to the same cap",
    "XLA_CLIENT_MEM_FRACTION": "GPU: the pool's cap, as a fraction of total memory (default 0.75)",
    "XLA_PYTHON_CLIENT_MEM_FRACTION": "GPU: deprecated name of XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR": "GPU: allocator (default, platform, bfc, cuda_async, vmm)",
    "CUDA_VISIBLE_DEVICES": "which NVIDIA GPUs the process can see",
    "XLA_FLAGS": "flags passed to the XLA compiler and runtime",
}


@dataclass(frozen=True)
class EnvVar(Record):
    """One environment variable: its value now (None: not set) and what it governs."""

    name: str
    value: str | None  # None: not set
    meaning: str


# --- capture ------------------------------------------------------------------------------
def read_environment(environ: dict[str, str] | None = None) -> tuple[EnvVar, ...]:
    env = os.environ if environ is None else environ
    return tuple(EnvVar(name, env.get(name), meaning) for name, meaning in VARIABLES.items())


def check_environment(
    environ: dict[str, str] | None = None,
    *,
    started_platforms: tuple[str, ...] = (),
    this_process: bool = True,
) -> tuple[EnvWarning, ...]:
    """Known mistakes in the placement/allocation variables (one rule each, :data:`RULES`).

    started_platforms: platforms whose backends are running in this process (used to tell
    that a variable was changed after it was read). this_process=False: ``environ`` belongs
    to another process, so only the rules that read the environment alone run.
    """
    env = dict(os.environ if environ is None else environ)
    rules = RULES if this_process else tuple(r for r in RULES if r not in PROCESS_RULES)
    return tuple(w for rule in rules for w in rule(env, started_platforms))


@dataclass(frozen=True)
class ProcessCheck(Display):
    """This running process, not a fresh one: the backends it started, their devices, the
    variables as they were when they started (where the kit saw it), and what is wrong now."""

    platforms: tuple[str, ...]  # backends started in this process
    devices: Mapping[str, int]  # platform -> number of devices
    started_with: Mapping[str, Mapping[str, str | None]]  # platform -> {variable: value}
    hook: str  # "installed", "late", "unavailable", "not installed": how started_with is known
    warnings: tuple[EnvWarning, ...]
    #: the line outside JAX whose operation started the first backend, "" where the kit did not
    #: see it start; and whether that line ran inside an import (huggingface/diffusers#1794)
    started_at: str = ""
    started_importing: bool = False


def check_process() -> ProcessCheck:
    """The checks of :func:`check_environment` for the process that calls it: what its JAX
    backends started with against the environment now, settings that are JAX's defaults,
    ``jax.default_device`` assigned instead of used in ``with``, a GPU backend that holds its
    pool while every array is on the CPU. Starts no backend: before JAX started, only the
    environment is checked.

    >>> c = check_process()
    >>> all(w.message and w.fix for w in c.warnings)  # each names the cause and the fix
    True
    """
    platforms: tuple[str, ...] = ()
    counts: dict[str, int] = {}
    if backends_started():
        from jax.extend.backend import backends

        for name, client in backends().items():
            counts[name] = len(client.local_devices())  # (a job's: this process's own)
        platforms = tuple(counts)
    state, _ = backend_start_snapshot()
    started = {}
    for platform in platforms:
        then = _started_with(platform)
        if then:
            started[platform] = MappingProxyType(dict(then))
    return ProcessCheck(platforms, MappingProxyType(counts), MappingProxyType(started), state,
                        check_environment(started_platforms=platforms),
                        started_at() if platforms else "",
                        started_importing() if platforms else False)


# --- the rules: one per known mistake ------------------------------------------------------
_ALLOCATORS = ("default", "platform", "bfc", "cuda_async", "vmm")
_GPU_PLATFORMS = ("cuda", "rocm", "gpu")
_SET_BEFORE_START = ("set these before the first JAX operation (restart the kernel and set them "
                     "in the first cell), or run the experiment in a child process")


@dataclass(frozen=True)
class EnvWarning(Record):
    """A known mistake in the environment: a stable code, what is wrong, and the fix."""

    code: str  # stable identifier, e.g. "both-mem-fractions"
    message: str  # what is wrong
    fix: str  # what to do


def _jax_config_value(name: str):
    try:
        return getattr(sys.modules["jax"].config, name)
    except Exception:  # pragma: no cover
        return None


# --- checks: one rule per known mistake ---------------------------------------------------
# Each rule takes the environment (a mapping) and the platforms whose backends are running,
# and returns the warnings it finds (usually none). check_environment runs RULES in order.
def _both_fractions(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    new, old = env.get("XLA_CLIENT_MEM_FRACTION"), env.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if not (new and old):
        return []
    return [EnvWarning(
        "both-mem-fractions",
        f"XLA_CLIENT_MEM_FRACTION={new} and XLA_PYTHON_CLIENT_MEM_FRACTION={old} are both "
        "set; JAX refuses to start the GPU backend (ValueError).",
        "unset XLA_PYTHON_CLIENT_MEM_FRACTION (the deprecated name) and keep "
        "XLA_CLIENT_MEM_FRACTION",
    )]


def _fraction_values(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    out = []
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        value = env.get(name)
        if not value:
            continue
        try:
            fraction = float(value)
        except ValueError:
            out.append(EnvWarning(
                "bad-mem-fraction",
                f"{name}={value!r} is not a number; the GPU backend will fail to start.",
                f"set {name} to a fraction such as 0.5",
            ))
            continue
        if not 0 < fraction <= 1:
            out.append(EnvWarning(
                "mem-fraction-out-of-range",
                f"{name}={value} is outside (0, 1]; it is a fraction of total GPU memory.",
                f"set {name} to a value in (0, 1], e.g. 0.5 for half the GPU",
            ))
    return out


def _preallocate(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    pre = env.get("XLA_PYTHON_CLIENT_PREALLOCATE")
    if not pre or pre in PREALLOCATE_OFF or pre in ("true", "True", "1"):
        return []
    return [EnvWarning(
        "preallocate-ambiguous",
        f"XLA_PYTHON_CLIENT_PREALLOCATE={pre!r} is read as TRUE: JAX turns preallocation "
        "off only for exactly 'false', 'False' or '0'.",
        "write XLA_PYTHON_CLIENT_PREALLOCATE=false to turn preallocation off",
    )]


def _allocator(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    alloc = env.get("XLA_PYTHON_CLIENT_ALLOCATOR")
    if not alloc or alloc.lower() in _ALLOCATORS:
        return []
    return [EnvWarning(
        "bad-allocator",
        f"XLA_PYTHON_CLIENT_ALLOCATOR={alloc!r} is not one of {', '.join(_ALLOCATORS)}; "
        "the GPU backend will fail to start.",
        "set XLA_PYTHON_CLIENT_ALLOCATOR=platform (allocate on demand) or unset it",
    )]


def _moot_under_platform(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # XLA's GpuAllocatorConfig (xla/pjrt/gpu/gpu_helpers.h): memory_fraction and preallocate
    # are "only used if kind == kBFC"; the platform allocator has no pool (from XLA's source,
    # not yet run on a GPU)
    if (env.get("XLA_PYTHON_CLIENT_ALLOCATOR") or "").lower() != "platform":
        return []
    moot = [f"{name}={env[name]}" for name in ("XLA_CLIENT_MEM_FRACTION",
                                               "XLA_PYTHON_CLIENT_MEM_FRACTION",
                                               "XLA_PYTHON_CLIENT_PREALLOCATE") if env.get(name)]
    if not moot:
        return []
    return [EnvWarning(
        "moot-beside-platform-allocator",
        f"XLA_PYTHON_CLIENT_ALLOCATOR=platform gives each buffer its own allocation from the "
        f"driver, with no pool, so {' and '.join(moot)} (a pool's size, and whether it is "
        "taken at start) have no effect beside it: the process takes what its arrays use, "
        "with no cap, and gives memory back as they are freed (XLA's allocator options, "
        "xla/pjrt/gpu/gpu_helpers.h: 'only used if kind == kBFC'; not yet run on a GPU).",
        "for a pool that grows on demand up to a cap, drop ALLOCATOR=platform and keep "
        "XLA_PYTHON_CLIENT_PREALLOCATE=false with the fraction as the cap; for memory given "
        "back as soon as it is freed (slower), keep ALLOCATOR=platform alone "
        "(flatironinstitute/nemos#208 set all three)",
    )]


def _no_visible_gpu(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() not in ("", "-1"):
        return []
    gpu = [p for p in started_platforms if p in _GPU_PLATFORMS]
    if gpu:  # set after the GPU backend started with its GPUs: too late to hide them
        return [EnvWarning(
            "no-visible-gpu",
            f"CUDA_VISIBLE_DEVICES={visible!r} now, but the {gpu[0]} backend already started "
            "with its GPUs: the change has no effect in this process (CUDA reads it once).",
            "set CUDA_VISIBLE_DEVICES before the first JAX operation (in the shell, or the "
            "notebook's first cell), then restart the kernel",
        )]
    return [EnvWarning(
        "no-visible-gpu",
        f"CUDA_VISIBLE_DEVICES={visible!r} hides every NVIDIA GPU from a process that starts "
        "JAX's GPU backend after it is set: JAX runs on the CPU.",
        "for a CPU-only run, JAX_PLATFORMS=cpu says so plainly (and starts no GPU backend); "
        "otherwise unset CUDA_VISIBLE_DEVICES, or list the GPU ids to use (e.g. 0)",
    )]


#: where JAX looks for an NVIDIA GPU before it starts its CUDA backend
#: (jax/_src/hardware_utils.py's ``_NVIDIA_GPU_DEVICES``, jax 0.8.0 to 0.12.0.1)
_NVIDIA_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")


def _cuda_alone_without_gpu(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # JAX_PLATFORMS=cuda where no NVIDIA GPU is visible: JAX skips cuda, then has no backend
    value = env.get("JAX_PLATFORMS", "")
    asked = _requested(value)
    if not asked or any(group != {"cuda"} for group in asked) or started_platforms or any(
            os.path.exists(f) for f in _NVIDIA_DEVICE_FILES):
        return []
    return [EnvWarning(
        "cuda-alone-without-gpu",
        f"JAX_PLATFORMS={value!r} asks for the CUDA backend alone, and no NVIDIA GPU is "
        f"visible to this process (none of {', '.join(_NVIDIA_DEVICE_FILES)}): JAX then skips "
        "'cuda' without a word and its first operation fails with a bare AssertionError "
        "(jax/_src/xla_bridge.py's backends(); run on jax 0.8.0, 0.10.2 and 0.12.0.1).",
        "let JAX fall back to the CPU, JAX_PLATFORMS=cuda,cpu (jax-ml/jax#23208), or unset it; "
        "on a GPU machine, make the GPU visible to this process (a container needs --gpus "
        "all), then restart the kernel",
    )]


def _two_cpu_counts(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    if not ("xla_force_host_platform_device_count" in env.get("XLA_FLAGS", "")
            and env.get("JAX_NUM_CPU_DEVICES")):
        return []
    return [EnvWarning(
        "two-cpu-device-counts",
        "both XLA_FLAGS=--xla_force_host_platform_device_count and JAX_NUM_CPU_DEVICES "
        "set the number of CPU devices.",
        "keep JAX_NUM_CPU_DEVICES (or jax.config.update('jax_num_cpu_devices', N)) and drop "
        "the XLA flag",
    )]


def _cpu_device_count(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # Observed with JAX 0.10.2: jax parses the variable with int() at `import jax`; 0 fails when
    # the CPU backend starts; a negative count means "not set" (JAX's own default is -1).
    value = env.get("JAX_NUM_CPU_DEVICES")
    if value is None:
        return []
    fix = "set JAX_NUM_CPU_DEVICES to a whole number of devices, e.g. 4, or unset it"
    try:
        count = int(value)
    except ValueError:
        return [EnvWarning(
            "bad-cpu-device-count",
            f"JAX_NUM_CPU_DEVICES={value!r} is not an integer; `import jax` fails with "
            f"ValueError: Invalid value \"{value}\" for JAX flag jax_num_cpu_devices.",
            fix,
        )]
    if count == 0:
        return [EnvWarning(
            "bad-cpu-device-count",
            "JAX_NUM_CPU_DEVICES=0 asks for no CPU devices; `import jax` works but the CPU "
            "backend fails to start (RuntimeError: Unable to initialize backend 'cpu': "
            "INVALID_ARGUMENT: Could not determine process_index for this process).",
            fix,
        )]
    if count < -1:
        return [EnvWarning(
            "cpu-device-count-ignored",
            f"JAX_NUM_CPU_DEVICES={value} is negative, which JAX reads as 'not set': you get "
            "the default number of CPU devices (1, or --xla_force_host_platform_device_count "
            "from XLA_FLAGS), without a warning.",
            fix,
        )]
    return []


def _flag_words(flags: str) -> list[str]:
    """XLA_FLAGS split into words on whitespace, keeping quoted values together, to name
    every mistake in it (XLA itself stops at the first: :func:`_xla_reads`)."""
    try:
        return shlex.split(flags)
    except ValueError:  # an unbalanced quote
        return flags.split()


_SPACE = " \t\r\n"  # what XLA skips between flags
#: a value that starts with '-' (a negative number): XLA reads it as a flag of its own
_NEGATIVE = re.compile(r"-\d[\d.eE+-]*")


def _xla_reads(flags: str) -> tuple[list[str], str]:
    """(the flags XLA reads from a value of XLA_FLAGS that starts with '-', the rest it never
    reads). XLA's parser (ParseArgvFromString in xla/parse_flags_from_env.cc) reads words that
    start with '-', a flag's quoted value (--name="a b") as one, and gives up at the first
    word that does not start with '-': that word and every one after it are dropped without a
    warning (run: '--xla_cpu_enable_fast_math=false stray
    --xla_force_host_platform_device_count=2' gives 1 CPU device)."""
    n, read, b = len(flags), [], len(flags) - len(flags.lstrip(_SPACE))
    while b < n and flags[b] == "-":
        e = b
        while e < n and flags[e].isascii() and (flags[e] in "-_" or flags[e].isalnum()):
            e += 1
        if e + 1 < n and flags[e] == "=" and flags[e + 1] in "'\"":
            name, quote, e, value = flags[b:e + 1], flags[e + 1], e + 2, []
            while e < n and flags[e] != quote:
                if quote == '"' and flags[e] == "\\" and e + 1 < n:
                    e += 1
                value.append(flags[e])
                e += 1
            read.append(name + "".join(value))
            e += e < n  # past the closing quote
        else:
            while e < n and flags[e] not in _SPACE:
                e += 1
            read.append(flags[b:e])
        b = n - len(flags[e:].lstrip(_SPACE))
    return read, flags[b:]


def _xla_flags(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # Syntax only, as XLA reads it (xla/parse_flags_from_env.cc): a value whose first
    # non-whitespace character is '-' is flags, anything else is the name of a file of flags.
    # XLA aborts the whole process on an unknown flag name too, but the names it knows are not
    # listed anywhere cheap to read, so they are not checked here.
    value = env.get("XLA_FLAGS")
    if not value:
        return []
    example = "e.g. XLA_FLAGS='--xla_force_host_platform_device_count=8'"
    out = _xla_flags_look_alike(value)
    if not value.lstrip().startswith("-"):
        if os.path.isfile(value):  # XLA reads the flags from this file; not checked further
            return out
        return [*out, EnvWarning(
            "malformed-xla-flags",
            f"XLA_FLAGS={value!r} does not start with '-', so XLA takes the whole value for "
            "the name of a file of flags; there is no such file, and XLA aborts the process "
            "when JAX starts its first backend (\"Could not open file ... to read flags for "
            "environment variable XLA_FLAGS\").",
            f"write each flag as --name=value, separated by spaces, {example}",
        )]
    words = _flag_words(value)
    _, rest = _xla_reads(value)
    stop, *after = _flag_words(rest) or [""]
    lost = [w for w in after if w.startswith("--")]
    # a whole flag in quotes: XLA takes quotes only around a value, and stops there
    quoted = rest.split()[0] if rest[:1] in ("'", '"') and stop.startswith("-") else ""
    # what XLA reads, and the word it stops at: a flag after that is never read, so it cannot
    # abort the process (a review)
    prefix = value[:len(value) - len(rest)]  # what XLA read
    heard = [*_flag_words(prefix), *([stop] if stop else [])]
    # a value after a flag with no '=': XLA reads the flag alone; a word is where it stops
    # reading, a negative number a flag of its own (XLA aborts)
    spaced = [(a, b) for a, b in zip(heard, heard[1:], strict=False)
              if a.startswith("--") and "=" not in a and "=" not in b
              and (not b.startswith("-") or _NEGATIVE.fullmatch(b))]
    values = {b for _, b in spaced}
    single = [w for w in heard[:len(heard) - bool(stop)] if w.startswith("-")
              and not w.startswith("--") and w not in values]
    bare = [w for w in words if not w.startswith("-") and w not in values]
    # a backslash before a space: XLA keeps the backslash and stops at the word after it
    escaped = stop if stop and prefix.rstrip().endswith("\\") else ""
    if stop and not quoted and stop not in values and stop not in bare:
        bare.insert(0, stop)  # (a word shlex joins another way: the backslash's)
    lost_said = _listed(lost)
    if single:
        out.append(EnvWarning(
            "malformed-xla-flags",
            f"XLA_FLAGS has a flag with one dash ({', '.join(map(repr, single))}): XLA knows "
            "only '--name=value' and aborts the process when JAX starts its first backend "
            f"(\"Unknown flag in XLA_FLAGS: {single[0]}\").",
            f"start every flag with two dashes, {example}",
        ))
    if spaced:
        flag, given = spaced[0]
        if _NEGATIVE.fullmatch(given):
            said = (f"XLA reads {flag} with no value and {given} as a flag of its own, and "
                    "aborts the process when JAX starts its first backend (\"Unknown flag in "
                    f"XLA_FLAGS: {given}\" for a true/false flag; \"Unknown flags in "
                    f"XLA_FLAGS: {flag} {given}\" for one that takes a number).")
        else:
            said = (f"XLA reads {flag} with no value and stops reading XLA_FLAGS at "
                    f"{given!r}, the first word that does not start with '-'"
                    + (f": {lost_said} after it {'is' if len(lost) == 1 else 'are'} never "
                       "read, without a warning" if lost and given == stop else "")
                    + ". A flag that takes a number or a name "
                    "then aborts the process when JAX starts its first backend (\"Unknown flag "
                    f"in XLA_FLAGS: {flag}\"); a true/false flag is set to true, whatever the "
                    "word said.")
        out.append(EnvWarning(
            "malformed-xla-flags",
            f"XLA_FLAGS gives {flag} its value {given!r} after a space: {said}",
            f"join each flag to its value with '=': {flag}={shlex.quote(given)}",
        ))
    if bare or quoted:
        ours = [w for w in bare if w.startswith("xla_")]
        others = [w for w in bare if not w.startswith("xla_") and w != escaped]
        fix = [f"start {', '.join(map(repr, ours))} with '--' ({example})"] if ours else []
        if escaped:
            fix.append(f"quote the value that holds a space, not a backslash before it: XLA "
                       f"keeps the backslash and stops at {escaped!r} (--name=\"a b\")")
        if others:
            # TensorFlow's session options are no XLA flags: with '--', XLA aborts
            fix.append(f"remove {', '.join(map(repr, others))}: a word that names no XLA "
                       "flag aborts the process once it starts with '--' (\"Unknown flag in "
                       "XLA_FLAGS\")")
        if any("thread" in w for w in others):
            fix.append("to give JAX's CPU backend fewer threads, give the process fewer CPUs "
                       "(taskset -c 0-3 python ..., or os.sched_setaffinity before import jax; "
                       "hawkinsp in jax-ml/jax#1539)")
        if quoted:
            fix.append(f"remove the quotes around {quoted}: XLA takes quotes only around a "
                       "value (--name=\"a b\")")
        said = ("XLA stops reading XLA_FLAGS at the first of them"
                + (f", {quoted or stop!r}" if len(bare) > 1 or quoted else "")
                + ", without a warning: it has no effect"
                + (f", nor {'has' if len(lost) == 1 else 'have'} {lost_said} after it."
                   if lost else ".")
                if stop not in values else
                "XLA stopped reading XLA_FLAGS before them (above), so they have no effect.")
        out.append(EnvWarning(
            "xla-flags-ignored",
            f"XLA_FLAGS has words that do not start with '-' "
            f"({', '.join(map(repr, [quoted] if quoted else bare))}). {said}",
            "; ".join(fix),
        ))
    return out


def _listed(flags: list[str]) -> str:
    """'--a', '--a and --b', '--a, --b and 2 more'."""
    if len(flags) <= 2:
        return " and ".join(flags)
    return f"{flags[0]}, {flags[1]} and {len(flags) - 2} more"


#: characters that look like ASCII in a flag but are not (pasted from a web page or a word
#: processor): XLA sees another character and the flag is not the one meant
_LOOK_ALIKE = {"\u2013": "-", "\u2014": "-", "\u2212": "-", "\u2010": "-", "\u2011": "-",
               "\u00a0": " ", "\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"}


def _xla_flags_look_alike(value: str) -> list[EnvWarning]:
    odd = sorted({c for c in value if ord(c) > 127})
    if not odd:
        return []
    named = ", ".join(f"{c!r} (U+{ord(c):04X} {unicodedata.name(c, 'unnamed')})" for c in odd)
    fixed = "".join(_LOOK_ALIKE.get(c, c) for c in value)
    return [EnvWarning(
        "non-ascii-xla-flags",
        f"XLA_FLAGS contains {named}, not plain ASCII: a dash or quote pasted from a web page "
        "or a word processor is another character to XLA, so the flag is not the one meant "
        "(a flag that does not start with '-' makes XLA read a file of that name instead).",
        f"retype it in ASCII: XLA_FLAGS={fixed!r}" if fixed != value else
        "retype XLA_FLAGS in plain ASCII",
    )]


def _platforms_after_import(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # Set too late: JAX read JAX_PLATFORMS at import; the env now says something else. Once
    # the backends started, the ones running are the truth (jax.config can be updated after,
    # to no effect: jax#10320); before, what JAX read is its config.
    if "jax" not in sys.modules:
        return []
    configured = _jax_config_value("jax_platforms")
    wanted = env.get("JAX_PLATFORMS")
    if started_platforms:
        return _platforms_against_running(wanted, configured, tuple(started_platforms))
    if wanted is None or (wanted or None) == (configured or None):
        return []
    return [EnvWarning(
        "platforms-set-after-import",
        f"JAX_PLATFORMS is {wanted!r} now but JAX read {configured!r} when it was "
        "imported; the change has no effect in this process.",
        "set JAX_PLATFORMS before `import jax` (first cell of the notebook, or in the "
        "shell), then restart the kernel",
    )]


def _requested(value: str) -> list[set[str]]:
    """The platforms a JAX_PLATFORMS value asks for, each with its aliases spelled out ("gpu":
    cuda or rocm)."""
    return [set(expand_platform_alias(part.strip().lower()))
            for part in value.split(",") if part.strip()]


def _platforms_against_running(wanted: str | None, configured: str | None,
                               running: tuple[str, ...]) -> list[EnvWarning]:
    def runs(value: str) -> bool:  # JAX would start just these: are they the ones running?
        asked = _requested(value)
        return not asked or (all(group & set(running) for group in asked)
                             and set(running) <= set().union(*asked))

    now = ", ".join(running)
    out = []
    if wanted and not runs(wanted):
        out.append(EnvWarning(
            "platforms-set-after-import",
            f"JAX_PLATFORMS is {wanted!r} now, but the backends running are {now}: JAX reads "
            "JAX_PLATFORMS once, at import, so the change has no effect in this process.",
            "set JAX_PLATFORMS before `import jax` (first cell of the notebook, or in the "
            "shell), then restart the kernel"))
    if configured and configured != wanted and not runs(configured):
        out.append(EnvWarning(
            "platforms-updated-after-start",
            f"jax_platforms is {configured!r} in JAX's config, but the backends running are "
            f"{now}: jax.config.update('jax_platforms', ...) after the backends started has "
            "no effect in this process.",
            "update it before the first JAX operation (or set JAX_PLATFORMS before `import "
            "jax`), then restart the kernel"))
    return out


def _x64_after_import(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # JAX reads JAX_ENABLE_X64 at import: set later, float64 stays float32 (0.8.0, 0.10.2)
    if "jax" not in sys.modules:
        return []
    wanted = x64_asked(env)
    if not env.get("JAX_ENABLE_X64", "").strip() or \
            wanted == bool(_jax_config_value("jax_enable_x64")):
        return []
    return [EnvWarning(
        "x64-set-after-import",
        f"JAX_ENABLE_X64 is {env['JAX_ENABLE_X64']!r} now, but 64-bit types are "
        f"{'off' if wanted else 'on'} in JAX (it reads the variable once, at import): "
        f"float64 arrays are {'made as float32' if wanted else 'made as float64'} in this "
        "process.",
        "set JAX_ENABLE_X64 before `import jax`, or call "
        f"jax.config.update('jax_enable_x64', {wanted}) (it applies to what runs after it: "
        "arrays already made keep their dtype, a library's module-level arrays among them, "
        "so call it before importing such a library; ArgonneCPAC/dsps#108)",
    )]


#: options another JAX_ variable sets too (JAX_TRANSFER_GUARD sets its three directions) or
#: the kit's transfer trace holds: their value need not be their own variable's (a review)
_SET_BY_OTHERS = ("jax_transfer_guard",)
#: JAX_ variables with rules of their own (or read when a backend starts, not at import)
_OWN_RULES = ("JAX_PLATFORMS", "JAX_ENABLE_X64", "JAX_PLATFORM_NAME", "JAX_NUM_CPU_DEVICES")


def _read_as(raw: str, like):
    """``raw``, an environment variable's text, read as JAX reads one into a config option of
    ``like``'s type (bool_env's words for a bool); None where it cannot be said."""
    text = raw.strip()
    try:
        if isinstance(like, bool):
            low = text.lower()
            return True if low in BOOL_TRUE else False if low in BOOL_FALSE else None
        if isinstance(like, int):
            return int(text)
        if isinstance(like, float):
            return float(text)
    except ValueError:
        return None
    return text if isinstance(like, str) or like is None else None


def _config_after_import(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # JAX reads each JAX_ variable of a config option once, at import (jax/_src/config.py):
    # JAX_COMPILATION_CACHE_DIR put in os.environ in a cell after `import jax` does nothing
    values = getattr(sys.modules["jax"].config, "values", None) if "jax" in sys.modules \
        else None
    if not isinstance(values, dict):
        return []
    out = []
    for key in sorted(env):
        name = key.lower()
        if not key.startswith("JAX_") or key in _OWN_RULES or name not in values or \
                name.startswith(_SET_BY_OTHERS):
            continue
        now = config_global(name, values[name])  # (not a `with jax.<option>()` block's)
        wanted = _read_as(env[key], now)
        if wanted is None or wanted == now or (now is None and not wanted):
            continue
        out.append(EnvWarning(
            "jax-variable-after-import",
            f"{key} is {env[key]!r} now, but jax.config.{name} is {now!r}: JAX reads the "
            "variable once, at import, so setting it later (os.environ in a cell after "
            "`import jax`) does nothing in this process (or jax.config.update set the option "
            "otherwise since).",
            f"call jax.config.update({name!r}, {wanted!r}), which applies to what runs after "
            "it (checked for jax_compilation_cache_dir after a first compile: jax 0.8.0, "
            f"0.10.2, 0.11.2), or set {key} before `import jax`"))
    return out


#: JAX's debugging switches that slow every step while on: (option, what it costs)
_DEBUG_SWITCHES = (
    ("jax_debug_nans", "NaN"), ("jax_debug_infs", "inf"))


def _debug_checks_on(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # left on after a NaN hunt, they slow training without a word (jax-ml/jax#13789)
    if "jax" not in sys.modules:
        return []
    out = []
    for name, what in _DEBUG_SWITCHES:
        if _jax_config_value(name) is True:
            out.append(EnvWarning(
                f"{name.removeprefix('jax_').replace('_', '-')}-on",
                f"{name} is on: after each jitted call JAX reads its outputs back to look for "
                f"{what} values (jax/_src/dispatch.py), so a call waits for its result and the "
                "host cannot queue the next step meanwhile, each operation outside jit "
                f"is checked the same way, and where one is found JAX runs the function again "
                "op by op. Left on after debugging, it slows every step without a word "
                "(jax-ml/jax#13789).",
                f"jax.config.update({name!r}, False) when you are not looking for {what} values "
                f"(and unset JAX_{name.removeprefix('jax_').upper()} for the next run)"))
    if _jax_config_value("jax_disable_jit") is True:
        out.append(EnvWarning(
            "jit-disabled",
            "jax_disable_jit is on: every jax.jit runs its function op by op in Python, each "
            "operation its own dispatch and its own array, with no compiled program: slow, "
            "and none of XLA's fusion or buffer reuse.",
            "jax.config.update('jax_disable_jit', False), or use `with jax.disable_jit():` "
            "around the code being debugged only (this check cannot tell it from that block, "
            "where it is on too)"))
    return out


def _allocator_after_start(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # Set too late: allocator variables changed after the GPU backend started.
    gpu_started = [p for p in started_platforms if p in _GPU_PLATFORMS]
    if not gpu_started:
        return []
    out = []
    state, _ = backend_start_snapshot()
    for platform in gpu_started:
        then = _started_with(platform)
        if then is None:
            seen = _running_allocator(platform)
            if seen is not None:  # no snapshot, but the allocator's own numbers say enough
                out += _allocator_against_its_numbers(env, platform, *seen)
            elif state == "unavailable":
                out.append(EnvWarning(
                    "allocator-settings-unverified",
                    "this JAX has no backend-start hook (only jax 0.10.2-0.10.x has one), so "
                    "the kit cannot tell whether the allocator variables changed after the "
                    f"{platform} backend started.",
                    "run `python -m helpers doctor` in a fresh process to see the settings a "
                    "new backend would start with",
                ))
            elif state == "late":
                out.append(EnvWarning(
                    "allocator-settings-unverified",
                    f"the {platform} backend started before helpers was imported, so the kit "
                    "cannot tell whether the allocator variables changed since.",
                    "import helpers before running any JAX operation, or run "
                    "`python -m helpers doctor` in a fresh process",
                ))
            continue
        changed = [n for n in ALLOCATOR_VARS if env.get(n) != then.get(n)]
        if changed:
            detail = ", ".join(f"{n}: {then.get(n)!r} -> {env.get(n)!r}" for n in changed)
            out.append(EnvWarning(
                "allocator-set-after-start",
                f"changed after the {platform} backend started, so not in effect: {detail}.",
                _SET_BEFORE_START,
            ))
    return out


def _running_allocator(platform: str) -> tuple[dict | None, int] | None:
    """The running GPU allocator's ``memory_stats()`` (None: it keeps none) and the card's total
    bytes (nvidia-smi), for the first device of ``platform``; None where either cannot be read."""
    from helpers import gpu

    if not backends_started():  # jax.devices() would start them: this check starts nothing
        return None
    try:
        import jax

        stats = jax.devices(platform)[0].memory_stats()
        found = gpu.gpus()
        shown = gpu.visible(found=found)
    except Exception:  # no such backend here (a test's started_platforms), or it failed
        return None
    # the size must be cuda:0's own: not a guess at CUDA's order (visible() notes it), nor a
    # whole card whose MIG instances are what CUDA sees
    if not shown or shown[0].note or not shown[0].total_bytes:
        return None
    card = next((g for g in found if g.index == shown[0].physical_index), None)
    if card is None or (card.migs and not shown[0].mig):
        return None
    return stats, shown[0].total_bytes


#: how far bytes_limit / the card's total may sit from the fraction asked for before the kit
#: calls it another fraction: 2 points and 10% of it. XLA takes the fraction of CUDA's total,
#: about 0.6% below nvidia-smi's (an H100: every limit within 0.6% of the prediction,
#: docs/gpu-runs/2026-11-22-nvidia-h100-80gb-hbm3.md); a change smaller than this goes unnamed
_FRACTION_SLACK, _FRACTION_SLACK_RELATIVE = 0.02, 0.10
#: a pool this full while at most this share of it was ever in use was taken whole at the start:
#: a pool grown on demand (regions doubling) fills its limit only under a far larger demand
_WHOLE_POOL, _NEVER_USED = 0.98, 0.25


def _allocator_against_its_numbers(env: Mapping[str, str], platform: str, stats: dict | None,
                                   total: int) -> list[EnvWarning]:
    """Without a record of the variables at the backend's start (jax 0.11 has no hook): the
    settings the running allocator shows it started with, against those the environment asks
    for now. Names only what its numbers show: the allocator's kind (statistics, a pool), the
    fraction (bytes_limit), preallocation (a pool as large as its limit that was hardly used).
    A change they cannot show goes unnamed (docs/limitations.md)."""
    allocator = (env.get("XLA_PYTHON_CLIENT_ALLOCATOR") or "default").lower()  # as jaxlib reads
    if allocator == "vmm":  # the kit does not know what its statistics look like
        return []

    def late(message: str) -> list[EnvWarning]:
        return [EnvWarning("allocator-set-after-start", message, _SET_BEFORE_START)]

    pooled = stats is not None and "pool_bytes" in stats  # BFC (cuda_async keeps no pool count)
    if stats is None:
        if allocator in ("default", "bfc", "cuda_async"):
            return late(f"the {platform} allocator keeps no statistics, as XLA_PYTHON_CLIENT_"
                        f"ALLOCATOR=platform does, but the environment now asks for "
                        f"{'the BFC pool' if allocator != 'cuda_async' else 'cuda_async'}: "
                        "changed after the backend started, so not in effect.")
        return []
    if allocator == "platform":
        return late(f"XLA_PYTHON_CLIENT_ALLOCATOR=platform now, but the {platform} allocator "
                    "keeps statistics: it started with a pool, so the change is not in effect.")
    if pooled != (allocator != "cuda_async"):
        started, now = ("the BFC pool", "cuda_async") if pooled else ("cuda_async", "the BFC pool")
        return late(f"the {platform} allocator is {started} (its statistics "
                    f"{'count' if pooled else 'have no'} pool bytes), but the environment now "
                    f"asks for {now}: changed after the backend started, so not in effect.")
    out = []
    limit = stats.get("bytes_limit")
    name = ("XLA_CLIENT_MEM_FRACTION" if env.get("XLA_CLIENT_MEM_FRACTION")
            else "XLA_PYTHON_CLIENT_MEM_FRACTION")
    try:
        asked = float(env.get(name) or DEFAULT_MEM_FRACTION)
    except ValueError:  # its own rule names a value that is not a number
        asked = None
    if limit and asked is not None and pooled:
        held = limit / total
        if abs(held - asked) > max(_FRACTION_SLACK, _FRACTION_SLACK_RELATIVE * asked):
            out += late(f"the {platform} pool's bytes_limit is {format_bytes(limit)}, {held:.1%} "
                        f"of the card's {format_bytes(total)}, but "
                        + (f"{name}={env.get(name)} asks for {asked:.0%}" if env.get(name) else
                           f"no fraction is set now ({DEFAULT_MEM_FRACTION:.0%}, JAX's default)")
                        + ": the fraction changed after the backend started, so it is not in "
                        "effect.")
    pool, peak = stats.get("pool_bytes"), stats.get("peak_bytes_in_use", 0)
    if (env.get("XLA_PYTHON_CLIENT_PREALLOCATE") in PREALLOCATE_OFF and limit and pool
            and pool >= _WHOLE_POOL * limit and peak < _NEVER_USED * pool):
        out += late(f"XLA_PYTHON_CLIENT_PREALLOCATE={env['XLA_PYTHON_CLIENT_PREALLOCATE']} now, "
                    f"but the {platform} pool took its whole limit ({format_bytes(pool)}) while "
                    f"at most {format_bytes(peak)} was ever in use: it started preallocating, so "
                    "the change is not in effect.")
    return out


def _equal_to_default(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # What jaxlib does with no variable at all (jaxlib/xla_client.py and XLA's
    # GpuAllocatorConfig: fraction 0.75, preallocate true, the BFC allocator).
    same = []
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        try:
            if name in env and float(env[name]) == DEFAULT_MEM_FRACTION:
                same.append(f"{name}={env[name]}")
        except ValueError:
            pass
    if env.get("XLA_PYTHON_CLIENT_PREALLOCATE") in ("true", "True", "1"):
        same.append(f"XLA_PYTHON_CLIENT_PREALLOCATE={env['XLA_PYTHON_CLIENT_PREALLOCATE']}")
    if (env.get("XLA_PYTHON_CLIENT_ALLOCATOR") or "").lower() in ("default", "bfc"):
        same.append(f"XLA_PYTHON_CLIENT_ALLOCATOR={env['XLA_PYTHON_CLIENT_ALLOCATOR']}")
    if not same:
        return []
    return [EnvWarning(
        "setting-is-default",
        f"{', '.join(same)} {'is' if len(same) == 1 else 'are'} what JAX does anyway (a pool "
        "of 75% of the GPU, taken at the first allocation, BFC allocator): no effect.",
        "remove it, or set what you mean: XLA_PYTHON_CLIENT_PREALLOCATE=false to take memory "
        "on demand, XLA_CLIENT_MEM_FRACTION=0.5 for a smaller pool",
    )]


def _started_with(platform: str) -> dict[str, str | None] | None:
    """The variables as they were when ``platform``'s backend started, where the hook saw it
    (it files a CUDA/ROCm client under its platform, "gpu"; callers name "cuda")."""
    _, snapshots = backend_start_snapshot()
    then = snapshots.get(platform) or (snapshots.get("gpu") if platform in _GPU_PLATFORMS
                                      else None)
    return then


def _xla_flags_after_start(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # XLA parses XLA_FLAGS once per process, when the first backend starts.
    for platform in started_platforms:
        then = _started_with(platform)
        if then is None or "XLA_FLAGS" not in then:
            continue
        if (env.get("XLA_FLAGS") or None) != (then["XLA_FLAGS"] or None):
            return [EnvWarning(
                "xla-flags-set-after-start",
                f"XLA_FLAGS is {env.get('XLA_FLAGS')!r} now but was {then['XLA_FLAGS']!r} when "
                f"the {platform} backend started; XLA reads it once, so the change has no "
                "effect in this process.",
                "set XLA_FLAGS before the first JAX operation (restart the kernel, set it in "
                "the first cell), or run the experiment in a child process",
            )]
    return []


def _cpu_devices_after_start(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # The CPU device count is read once, when the CPU backend starts.
    if "cpu" not in started_platforms or "jax" not in sys.modules:
        return []
    asked = env.get("JAX_NUM_CPU_DEVICES")
    try:
        want = int(asked) if asked is not None else None
    except ValueError:
        return []  # _cpu_device_count names it
    if want is None:
        read, _ = _xla_reads(env.get("XLA_FLAGS") or "")  # (what a stray word hides: not read)
        m = next((m for w in read if (m := re.fullmatch(
            r"--xla_force_host_platform_device_count=(\d+)", w))), None)  # (not in a value)
        want, asked = (int(m.group(1)), f"--xla_force_host_platform_device_count={m.group(1)}"
                       ) if m else (None, None)
    else:
        asked = f"JAX_NUM_CPU_DEVICES={asked}"
    try:  # this process's own: a jax.distributed job lists every process's (a trial)
        have = len(sys.modules["jax"].local_devices(backend="cpu"))
    except Exception:
        return []
    if want is None or want < 1 or want == have:
        return []
    return [EnvWarning(
        "cpu-devices-set-after-start",
        f"{asked} asks for {want} CPU devices, but this process's CPU backend started with "
        f"{have}: JAX reads " + ("JAX_NUM_CPU_DEVICES once, at `import jax`" if
                                 asked.startswith("JAX_NUM") else
                                 "XLA_FLAGS once, when the CPU backend starts (the first "
                                 "jax.devices() or operation)") +
        ", and the backend keeps the count it started with "
        "(jax.config.update('jax_num_cpu_devices', ...) before the first operation wins over "
        "the variable; run on jax 0.8.0, 0.10.2 and 0.12.0.1).",
        "restart the kernel and set it before any JAX operation, e.g. "
        f"jax.config.update('jax_num_cpu_devices', {want}) right after `import jax`",
    )]


def _default_device_assigned(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # `jax.default_device = device` replaces JAX's context manager with a device: nothing moves.
    jax = sys.modules.get("jax")
    value = getattr(jax, "default_device", None) if jax is not None else None
    if value is None or callable(value):
        return []
    return [EnvWarning(
        "default-device-assigned",
        f"jax.default_device was assigned ({value!r}): it is a context manager, so this only "
        "replaced it in the module, and arrays still land on the default device.",
        "restart the kernel, then write `with jax.default_device(device):` around the code, "
        "or jax.config.update('jax_default_device', device) for the whole process",
    )]


def _gpu_backend_unused(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # A GPU backend takes its pool (75% of the card by default) at the first allocation on it;
    # a process that keeps everything on the CPU pays for it without using it.
    gpu = [p for p in started_platforms if p in _GPU_PLATFORMS]
    if not gpu or "jax" not in sys.modules or "cpu" not in started_platforms:
        return []
    from helpers import memory  # JAX is imported and its backends run

    arrays = memory.live_arrays()
    if not arrays or any(d.platform != "cpu" for a in arrays for d in a.devices()):
        return []
    return [EnvWarning(
        "gpu-backend-unused",
        f"the {gpu[0]} backend started in this process but every live array "
        f"({len(arrays)}) is on the CPU: its memory pool (75% of the card unless set "
        "otherwise) serves nothing, and other processes cannot have it.",
        "if this process should not use the GPU, set JAX_PLATFORMS=cpu before `import jax`",
    )]


def _gpu_started_by_an_import(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # A GPU backend takes its pool at its first allocation, whoever makes it: a library that
    # makes a JAX array as it is imported (a default argument, key=jax.random.PRNGKey(0))
    # takes 75% of the card in a program that may never use JAX (huggingface/diffusers#1794:
    # PyTorch then ran out of memory; the fix, #1795, made no array at import). The line is
    # the backend-start hook's; the pool is JAX's default. From the thread, not yet run on a GPU.
    gpu = [p for p in started_platforms if p in _GPU_PLATFORMS]
    # (only beside another GPU framework: a JAX program whose own module makes a constant at
    # import, SCALE = jnp.float32(0.5), takes the pool it would take anyway; a review)
    other = [m for m in ("torch", "tensorflow") if m in sys.modules]
    if not gpu or not other or not started_importing() or _jax_share_lowered(env):
        return []
    return [EnvWarning(
        "gpu-started-by-an-import",
        f"JAX's {gpu[0]} backend was started while a module was being imported, at "
        f"{started_at()}, and took its pool then (75% of the card unless set otherwise), "
        f"beside {other[0]}, which needs the card too: a JAX array a module makes as it is "
        "imported (a default argument such as key=jax.random.PRNGKey(0)) is enough, in a "
        "program that may never use JAX (huggingface/diffusers#1794; from the thread, not yet "
        "run on a GPU).",
        "where this process uses the GPU through another framework (PyTorch) and not JAX, set "
        "JAX_PLATFORMS=cpu before that import (or XLA_PYTHON_CLIENT_PREALLOCATE=false, so JAX "
        "takes memory only as it needs it); in your own module, make the array inside the "
        "function that uses it (key=None, then jax.random.key(0) there)",
    )]


def _jax_share_lowered(env: Mapping[str, str]) -> bool:
    """JAX's GPU pool is set below its default 75% of the card, or not taken up front
    (preallocation off, or the platform allocator): room left for another framework."""
    if (env.get("XLA_PYTHON_CLIENT_PREALLOCATE") in PREALLOCATE_OFF
            or (env.get("XLA_PYTHON_CLIENT_ALLOCATOR") or "").lower() == "platform"):
        return True
    for name in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"):
        try:
            if 0 < float(env.get(name) or "nan") < 0.75:
                return True
        except ValueError:  # a value the GPU backend refuses: _fraction_values names it
            continue
    return False


def _gpu_framework_beside(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # TensorFlow and PyTorch keep GPU pools of their own. In the same process as JAX they take
    # memory JAX's pool cannot have, and a CUDA library JAX starts later may find too little
    # left (JAX's "GPU memory allocation" page, "Running JAX and GPU TensorFlow concurrently";
    # flax#445). Read without starting either: TensorFlow's visible devices list the physical
    # GPUs only; torch.cuda.is_initialized() starts nothing. Not yet run on a GPU.
    out = []
    tf = sys.modules.get("tensorflow")
    try:
        gpus = list(tf.config.get_visible_devices("GPU")) if tf is not None else []
        growing = all(tf.config.experimental.get_memory_growth(g) for g in gpus)
    except Exception:  # a stub or a TensorFlow without these: nothing to say
        gpus, growing = [], False
    if gpus and not (growing or env.get("TF_FORCE_GPU_ALLOW_GROWTH") == "true"):
        out.append(EnvWarning(
            "tensorflow-sees-the-gpu",
            f"TensorFlow is imported in this process and sees {len(gpus)} GPU(s): at its "
            "first operation (a tf.data pipeline's included) it takes most of the free GPU "
            "memory for a pool of its own, which JAX cannot use; JAX may then run out of "
            "memory, or fail to start cuDNN or cuBLAS (\"DNN library initialization failed\").",
            "right after `import tensorflow as tf`, before TensorFlow runs anything: "
            "tf.config.set_visible_devices([], 'GPU') (loading data needs no GPU), or set "
            "TF_FORCE_GPU_ALLOW_GROWTH=true before TensorFlow starts and lower JAX's share too, "
            "XLA_PYTHON_CLIENT_MEM_FRACTION=.7 (growth alone is not enough: "
            "NixOS/nixpkgs#158186)",
        ))
    elif gpus and not _jax_share_lowered(env):
        # with growth on, TensorFlow takes no pool up front, yet its first operation makes a
        # CUDA context on each GPU it sees and it keeps what it grows to; JAX's pool still
        # takes 75% of the card (NixOS/nixpkgs#158186: "setting only one ... is not
        # sufficient", echoing jax-ml/jax#9454). From the threads; not yet run on a GPU.
        out.append(EnvWarning(
            "tensorflow-grows-beside-jax",
            f"TensorFlow is imported in this process and sees {len(gpus)} GPU(s), with memory "
            "growth on: it takes no pool up front, but it still makes its CUDA context on each "
            "at its first operation and keeps whatever it grows to, while JAX's pool takes 75% "
            "of the card, so the two may not both fit: growth alone is not enough "
            "(NixOS/nixpkgs#158186; from the thread, not yet run on a GPU).",
            "also lower JAX's share before JAX starts, XLA_PYTHON_CLIENT_MEM_FRACTION=.7 as the "
            "thread did (or XLA_PYTHON_CLIENT_PREALLOCATE=false); where TensorFlow only loads "
            "data, hide the GPU from it instead: tf.config.set_visible_devices([], 'GPU')",
        ))
    torch = sys.modules.get("torch")
    try:
        started = bool(torch.cuda.is_initialized()) if torch is not None else False
        held = (sum(int(torch.cuda.memory_reserved(i))
                    for i in range(torch.cuda.device_count())) if started else 0)
    except Exception:
        started, held = False, 0
    if started:
        out.append(EnvWarning(
            "pytorch-holds-the-gpu",
            f"PyTorch started CUDA in this process and its caching allocator holds "
            f"{format_bytes(held)} (torch.cuda.memory_reserved), beside its CUDA context: GPU "
            "memory JAX's pool cannot have.",
            "keep PyTorch on the CPU where it only loads data (no .cuda() or .to('cuda')); "
            "torch.cuda.empty_cache() gives back what no tensor holds",
        ))
    return out


def _forked_after_start(env: Mapping[str, str], started_platforms=()) -> list[EnvWarning]:
    # os.fork() copies JAX's locks but not its threads: a lock held at that moment stays held
    # in the child, where JAX can hang (jax-ml/jax#9190, a PyTorch DataLoader's workers; the
    # fix, levskaya's there: no JAX in the workers, or processes that are not forks). JAX
    # warns at each such fork without the line; the kit counts them from `import helpers`.
    lines = forks.forks_after_start()
    if not lines:
        return []
    count = sum(lines.values())
    where = "; ".join(f"{n} from {line or 'a library (no line of yours)'}"
                      for line, n in sorted(lines.items(), key=lambda kv: -kv[1]))
    return [EnvWarning(
        "forked-after-jax-started",
        f"This process called os.fork() {count} time(s) after JAX started its backends "
        f"({where}): a forked child copies JAX's locks but not its threads, so a child that "
        "uses JAX, or only touches a lock held at that moment, can hang (multiprocessing's "
        "default start method on Linux before Python 3.14 is fork, and so are a PyTorch "
        "DataLoader's workers).",
        "keep JAX out of the children (NumPy in data-loading workers), and start them with "
        "'spawn' or 'forkserver': multiprocessing.get_context('spawn'), or "
        "DataLoader(..., multiprocessing_context='spawn')",
    )]


#: The checks check_environment runs, in this order; each is
#: ``rule(env, started_platforms) -> list[EnvWarning]``.
RULES: tuple[Callable[..., list[EnvWarning]], ...] = (
    _both_fractions,
    _fraction_values,
    _preallocate,
    _allocator,
    _moot_under_platform,
    _no_visible_gpu,
    _cuda_alone_without_gpu,
    _two_cpu_counts,
    _cpu_device_count,
    _xla_flags,
    _equal_to_default,
    _platforms_after_import,
    _x64_after_import,
    _config_after_import,
    _debug_checks_on,
    _allocator_after_start,
    _xla_flags_after_start,
    _cpu_devices_after_start,
    _default_device_assigned,
    _gpu_backend_unused,
    _gpu_started_by_an_import,
    _gpu_framework_beside,
    _forked_after_start,
)


#: Rules that compare the environment with this process's JAX (what it read at import, what
#: its backends started with): meaningless for another process's environment.
PROCESS_RULES = (_platforms_after_import, _x64_after_import, _config_after_import,
                 _debug_checks_on, _allocator_after_start,
                 _xla_flags_after_start,
                 _cpu_devices_after_start, _default_device_assigned, _gpu_backend_unused,
                 _gpu_started_by_an_import, _gpu_framework_beside, _forked_after_start)
