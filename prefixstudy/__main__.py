"""``python -m prefixstudy``: the same command line as the ``prefixstudy`` script."""

from prefixstudy.cli import main

if __name__ == "__main__":
    main()
