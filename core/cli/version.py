"""``cdcflow version``: print the version of cdcflow and of its key dependencies."""

from __future__ import annotations

import argparse
import platform
from importlib import metadata

from cdcflow.core.cli._common import EXIT_OK, print_json
from cdcflow.core.version import __version__

_DEPENDENCIES = ("pluggy", "pydantic", "pyspark", "confluent-kafka", "grpcio", "protobuf")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "version",
        help="print the cdcflow version",
        description="Print the cdcflow version; with --verbose also Python and key dependency versions.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="also list Python and dependency versions")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)


def _dependency_versions() -> dict[str, str]:
    versions = {}
    for name in _DEPENDENCIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def run(args: argparse.Namespace) -> int:
    info: dict[str, object] = {"cdcflow": __version__}
    if args.verbose or args.json:
        info["python"] = platform.python_version()
        info["dependencies"] = _dependency_versions()
    if args.json:
        print_json(info)
        return EXIT_OK
    print(f"cdcflow {__version__}")
    if args.verbose:
        print(f"python {info['python']}")
        for name, version in _dependency_versions().items():
            print(f"{name} {version}")
    return EXIT_OK
