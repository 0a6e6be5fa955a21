"""TensorBoard event files without TensorFlow, for the frameworks other than TensorFlow: the tensorboard package's
record framing (TFRecord, masked CRC32C) and Event protobufs, which import no TensorFlow (torch.utils.tensorboard's
SummaryWriter does, wherever TensorFlow is installed). Scalars only: what the loop logs."""

from __future__ import annotations

import os
import socket
import time

from components.dataio import data
from components.train.frameworks import base


class EventWriter(base.SummaryWriter):
    """`events.out.tfevents.<time>.<host>` in `logdir` (None: writes nothing), the name TensorBoard looks for."""

    def __init__(self, logdir: str | None):
        self.records = None
        if not logdir:
            return
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        data.gfile().makedirs(logdir)
        path = data.join(logdir, f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}")
        self.records = RecordWriter(data.gfile().GFile(path, "wb"))
        self.records.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())

    def scalar(self, name: str, value: float, step: int) -> None:
        if self.records is None:
            return
        from tensorboard.compat.proto import event_pb2, summary_pb2

        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=name, simple_value=float(value))])
        self.records.write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary)
                           .SerializeToString())

    def flush(self) -> None:
        if self.records is not None:
            self.records.flush()
