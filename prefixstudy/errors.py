"""Errors the CLI turns into one line: bad input (exit code 2) and a run stopped early (exit code 1)."""

from __future__ import annotations

import re


def installed(name: str) -> bool:
    """Whether package ``name`` is installed, without importing it.  A bare folder of that name on
    sys.path (Ray's session folder /tmp/ray, for `python -m prefixstudy` run from /tmp) is a
    namespace package that imports, yet is not the package: it does not count."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin not in (None, "namespace")


class UserError(Exception):
    """Bad input: a config, dataset or flag.  The message names the file, line or field."""


def first_line(e: BaseException, limit: int = 300) -> str:
    """An exception's first line (vLLM's and Ray's messages run to many), cut at ``limit``."""
    return (str(e).strip().splitlines() or [""])[0][:limit]


class StudyFailed(Exception):
    """The run stopped (an engine that did not start, a check the config made fatal); its points so
    far are saved.  ``log``: the engine's own output, when it was read (a Ray actor's files, see
    executors.own_log, or a launched server's log); the run keeps it beside its manifest."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log

    def __reduce__(self):  # through Ray with its log: the default pickles ``args`` only
        return (type(self), (str(self), self.log))


LOG_BYTES = 256 * 1024  # of an engine's log: the end of its start-up is what says why it failed


def log_end(path, start: int = 0, max_bytes: int = LOG_BYTES) -> str:
    """A log file's text from byte ``start`` on, its last ``max_bytes`` at most ("" if unreadable)."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            f.seek(max(start, end - max_bytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


# An exception line in an engine's log: "ValueError: ...", also under vLLM's log prefix
# ("(EngineCore pid=12) ERROR 12-01 03:17:08 [core.py:1510] ValueError: ...") or Ray's ("(pid=12) ").
_EXCEPTION_LINE = re.compile(r"^(?:\([^)]*\) )?(?:[A-Z]+ \d\d-\d\d [\d:.]+ \[[^\]]*\] )?"
                             r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit)(?:\([\w.]+\))?: \S.*)$")
# What vLLM raises in the frontend for any engine-core failure: it names no cause.
_WRAPPERS = ("Engine core initialization failed", "EngineCore failed to start")
_SEE_ABOVE = re.compile(r"\. See root cause above\..*$")


def root_cause(log: str, limit: int = 240) -> str:
    """The last exception line in an engine's log that is not vLLM's generic wrapper ("Engine core
    initialization failed. See root cause above."), or "" when there is none."""
    found = ""
    for line in log.splitlines():
        m = _EXCEPTION_LINE.match(line.rstrip())
        if m and not any(w in m.group(1) for w in _WRAPPERS):
            found = m.group(1)
    return found[:limit]


def describe_failure(e: BaseException, log: str = "") -> str:
    """An engine's failure on one line: ``Type: first line`` (a StudyFailed as it reads), then the
    log's root cause when it names another."""
    what = str(e) if isinstance(e, StudyFailed) else f"{type(e).__name__}: {first_line(e)}"
    cause = root_cause(log)
    if not cause or cause in what:
        return what
    # vLLM's wrapper points at a log the user may not have ("See root cause above."): the cause follows.
    return f"{_SEE_ABOVE.sub('', what)}; root cause: {cause}"


def read_text(path, missing: str, expected: str, max_bytes: int | None = None) -> str:
    """A user's file as text, or one line saying why not: '<path>: <missing> not found',
    'is a directory, expected <expected>', 'not UTF-8 text (byte N)', 'cannot read (...)' (a
    symlink loop, no permission), or 'larger than N MiB' where ``max_bytes`` bounds it (a config
    pointed at /dev/zero would be read without end)."""
    import os
    import stat
    from pathlib import Path

    try:
        mode = os.stat(path).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):  # /dev/zero reads without end
            raise UserError(f"{path}: a device, not a file; expected {expected}")
        with open(Path(path), "rb") as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:
            raise UserError(f"{path}: larger than {max_bytes >> 20} MiB, expected {expected}")
        return data.decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: {missing} not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected {expected}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
