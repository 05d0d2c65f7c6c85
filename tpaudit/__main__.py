"""`python -m tpaudit` runs the command line."""

from .cli.app import main

if __name__ == "__main__":
    raise SystemExit(main())
