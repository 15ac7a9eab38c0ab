#!/usr/bin/env python
"""Run fairseq-train or fairseq-generate, with bad input files reported in one line.

    python -m fairseq_dnas.recipes.run_fairseq train DATA-BIN --user-dir fairseq_dnas ...
    python -m fairseq_dnas.recipes.run_fairseq generate DATA-BIN --path checkpoint_best.pt ...

Exactly fairseq's own ``fairseq-train`` / ``fairseq-generate`` with
``--user-dir fairseq_dnas`` (the same arguments, the same one-line errors:
``fairseq_dnas/fairseq_patches/file_checks.py``): a truncated or corrupt checkpoint, a
checkpoint of another architecture, or an empty or truncated data file ends
the run with ``error: <file>: <what is wrong>`` and exit status 1 instead of a
traceback. Here the plugin is imported (and its checks installed) even when
the command line has no ``--user-dir``. The Gigaword recipe runs fairseq
through this script, also under torchrun.
"""

import sys

TOOLS = ("train", "generate")


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        print(f"usage: run_fairseq.py {{{','.join(TOOLS)}}} [fairseq arguments]", file=sys.stderr)
        return 2
    tool = sys.argv.pop(1)
    sys.argv[0] = f"fairseq-{tool}"
    # What --user-dir fairseq_dnas does in fairseq-train itself: the models and
    # tasks, and every patch (the command-line ones too, sys.argv[0] being set).
    import fairseq_dnas.plugin  # noqa: F401
    from fairseq_dnas import fairseq_patches
    from fairseq_dnas.errors import BadFile
    from fairseq_dnas.fairseq_patches.file_checks import error_line

    fairseq_patches.install(command_line=True)
    if tool == "train":
        from fairseq_cli.train import cli_main
    else:
        from fairseq_cli.generate import cli_main
    try:
        cli_main()
    except BadFile as err:
        print(error_line(err), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
