"""How a bucket's requests are said and waited for (:class:`~ablate.service.records.store.cloud.CloudStore`'s):
obstore's errors in a few words (:func:`message`), whether an error is the store's silence or its answer
(:func:`no_answer`, :func:`no_connection`), and a request made so that a signal stops the process waiting for it
(:func:`interruptible`, :func:`sleep_in_slices`)."""

from __future__ import annotations

import builtins
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["CODES", "SLICE_S", "host_of", "interruptible", "message", "no_answer", "no_connection", "retried",
           "sleep_in_slices"]  # fmt: skip

_T = TypeVar("_T")

#: A waiting thread sleeps this long at a time, and the main thread checks this often on a request it handed to a
#: helper thread: Python's signal handlers run in between.
SLICE_S = 0.25


#: The store's error codes that a person reads better in words.
CODES = {"NoSuchBucket": "the bucket does not exist", "AccessDenied": "access denied",
         "InvalidAccessKeyId": "the access key is not known", "SignatureDoesNotMatch": "the secret key does not match"}  # fmt: skip


def message(exc: BaseException) -> str:
    """obstore's error in a few words: the HTTP status and the store's error code (``404 Not Found,
    NoSuchBucket``), or the last clause of its first line (``HTTP error: error sending request``)."""
    text = str(exc)
    status = re.search(r"status code: (\d{3}[^:<\n]*)", text)
    code = re.search(r"<Code>([^<]+)</Code>", text)
    if status:
        said = CODES.get(code[1], code[1]) if code else None
        if said is None and status[1][:3] in ("401", "403"):
            said = "check the credentials (AWS_* or GOOGLE_* in the environment, or the URI's access_key/secret_key)"
        return ", ".join([status[1].strip(), *([said] if said else [])])
    first = text.split("\n\nDebug source:")[0].split("\n")[0]
    reason = " ".join(first.rsplit(" - ", 1)[-1].split())[:300]
    host = host_of(text)
    retried = re.search(r"Error performing \w+ \S+ in ([\d.]+)s(?:, after (\d+) retries)?", first)
    if host and retried:  # no answer: a refused connection, a timeout (after the client's retries)
        return f"no answer from {host} in {float(retried[1]):.0f} s and {retried[2] or 0} retries ({reason})"
    return reason


def host_of(text: str) -> str | None:
    """The ``scheme://host:port`` of the request obstore's error names, if it names one."""
    found = re.search(r"Error performing \w+ (\w+://[^/\s]+)", text)
    return found[1] if found else None


def no_answer(exc: BaseException) -> bool:
    """Whether obstore's error says the store gave no answer (a refused, reset or dropped connection, a timeout, a
    reply cut short), not an answer that is an error (an HTTP status: 403, 404, 412, a 5xx after the retries)."""
    text = str(exc)
    if "status code:" in text:
        return False
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    return (
        re.search(r"HTTP error|HttpError|error sending request|timed out|connection", text, re.IGNORECASE) is not None
    )


def no_connection(exc: BaseException) -> bool:
    """Whether obstore's error says no connection could even be opened (refused, a name not found): a store that
    may not be there at all, not one that went silent."""
    return "kind: Connect," in str(exc) or "ConnectionRefused" in str(exc)


def retried(exc: BaseException) -> int:
    """How many times obstore retried the request whose error this is (0 when it does not say)."""
    found = re.search(r", after (\d+) retries", str(exc))
    return int(found[1]) if found else 0


def sleep_in_slices(seconds: float) -> None:
    """Sleep ``seconds`` in slices of :data:`SLICE_S`."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, SLICE_S))


def interruptible(call: Callable[[], _T]) -> _T:
    """``call()``; in the main thread run by a daemon helper thread while the main thread waits in slices, so that a
    signal's Python handler runs (and may raise) while obstore holds a request that gets no answer (obstore's call
    returns only after its timeouts and retries). A call the main thread stopped waiting for ends on its own, its
    helper busy meanwhile: the next call takes an idle helper or starts one."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    try:
        inbox = _IDLE.pop()
    except IndexError:
        inbox = queue.SimpleQueue()
        threading.Thread(target=_helper, args=(inbox,), name="ablate-store-request", daemon=True).start()
    done, box = threading.Event(), []
    inbox.put((call, box, done))
    while not done.wait(SLICE_S):
        pass
    ok, value = box[0]
    if ok:
        return value
    raise value


#: Helper threads of :func:`interruptible` waiting for a call, by their inbox.
_IDLE: builtins.list[queue.SimpleQueue] = []
os.register_at_fork(after_in_child=_IDLE.clear)  # a forked child has none of its parent's threads


def _helper(inbox: queue.SimpleQueue) -> None:
    """Make the calls put in ``inbox``, one at a time, each waited for by a main thread."""
    while True:
        call, box, done = inbox.get()
        try:
            box.append((True, call()))
        except BaseException as exc:  # handed to the waiting thread
            box.append((False, exc))
        _IDLE.append(inbox)
        done.set()
        del call, box, done  # an idle helper holds no request's data
