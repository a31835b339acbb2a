"""Opening a file that someone else may have put there: a run's files, a sweep's record, a dataset's manifest, a
config. Only a regular file is read (a FIFO would block the reader forever, `/dev/zero` would fill memory), and
a whole-file read stops at a size limit, so that no file a reader is pointed at can hang it or exhaust it."""

from __future__ import annotations

import functools
import os
import stat
from typing import Any, BinaryIO

#: the largest JSON or YAML file read whole (sweep.json of a thousand runs is a few MB)
MAX_BYTES = 256 * 1024 * 1024


class NotRegular(OSError):
    """The path is there but is not a regular file (a FIFO, a device, a directory)."""


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for binary reading, when it is a regular file (symlinks followed); FileNotFoundError when it
    is missing, NotRegular (an OSError) when it is something else. Opened non-blocking, so a FIFO does not
    wait for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegular(0, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_lock_file(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """A lock file's descriptor, opened read-write and created when missing, never through a symbolic link
    (OSError ELOOP: a planted link would make the opener create a file elsewhere) and only when it is a regular
    file (NotRegular: a FIFO would block the opener). flock(2) works on it as on any descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), mode)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(0, "not a regular file", os.fspath(path))
    return fd


def read_bytes(path: str | os.PathLike[str], limit: int = MAX_BYTES) -> bytes:
    """The whole of a regular file of at most `limit` bytes; OSError (NotRegular, FileNotFoundError, or a
    too-large file, errno EFBIG) otherwise."""
    with open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        import errno

        raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
    return data


#: the most values a YAML document may expand to, each alias counted as everything it repeats (a config holds
#: hundreds; a few lines of nested aliases expand to billions, and whatever walks them hangs)
MAX_YAML_NODES = 100_000
#: the deepest a YAML document may nest (a config nests four or five levels)
MAX_YAML_DEPTH = 64


def load_yaml(text: str, max_nodes: int = MAX_YAML_NODES, max_depth: int = MAX_YAML_DEPTH) -> Any:
    """`yaml.safe_load` of a document someone else may have written, with alias expansion and nesting bounded:
    ValueError (one line) for a document that expands to more than `max_nodes` values, nests deeper than
    `max_depth`, or holds an alias inside its own anchor (a structure that contains itself); yaml.YAMLError for
    one that is not YAML."""
    loader = _bounded_yaml_loader()(text)
    loader.max_nodes, loader.max_depth = max_nodes, max_depth
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


@functools.lru_cache(maxsize=None)
def _bounded_yaml_loader() -> type:
    """A SafeLoader that counts, as it composes, how many values each node expands to (an alias: its anchor's
    count, already known), so a bound is enforced before anything is constructed; built once, yaml imported
    only by the readers that need it."""
    import yaml

    class BoundedSafeLoader(yaml.SafeLoader):
        max_nodes, max_depth = MAX_YAML_NODES, MAX_YAML_DEPTH

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.expanded: dict[int, int] = {}  # id(node) -> the values it stands for, once composed whole
            self.depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) and event.anchor in self.anchors \
                    and id(self.anchors[event.anchor]) not in self.expanded:
                raise ValueError(f"the alias *{event.anchor} is inside its own anchor (a structure that contains itself)")
            self.depth += 1
            if self.depth > self.max_depth:
                raise ValueError(f"nested too deeply (more than {self.max_depth} levels)")
            try:
                node = super().compose_node(parent, index)
            finally:
                self.depth -= 1
            size = self.expanded.get(id(node))
            if size is None:
                if isinstance(node, yaml.SequenceNode):
                    size = 1 + sum(self.expanded.get(id(child), 1) for child in node.value)
                elif isinstance(node, yaml.MappingNode):
                    size = 1 + sum(self.expanded.get(id(k), 1) + self.expanded.get(id(v), 1) for k, v in node.value)
                else:
                    size = 1
                self.expanded[id(node)] = size
            if size > self.max_nodes:
                raise ValueError(f"it expands to more than {self.max_nodes:,} values, each alias counted at every use")
            return node

    return BoundedSafeLoader
