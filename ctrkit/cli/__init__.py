"""The ``ctrkit`` command line: the only place that parses arguments.

One module per command group, each holding its parsers and handlers together: ``data`` (synth,
preprocess, transcode, gen-csv), ``train`` (train, evaluate, predict, models), ``serve`` (export,
serve) and ``bench``. Shared option groups live in ``options``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from ctrkit import __version__
from ctrkit.cli import bench, data, refresh, serve, train
from ctrkit.cli.options import check_paths

EXIT_USER_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctrkit",
        description="Click-through-rate ranking models (DLRM, DCNv2, Wide & Deep) from raw logs to a served model.",
    )
    parser.add_argument("--version", action="version", version=f"ctrkit {__version__}")
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of errors")
    sub = parser.add_subparsers(dest="command", required=True, help="what to do")
    for group in (data, train, serve, refresh, bench):
        group.register(sub)
    _list_subcommands(parser)
    return parser


def _list_subcommands(parser: argparse.ArgumentParser) -> None:
    """Each group's usage line lists the subcommands it registered (``{a,b,...}``), nested groups included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            action.metavar = "{" + ",".join(action.choices) + "}"
            for sub in action.choices.values():
                _list_subcommands(sub)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_paths(args)
        code = args.handler(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except Exception as e:
        message = _user_error(e)
        if message is None or args.traceback:
            raise
        print(f"ctrkit {args.command}: error: {_flags_named(message, parser)}", file=sys.stderr)
        code = EXIT_USER_ERROR
    _leave_process_group(code)
    return code


def _user_error(e: Exception) -> str | None:
    """The one line to print for an error the user can act on (bad input or settings, a file or disk
    problem, a peer of a distributed job gone), or None for a bug (the traceback is shown)."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"
    if isinstance(e, (ValueError, FloatingPointError, OSError, EOFError, MemoryError)):
        text = str(e).strip().splitlines()
        return text[0] if text else type(e).__name__
    if "torch" in sys.modules and isinstance(e, RuntimeError):
        torch = sys.modules["torch"]
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        allocation = re.search(r"tried to allocate (\d+) bytes", first)
        if isinstance(e, torch.OutOfMemoryError) or (allocation and "can't allocate memory" in first):
            # torch's allocators raise RuntimeError (CPU) or OutOfMemoryError (CUDA), not MemoryError
            size = f" (an allocation of {int(allocation[1]) / 2**20:,.0f} MiB failed)" if allocation else ""
            return (f"out of memory{size}: use a smaller --batch-size or model, or more ranks (torchrun) to "
                    "split the embedding tables")  # fmt: skip
    distributed = "torch.distributed" in sys.modules and isinstance(e, sys.modules["torch.distributed"].DistError)
    if distributed:  # a timeout or a rank that went away: the first line says which
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"the distributed job failed ({type(e).__name__}): {first}"
    return None


def _flags_named(message: str, parser: argparse.ArgumentParser) -> str:
    """A library error with the settings it names in backticks (``chunk_size``) written as the flags that
    set them (--chunk-size); names no flag sets lose their backticks."""
    flags: dict[str, str] = {}
    stack = [parser]
    while stack:
        for action in stack.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif action.option_strings:
                flags.setdefault(action.dest, action.option_strings[-1])
    return re.sub(r"`(\w+)`", lambda m: flags.get(m[1], m[1]), message)


def _leave_process_group(code: int) -> None:
    """Ends a hybrid-parallel process without tearing gloo down.

    Letting the interpreter destroy a live gloo process group aborted a rank now and then here
    ("terminate called without an active exception", SIGABRT) after all work was done; so a rank
    that finished waits for its peers (when it succeeded) and leaves with ``os._exit``.
    """
    if "torch.distributed" not in sys.modules:  # never started one (and importing torch costs ~1.3 s)
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if code == 0:
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
