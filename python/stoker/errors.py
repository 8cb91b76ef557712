"""The stoker exception tree: catch `StokerError` for everything, or one category."""


class StokerError(Exception):
    """Base class of every error stoker raises."""


class ConfigError(StokerError, ValueError):
    """A bad argument: the message names the argument and the allowed values."""


class DatasetError(StokerError):
    """The dataset is unusable: missing root, no class folders, no images."""


class DecodeError(StokerError):
    """A file is not a valid image (corrupt, truncated, empty, unsupported); names the file."""


class ReadError(StokerError, OSError):
    """A file could not be read (missing, unreadable); names the file."""


class MemoryLimitError(StokerError, MemoryError):
    """The memory limit cannot hold a batch, or every batch buffer is held by the consumer."""


class DeviceError(StokerError, RuntimeError):
    """The GPU asked for cannot be used (no driver, no such device) or a CUDA call failed."""


__all__ = ["StokerError", "ConfigError", "DatasetError", "DecodeError", "ReadError", "MemoryLimitError",
           "DeviceError"]
