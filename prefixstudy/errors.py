"""Errors the CLI turns into one line: bad input (exit code 2) and a run stopped early (exit code 1)."""


class UserError(Exception):
    """Bad input: a config, dataset or flag.  The message names the file, line or field."""


def first_line(e: BaseException, limit: int = 300) -> str:
    """An exception's first line (vLLM's and Ray's messages run to many), cut at ``limit``."""
    return (str(e).strip().splitlines() or [""])[0][:limit]


class StudyFailed(Exception):
    """The run stopped (an engine that did not start, a check the config made fatal); its points so
    far are saved."""


def read_text(path, missing: str, expected: str) -> str:
    """A user's file as text, or one line saying why not: '<path>: <missing> not found',
    'is a directory, expected <expected>', 'not UTF-8 text (byte N)'."""
    from pathlib import Path

    try:
        return Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: {missing} not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected {expected}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None
