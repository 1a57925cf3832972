"""Files that hold a secret (passwords, keys, the exported environment), private from their
first byte.

`write_private(path, text)` writes the whole file under a temporary name in the same folder,
created by `os.open(..., 0o600)` with O_EXCL (a umask can only take bits away, never add
any), then renames it over `path`. Nothing is written and then `chmod`ed (a window in which
others could read it), and an existing file of a wider mode is replaced, not truncated: a
truncated file would keep its old mode. A reader never sees half a file either.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

MODE = 0o600


def write_private(path: Path, text: str | bytes) -> Path:
    """Writes `text` (UTF-8 if a str) to `path`, readable and writable by its owner only."""
    data = text.encode() if isinstance(text, str) else text
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, MODE)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
