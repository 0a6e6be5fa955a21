"""A producer thread that keeps reading and decoding ahead of the model."""

from __future__ import annotations

import threading
from typing import Iterator


class Prefetcher:
    """Runs a producer in a background thread, `depth` results ahead of the consumer.

    Reading and decoding (file I/O, TensorFlow's decoders, Pillow's C code: all release the GIL) overlap
    with the model working on the previous batch. An exception in the producer is raised in the consumer.
    """

    _DONE = object()

    def __init__(self, produce: Iterator, depth: int = 2):
        import queue

        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(produce,), daemon=True, name="predict-prefetch")
        self._thread.start()

    def _put(self, item) -> bool:
        import queue

        while not self._stop:
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, produce: Iterator) -> None:
        try:
            for item in produce:
                if not self._put(item):
                    return
            self._put(self._DONE)
        except BaseException as e:  # handed to the consumer, which raises it
            self._put(e)

    def __iter__(self):
        while True:
            item = self._queue.get()
            if item is self._DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop = True
        self._thread.join()
