"""DevicesMade: the devices of the tensors code makes, to check that it keeps to its inputs' device on a CPU machine
(run it on meta tensors: a helper made on the host, an arange without device=, shows up as a cpu tensor)."""

import torch
from torch.overrides import TorchFunctionMode


class DevicesMade(TorchFunctionMode):
    """Records the device type of every tensor a torch function returns while it is active."""

    def __init__(self):
        super().__init__()
        self.devices = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.devices |= {
            t.device.type for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)
        }
        return out
