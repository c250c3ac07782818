"""``python -m graphir``: the same command line as the ``graphir`` script."""

from graphir.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
