"""``lancetx-sync``: the operator's command line (typer + rich).

Each command group is a module in :mod:`lancetx.cli.commands`; the work is
done by plain functions in :mod:`lancetx.ops`, imported only when a command
runs, so ``--help`` stays fast.
"""
