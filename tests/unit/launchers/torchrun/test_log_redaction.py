"""The rendezvous id stays out of the job's log (launchers.torchrun.log_redaction): torch's elastic agent names it
when a node fails to shut the rendezvous down, which is what a node does whenever the head node's agent has
closed its store first (a CI run's job log showed it), and in errors."""

from __future__ import annotations

import io
import logging
import sys
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from launchers.torchrun import log_redaction, rendezvous

MASK = log_redaction.MASK


def captured(logger: logging.Logger) -> tuple[io.StringIO, logging.Handler]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    return out, handler


def test_a_node_that_cannot_shut_the_closed_rendezvous_down_logs_it_without_its_id():
    secret = rendezvous.draw().id
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=5))
    handler = dyn.DynamicRendezvousHandler.from_backend(
        secret, store, C10dRendezvousBackend(store, secret), 1, 1,
        timeout=dyn.RendezvousTimeout(close=timedelta(seconds=5)))
    out, sink = captured(dyn.logger)
    undo = log_redaction.install(secret)
    try:
        del server  # the head node's agent has gone, with its store
        assert handler.shutdown() is False
    finally:
        undo()
        dyn.logger.removeHandler(sink)
    text = out.getvalue()
    assert "failed to shutdown the rendezvous" in text and MASK in text, text
    assert secret not in text


def test_an_error_logged_or_uncaught_shows_the_mask_and_logging_is_as_before_once_undone(capsys):
    secret = "rrtrain-" + "5" * 32
    log = logging.getLogger("rrtrain.test.log_redaction")
    out, sink = captured(log)
    sink.setFormatter(logging.Formatter("%(message)s"))
    undo = log_redaction.install(secret)
    try:
        try:
            raise RuntimeError(f"The rendezvous '{secret}' is closed")
        except RuntimeError as err:
            log.exception("ended at %s", secret)
            sys.excepthook(type(err), err, err.__traceback__)
        log.warning("%d%% done, no id", 50)  # a message with no id is left as it was
    finally:
        undo()
    log.warning("after: %s", secret)
    log.removeHandler(sink)
    text, err = out.getvalue(), capsys.readouterr().err
    assert text.splitlines()[0] == f"ended at {MASK}" and f"RuntimeError: The rendezvous '{MASK}' is closed" in text
    assert "50% done, no id" in text and secret not in text.split("after:")[0]
    assert f"after: {secret}" in text
    assert f"RuntimeError: The rendezvous '{MASK}' is closed" in err and secret not in err
