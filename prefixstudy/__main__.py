"""``python -m prefixstudy``: the same command line as the ``prefixstudy`` script."""

from prefixstudy.cli import entrypoint

if __name__ == "__main__":
    entrypoint()
