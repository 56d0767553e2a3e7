"""Work forked from the current CUDA stream onto a side stream, joined back where its results are first needed."""

from __future__ import annotations

import torch


class SideStream:
    """Work forked onto `stream`; join() makes the current stream wait and marks its tensors used there."""

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.stream, self.main = stream, torch.cuda.current_stream(stream.device)
        stream.wait_stream(self.main)
        self._ctx = torch.cuda.stream(stream)

    def __enter__(self) -> "SideStream":
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)

    def record(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def join(self, event: torch.cuda.Event, *tensors: torch.Tensor) -> None:
        self.main.wait_event(event)
        if not torch.cuda.is_current_stream_capturing():
            for tensor in tensors:
                tensor.record_stream(self.main)
