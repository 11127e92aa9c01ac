"""``python -m bench.chaos_node ARGS``: ``python -m mqstore ARGS`` for a chaos node
whose store sits on PowerFS (bench.chaos_cluster).

It runs the CLI under ``bench.powerloss.per_path_syncs``, as the power-loss harness
runs its writers: PowerFS cuts power without rebooting the machine, so recovery must
not trust an ``abort`` marker from this boot to mean "only the process died", and it
cannot observe syncfs(2), so the ConsumeQueue syncs each path instead.
"""

from __future__ import annotations

from bench.powerloss import per_path_syncs
from mqstore.cli import main

if __name__ == "__main__":
    with per_path_syncs():
        code = main()
    raise SystemExit(code)
