class Writer:
    """Frames to the socket ``fd``, in order; past what the kernel takes at once,
    written by a thread of its own (``_writer.c``)."""

    completed: int
    queued_bytes: int
    done_fd: int
    started: bool
    closed: bool

    def __init__(self, fd: int) -> None: ...
    def write(self, parts: list[bytes | bytearray | memoryview]) -> int: ...
    def reap(self) -> None: ...
    def close(self) -> None: ...
