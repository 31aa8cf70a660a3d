"""Command line: ``python -m helpers doctor | make-tokens | preflight | reproduce-oom``."""

from __future__ import annotations

import argparse
import json
import math
import sys

from helpers.errors import KitError

# What a user's input or machine can cause (bad file, size, path, disk, no GPU) is a KitError
# (helpers.errors; lower-layer errors are translated where the kit calls them): one line on
# stderr and exit 2, never a traceback.
EXIT_OK = 0
EXIT_WONT_FIT = 1  # preflight: the file will not fit
EXIT_NOT_REPRODUCED = 1  # reproduce-oom: no RESOURCE_EXHAUSTED, or the fix failed
EXIT_BAD_INPUT = 2
EXIT_UNKNOWN = 3  # preflight: the device reports no free memory
EXIT_INTERRUPTED = 130


def _message(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    if isinstance(err, OSError) and err.filename and err.strerror:
        text = f"{err.filename}: {err.strerror}"
    return text


def _doctor(args: argparse.Namespace) -> int:
    from helpers import doctor

    report = doctor.diagnose(timeout=args.timeout)
    if args.bug_report:
        print(doctor.bug_report(report))
    elif args.json:
        print(report.to_json())
    else:
        print(report)
    return EXIT_OK


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _make_tokens(args: argparse.Namespace) -> int:
    from helpers import datasets

    if (args.size is None) == (args.tokens is None):
        return _fail("give exactly one of --size (e.g. 1GiB) or --tokens N")
    tf = datasets.write_tokens(args.path, args.tokens, size=args.size, seed=args.seed,
                               progress=False if args.quiet else None)
    print(tf)
    return EXIT_OK


def _preflight(args: argparse.Namespace) -> int:
    from helpers import preflight

    try:
        target = None
        if args.target is not None:
            from helpers import allocation

            target = allocation.target(args.target, fraction=args.fraction,
                                       preallocate=not args.no_preallocate,
                                       processes=args.processes)
        result = preflight.preflight(args.file, device=args.device, target=target)
    except KitError as err:
        if args.json:
            print(json.dumps({"error": _message(err)}))
        raise
    print(json.dumps(result.to_dict(), indent=2) if args.json else result)
    return {"fits": EXIT_OK, "will not fit": EXIT_WONT_FIT}.get(result.verdict, EXIT_UNKNOWN)


def _reproduce(args: argparse.Namespace) -> int:
    from helpers import oom

    runs = [oom.reproduce(args.file, size=args.size, mode=args.mode, budget=args.budget),
            oom.reproduce(args.file, size=args.size, mode=args.mode, budget=args.budget,
                          fixed=True)]
    if args.json:
        print(json.dumps([r.to_dict() for r in runs], indent=2))
    else:
        print("\n\n".join(str(r) for r in runs))
    seed, fix = runs
    as_expected = (not seed.ok and "RESOURCE_EXHAUSTED" in (seed.error_message or "")
                   and fix.ok)
    return EXIT_OK if as_expected else EXIT_NOT_REPRODUCED


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m helpers",
        description="JAX Device Kit diagnostics: where did my array go, and why is my GPU "
        "out of memory?",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    doctor = sub.add_parser(
        "doctor",
        help="what JAX sees: backends, devices, defaults, memory stats, env vars, versions",
        description="Print what JAX sees on this machine, probed in a fresh child process. "
        "Backends that fail to start, JAX failing to import and XLA aborting are reported, "
        "not raised. Exit status 0.",
    )
    shown = doctor.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print only JSON (schema in README)")
    shown.add_argument("--bug-report", action="store_true",
                       help="print a Markdown block for a JAX issue: jax.print_environment_info() "
                            "and this report, with home paths, user and host names and secrets "
                            "removed")
    doctor.add_argument("--timeout", type=_seconds, default=120,
                        help="seconds to wait for the probe (default 120)")
    doctor.set_defaults(func=_doctor)

    mk = sub.add_parser("make-tokens", help="write a synthetic GPT-2-like uint16 token file",
                        description="Write a safetensors file with one uint16 tensor `tokens`, "
                        "laid out like the story's dataset. Streams in chunks.")
    mk.add_argument("path")
    mk.add_argument("--size", help="data size, e.g. 1GiB, 512MiB (2 bytes per token)")
    mk.add_argument("--tokens", type=int, help="number of tokens")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--quiet", action="store_true", help="no progress bar")
    mk.set_defaults(func=_make_tokens)

    pf = sub.add_parser("preflight", help="will this safetensors file fit where it would land?",
                        description="Read only the header: dtype, shape, bytes per tensor, the "
                        "device the load would land on, free memory there, and a verdict. "
                        "Exit 0 fits, 1 will not fit, 2 bad input, 3 unknown (no memory stats).")
    pf.add_argument("file")
    pf.add_argument("--device", default="default", choices=["default", "cpu", "gpu"])
    pf.add_argument("--json", action="store_true")
    pf.add_argument("--target", metavar="CARD", help="judge against a card you are not on: a "
                    "name (H100, RTX 3090, A100 80GB, ...) or a size (24GiB)")
    pf.add_argument("--fraction", type=float, default=0.75,
                    help="with --target: XLA_CLIENT_MEM_FRACTION to assume (default 0.75)")
    pf.add_argument("--no-preallocate", action="store_true",
                    help="with --target: assume XLA_PYTHON_CLIENT_PREALLOCATE=false")
    pf.add_argument("--processes", type=int, default=1,
                    help="with --target: JAX processes sharing the card (default 1)")
    pf.set_defaults(func=_preflight)

    ro = sub.add_parser("reproduce-oom", help="reproduce the safetensors CUDA OOM in a child "
                        "process, then run the fix",
                        description="Runs safetensors.flax.load_file(...)['tokens'] in a "
                        "memory-capped child (the real GPU when present, else a labelled CPU "
                        "stand-in), then again under jax.default_device(cpu). Exit 0 when the "
                        "first fails with RESOURCE_EXHAUSTED and the fix succeeds.")
    ro.add_argument("--size", default="256MiB", help="token file size to generate (default "
                    "256MiB)")
    ro.add_argument("--file", help="use this token file instead of generating one")
    ro.add_argument("--mode", default="auto", choices=["auto", "gpu", "cpu"])
    ro.add_argument("--budget", help="memory cap for the load, e.g. 128MiB (default: half the "
                    "file)")
    ro.add_argument("--json", action="store_true")
    ro.set_defaults(func=_reproduce)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return args.func(args)
    except KitError as err:
        return _fail(_message(err))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
