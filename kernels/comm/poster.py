"""A comm thread that posts a group's ops, so the compute thread does not pay for posting them.

Posting one gloo all-to-all costs the caller ~0.1-0.2 ms (torch's dispatch and gloo's enqueue),
about a fifth of a small op's whole flight; on a GPU the launch is asynchronous and a copy engine
or proxy thread does that work. A group marked with `post_from_thread(group)` has every op posted
by one FIFO thread of this process instead: the caller records the op as issued (its issue time,
its place on an emulated link) and returns at once with a work that the thread fills in. Every op
of such a group goes through the thread in issue order, so all ranks post the group's ops in the
same order, as torch.distributed requires.
"""
from __future__ import annotations

import os
import queue
import threading


class PostedWork:
    """The work of an op the comm thread posts: wait / is_completed / get_future as torch's, the
    future's callbacks attached once the op is posted."""

    def __init__(self):
        self._posted = threading.Event()
        self._lock = threading.Lock()
        self._work = self._error = None
        self._callbacks: list = []

    def _set(self, work, error) -> None:
        """The comm thread: the posted work (or why posting failed); attach waiting callbacks."""
        fut = None
        if work is not None:
            try:
                fut = work.get_future()
            except RuntimeError:   # no future (gloo's p2p): completion is seen at wait()
                fut = None
        with self._lock:
            self._work, self._error = work, error
            callbacks, self._callbacks = self._callbacks, None
            self._posted.set()
        if fut is not None:
            for cb in callbacks:
                fut.add_done_callback(cb)

    def get_future(self) -> "PostedWork":
        return self   # add_done_callback is the only use Handle makes of a future

    def add_done_callback(self, cb) -> None:
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(cb)
                return
            work = self._work
        if work is not None:
            try:
                work.get_future().add_done_callback(cb)
            except RuntimeError:
                pass

    def _posted_work(self):
        self._posted.wait()
        if self._error is not None:
            raise self._error
        return self._work

    def wait(self):
        return self._posted_work().wait()

    def is_completed(self) -> bool:
        return self._posted.is_set() and self._posted_work().is_completed()


class _Poster:
    def __init__(self):
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="partui-comm-post", daemon=True)
        self.thread.start()

    def _loop(self):
        while (item := self.q.get()) is not None:
            fn, work = item
            try:
                work._set(fn(), None)
            except BaseException as e:  # noqa: BLE001 - raised again at the caller's wait
                work._set(None, e)


_poster: list = []          # the process's one comm thread, started on first use
os.register_at_fork(after_in_child=_poster.clear)   # a forked child has no thread: start its own


def post_from_thread(group) -> None:
    """Post every op of this group from the comm thread (a group of one has nothing to post)."""
    if group is not None and group.size > 1:
        group.posted = True


def launch(group, fn):
    """fn() posts the op and returns its work: here, or on the comm thread for a marked group."""
    if not getattr(group, "posted", False):
        return fn()
    if not _poster:
        _poster.append(_Poster())
    work = PostedWork()
    _poster[0].q.put((fn, work))
    return work


def stop() -> None:
    """End the comm thread after what it holds is posted (the world is being torn down)."""
    if _poster:
        p = _poster.pop()
        p.q.put(None)
        p.thread.join(timeout=30)
