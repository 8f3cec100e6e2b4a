"""Errors the CLI turns into one line and exit code 2."""


class UserError(Exception):
    """Bad input: a config, dataset or flag.  The message names the file, line or field."""
