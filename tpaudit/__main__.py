"""`python -m tpaudit` runs the command line."""

from .cli.app import run

if __name__ == "__main__":
    run()
