"""The stoker exception tree: catch `StokerError` for everything, or one category.

The classes are native (made by the extension module, which raises them) and live here:

- ``StokerError(Exception)``: base class of every error stoker raises.
- ``ConfigError(StokerError, ValueError)``: a bad argument; names the argument and the allowed values.
- ``DatasetError(StokerError)``: the dataset is unusable (missing root, no class folders, no images).
- ``DecodeError(StokerError)``: a file is not a valid image; names the file.
- ``ReadError(StokerError, OSError)``: a file could not be read; names the file.
- ``MemoryLimitError(StokerError, MemoryError)``: the memory limit cannot hold a batch, or every batch
  buffer is held by the consumer.
- ``DeviceError(StokerError, RuntimeError)``: the GPU asked for cannot be used, or a CUDA call failed.
"""

from ._stoker import (
    ConfigError,
    DatasetError,
    DecodeError,
    DeviceError,
    MemoryLimitError,
    ReadError,
    StokerError,
)

__all__ = ["StokerError", "ConfigError", "DatasetError", "DecodeError", "ReadError", "MemoryLimitError",
           "DeviceError"]
