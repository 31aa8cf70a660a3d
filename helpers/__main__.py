"""Command line: ``python -m helpers doctor [--json]``."""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def _doctor(args: argparse.Namespace) -> int:
    from helpers import devices

    report = devices.probe()
    if args.json:
        print(report.to_json())
    else:
        print(report)
    return EXIT_OK


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
        description="Print what JAX sees on this machine. Backends that fail to start are "
        "reported, not raised. Exit status 0.",
    )
    doctor.add_argument("--json", action="store_true", help="print only JSON (schema in README)")
    doctor.set_defaults(func=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
