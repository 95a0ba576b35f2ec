"""Stand-ins shared by tests in several folders (no DGL): CUDA streams and events that record what a
:class:`~dgl_oac.engine.transfer.Transfer` asks of them (so its stream hand-offs are tested on the CPU), and a
depth controller that follows a fixed cycle."""
import contextlib
import itertools

import torch

from dgl_oac.engine.transfer import CudaStreams


class FakeStream:
    def __init__(self, name):
        self.name, self.waited_events, self.waited_streams = name, [], []

    def wait_event(self, event):
        self.waited_events.append(event)

    def wait_stream(self, stream):
        self.waited_streams.append(stream)

    def __repr__(self):
        return f"FakeStream({self.name})"


class FakeEvent:
    def __init__(self, log):
        self.log, self.recorded_on = log, []

    def record(self, stream):
        self.recorded_on.append(stream)
        self.log.append(("event.record", stream))


class RecordingStreams(CudaStreams):
    """Every raw stream/event call of a Transfer, recorded; ``current(device)`` returns one stream per device."""

    def __init__(self):
        self.log, self.made, self.currents, self.active = [], [], {}, None

    def new_stream(self, device):
        s = FakeStream(f"side{len(self.made)}@{device}")
        self.made.append(s)
        return s

    def current(self, device):
        self.log.append(("current", device))
        return self.currents.setdefault(device, FakeStream(f"current@{device}"))

    @contextlib.contextmanager
    def use(self, stream):
        outer, self.active = self.active, stream
        self.log.append(("enter", stream))
        try:
            yield
        finally:
            self.active = outer
            self.log.append(("exit", stream))

    def new_event(self):
        return FakeEvent(self.log)

    def record(self, tensor, stream):
        self.log.append(("record", tensor.data_ptr(), stream, self.active))

    def pinned(self, shape, dtype):
        """A plain tensor standing in for pinned memory; its allocation is logged with its address."""
        t = torch.empty(tuple(shape), dtype=dtype)
        self.log.append(("pinned", tuple(shape), dtype, t.data_ptr()))
        return t


class Scripted:
    """A controller whose depth follows a fixed cycle: every batch may run at another depth."""

    def __init__(self, cycle):
        self.cycle = itertools.cycle(cycle)
        self.current = next(self.cycle)
        self.chosen = {}
        self.probe_batches = 0  # (it never probes)

    def depth(self):
        return self.current

    def record(self, seconds):
        self.chosen[self.current] = self.chosen.get(self.current, 0) + 1
        self.current = next(self.cycle)
