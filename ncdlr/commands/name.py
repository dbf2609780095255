"""Name the novel clusters of a run (after looking at `ncdlr gallery`): RUN/names.yaml.

Novel cluster j is keyed novel-NN (novel-00, novel-01, ...); its default name is its key. `ncdlr predict` and
`ncdlr gallery` show the names set here. Known classes keep their dataset names. Without --set/--unset it
prints the current names.

Examples:
  ncdlr name runs/openclipart --set novel-07="barn owl" --set novel-02="tulip"
  ncdlr name runs/openclipart --unset novel-02
  ncdlr name runs/openclipart
"""

from __future__ import annotations

import argparse

NAME = "name"
HELP = "name the novel clusters of a run (writes RUN/names.yaml, used by predict and gallery)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run directory of `ncdlr train`")
    parser.add_argument("--set", action="append", default=[], metavar='novel-NN="NAME"',
                        help="give novel cluster NN a name (repeatable)")
    parser.add_argument("--unset", action="append", default=[], metavar="novel-NN",
                        help="back to the default name novel-NN (repeatable)")


def run(args: argparse.Namespace) -> int:
    from ncdlr.service.entry import run_main
    from ncdlr.service.names import NamesError, novel_key, update_names
    from ncdlr.service.trained_run import open_run

    def main() -> int:
        assign = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                raise NamesError(f"--set {item!r}: write novel-NN=NAME")
            assign[key.strip()] = value.strip().strip('"').strip("'")
        trained = open_run(args.run)
        names = update_names(args.run, trained.num_novel, assign, args.unset) if (assign or args.unset) else None
        for j, name in enumerate(trained.names()[trained.num_known:]):
            key = novel_key(j)
            print(f"{key}  {name}" if name != key else key)
        if names is not None:
            print(f"[ncdlr] {len(names)} named cluster(s) in {args.run}/names.yaml")
        return 0

    return run_main("ncdlr name", main)
