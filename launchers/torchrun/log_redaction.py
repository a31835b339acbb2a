"""Keeps the rendezvous id out of what the node's agent writes.

torch's elastic agent names its rendezvous in log lines (at WARNING when a node fails to shut the rendezvous down,
which happens whenever the head node's agent has already closed its store) and in some of its errors. The job's
log is a file other users may be able to read, and the id is what keeps a co-tenant out of the job's store
(launchers.torchrun.rendezvous), so every log record this process makes, and the traceback of an error that ends
it, carry MASK in its place. Output of the C++ side (c10d's own warnings) does not pass through here; it does not
name the rendezvous.
"""

from __future__ import annotations

import logging
import sys
import traceback
from types import TracebackType
from typing import Callable, Optional

MASK = "<rendezvous id>"


def redacted(text: str, secret: str) -> str:
    """`text` with every occurrence of `secret` replaced by MASK."""
    return text.replace(secret, MASK)


def install(secret: str) -> Callable[[], None]:
    """Redact `secret` from every log record and uncaught error of this process; returns what undoes it."""
    if not secret:
        raise ValueError("nothing to redact")
    make_record, excepthook = logging.getLogRecordFactory(), sys.excepthook

    def record(*args, **kwargs) -> logging.LogRecord:
        rec = make_record(*args, **kwargs)
        try:
            message = rec.getMessage()
        except Exception:  # a bad format string: logging reports it when the record is emitted
            return rec
        if secret in message:
            rec.msg, rec.args = redacted(message, secret), None
        if rec.exc_info and rec.exc_info[0] is not None:
            text = "".join(traceback.format_exception(*rec.exc_info)).rstrip("\n")
            if secret in text:
                rec.exc_text = redacted(text, secret)  # what Formatter.format prints instead of formatting exc_info
        return rec

    def hook(kind: type[BaseException], err: BaseException, tb: Optional[TracebackType]) -> None:
        sys.stderr.write(redacted("".join(traceback.format_exception(kind, err, tb)), secret))
        sys.stderr.flush()

    logging.setLogRecordFactory(record)
    sys.excepthook = hook

    def undo() -> None:
        logging.setLogRecordFactory(make_record)
        sys.excepthook = excepthook

    return undo
