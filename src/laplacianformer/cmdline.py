"""What the command lines (``cli``, ``detection.cli``) share: argparse value types, each rejecting a bad
value with a one-line message that argparse prefixes with the flag, and ``run_main``, the error handling
of a ``main``."""

from __future__ import annotations

import argparse
import json
import sys


def int_at_least(lo: int):
    """The type of an integer >= ``lo``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {v}")
        return v

    parse.__name__ = "integer"
    return parse


def float_above(lo: float, strict: bool):
    """The type of a finite number > ``lo`` (``strict``) or >= ``lo``."""
    op = ">" if strict else ">="

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {op} {lo:g}, got {text!r}") from None
        if not (v > lo if strict else v >= lo) or v == float("inf"):
            raise argparse.ArgumentTypeError(f"expected a finite number {op} {lo:g}, got {text}")
        return v

    parse.__name__ = "number"
    return parse


def json_object(example: str):
    """The type of a JSON object; ``example`` (one such object) is shown when the value is not one."""

    def parse(text: str) -> dict:
        try:
            v = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"expected a JSON object such as '{example}' ({e.msg})") from None
        if not isinstance(v, dict):
            raise argparse.ArgumentTypeError(f"expected a JSON object such as '{example}'")
        return v

    parse.__name__ = "JSON object"
    return parse


positive_int = int_at_least(1)
nonneg_int = int_at_least(0)
positive_float = float_above(0, strict=True)
nonneg_float = float_above(0, strict=False)


def run_main(prog: str, argv: list[str] | None, command, errors: tuple, message=str) -> int:
    """``command(argv)`` (default ``sys.argv[1:]``) as a process exit status: an error of ``errors`` prints
    '<prog>: error: <message(e)>' and gives 2, Ctrl-C '<prog>: interrupted' and 130, a closed pipe 1;
    ``--debug`` anywhere in ``argv`` shows the traceback instead of the line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        return command(argv)
    except errors as e:
        if debug:
            raise
        print(f"{prog}: error: {message(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
