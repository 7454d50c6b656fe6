"""The ``hfexport`` command: export, run, validate, bench, env, demo, matrix.

Each stage prints as it finishes, with its wall time; ``--json`` prints one JSON object instead, for machines.
"""

from __future__ import annotations

import argparse
import json
import sys

from .progress import Progress

__all__ = ["main", "build_parser", "Progress"]


def cmd_env(args: argparse.Namespace) -> int:
    from .env import main_env

    code = main_env(json_out=args.json)
    if args.workarounds:
        from ..workarounds import workarounds

        rows = [w.describe() for w in workarounds()]
        if args.json:
            print(json.dumps({"workarounds": rows}, indent=2))
        else:
            print("\nworkarounds:" if rows else "\nworkarounds: none registered")
            for row in rows:
                state = "active" if row["active"] else "inactive (versions out of range)"
                print(f"  {row['id']} [{row['backend']}] {row['target']}: {row['breaks']} — {state}")
                if row["upstream"]:
                    print(f"      upstream: {row['upstream']}")
    return code


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(json_out=args.json, backends=args.backends)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hfexport", description=__doc__.splitlines()[0].replace("``", ""))
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show what the libraries underneath print (warnings, logs) and full tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    from .export import add_export_parser

    add_export_parser(sub)

    p = sub.add_parser("env", help="installed vs tested versions, usable backends")
    p.add_argument("--json", action="store_true")
    p.add_argument("--workarounds", action="store_true", help="also list the registered workarounds")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("demo", help="export the packaged SmolLM2 and MiniLM and compare with eager")
    p.add_argument("--json", action="store_true")
    p.add_argument("--backends", nargs="*", default=None)
    p.set_defaults(func=cmd_demo)

    from .run import add_run_parser

    add_run_parser(sub)

    from .validate import add_validate_parser

    add_validate_parser(sub)

    from .bench import add_bench_parser

    add_bench_parser(sub)

    from ..tools.matrix.command import add_matrix_parser

    add_matrix_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..errors import HfExportError
    from .quiet import quiet_terminal, terminal

    with quiet_terminal(args.verbose):
        try:
            return args.func(args)
        except HfExportError as e:
            print(f"hfexport: error: {e}", file=terminal())
            return 2
        except BrokenPipeError:  # the reader went away (`hfexport run ... | head`): stop quietly, as cat does
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
            return 141
        except Exception as e:  # noqa: BLE001 - one line with what to do; the traceback with -v
            if args.verbose:
                raise
            print(f"hfexport: error: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                  " (run with -v for the full traceback)", file=terminal())
            return 1


if __name__ == "__main__":
    sys.exit(main())
