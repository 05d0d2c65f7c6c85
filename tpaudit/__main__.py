"""`python -m tpaudit` runs the command line (after making sure the `tpaudit` imported is the installed package,
not a folder of the current directory: `tpaudit._process.exit_if_shadowed`)."""

from ._process import exit_if_shadowed

exit_if_shadowed(__file__)

from .cli.app import run  # noqa: E402 - only once the package is known to be ours

if __name__ == "__main__":
    run()
