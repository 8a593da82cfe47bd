"""Console-script entry points: ``mooncake_master``, ``mooncake_client``,
``mooncake_http_metadata_server``, ``transfer_engine_bench``, ``mooncake`` and
``mooncake_conductor``.

Each runs the same Rust entry point as the standalone binary, inside this
interpreter with the GIL released.
"""

from __future__ import annotations

import signal
import sys

from . import _mooncake

__all__ = [
    "mooncake_master",
    "mooncake_client",
    "mooncake_http_metadata_server",
    "transfer_engine_bench",
    "mooncake",
    "mooncake_conductor",
    "run",
]


def run(name: str, argv: list[str] | None = None) -> int:
    """Runs program ``name`` with ``argv`` (default: this process's arguments)
    and returns its exit code."""
    args = [name, *(sys.argv[1:] if argv is None else argv)]
    # The Rust programs install their own SIGINT/SIGTERM handlers for a clean
    # stop. Python's SIGINT handler would only set a flag (never acted on while
    # Rust runs), so give both signals their default dispositions, as in the
    # standalone binaries.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return _mooncake._run_cli(name, args)


def _main(name: str) -> None:
    sys.exit(run(name))


def mooncake_master() -> None:
    _main("mooncake_master")


def mooncake_client() -> None:
    _main("mooncake_client")


def mooncake_http_metadata_server() -> None:
    _main("mooncake_http_metadata_server")


def transfer_engine_bench() -> None:
    _main("transfer_engine_bench")


def mooncake() -> None:
    _main("mooncake")


def mooncake_conductor() -> None:
    _main("mooncake_conductor")
