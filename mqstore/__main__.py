"""``python -m mqstore``: the command line (see ``mqstore.cli``)."""

from mqstore.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
