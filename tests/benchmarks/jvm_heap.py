"""A live HotSpot JVM's heap, read from the performance counters it publishes in its
`hsperfdata` file (what `jstat -gc` reads), without attaching to it or starting a JVM: the
bytes its collector's spaces hold and the most they may hold (its -Xmx). A benchmark samples
it while a job runs: the peak it sees is a lower bound, as the heap fills and empties between
samples."""

from __future__ import annotations

import os
import pwd
import struct
from dataclasses import dataclass
from pathlib import Path

_MAGIC = 0xCAFEC0C0
_PROLOGUE = 32  # magic, byte order, versions, accessible, used, overflow, mod time, entry offset, entries
_ENTRY = struct.Struct("iiibbbbi")  # length, name offset, vector length, type, flags, units, variability, data offset
_USED = ("sun.gc.generation.", ".used")  # sun.gc.generation.<g>.space.<s>.used: eden, survivors, old
_MAX = "sun.gc.generation.{}.maxCapacity"
_POLICY = "sun.gc.policy.name"  # G1's generations may each grow to the whole heap; the others' add up to it


@dataclass(frozen=True)
class Heap:
    used: int  # bytes in the collector's spaces: eden, the survivors, the old generation
    most: int  # bytes the young and old generations may grow to: the -Xmx (G1 counts a few bytes more)


def counters_file(pid: int) -> Path:
    """Where HotSpot on Linux publishes them, whatever TMPDIR says: /tmp, by the user's name."""
    return Path("/tmp") / f"hsperfdata_{pwd.getpwuid(os.geteuid()).pw_name}" / str(pid)


def heap(pid: int) -> Heap | None:
    """The JVM's heap now; None if `pid` is no JVM publishing its counters (yet, or any more:
    a JVM killed leaves its file behind)."""
    try:
        alive = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
        data = counters_file(pid).read_bytes() if alive else b""
    except (OSError, KeyError):  # KeyError: a user with no name, for whom HotSpot publishes nothing
        return None
    try:
        counters = _counters(data)
    except (struct.error, ValueError):  # a buffer cut short
        return None
    if counters is None:
        return None
    used = sum(v for name, v in counters.items() if name.startswith(_USED[0]) and name.endswith(_USED[1])
               and ".space." in name and isinstance(v, int))
    young, old = counters.get(_MAX.format(0), 0), counters.get(_MAX.format(1), 0)
    return Heap(used, max(young, old) if counters.get(_POLICY) == "GarbageFirst" else young + old)


def _counters(data: bytes) -> dict[str, int | str] | None:
    """The counters of type long, and strings, by name; None unless the file is a readable
    PerfData buffer."""
    if len(data) < _PROLOGUE or struct.unpack_from(">I", data)[0] != _MAGIC:
        return None
    order = "<" if data[4] == 1 else ">"
    accessible = data[7]
    entry_offset, entries = struct.unpack_from(order + "ii", data, 24)
    if not accessible:
        return None
    entry = struct.Struct(order + _ENTRY.format)
    counters, at = {}, entry_offset
    for _ in range(entries):
        if at + entry.size > len(data):
            break
        length, name_at, vector, kind, _flags, _units, _variability, data_at = entry.unpack_from(data, at)
        if length <= 0:
            break
        name = data[at + name_at:data.index(b"\0", at + name_at)].decode("ascii", "replace")
        if chr(kind) == "J" and vector == 0:
            counters[name] = struct.unpack_from(order + "q", data, at + data_at)[0]
        elif chr(kind) == "B" and vector > 0:
            text = data[at + data_at:at + data_at + vector]
            counters[name] = text.split(b"\0", 1)[0].decode("ascii", "replace")
        at += length
    return counters


class HeapPeak:
    """The largest heap in use seen over `sample` calls of one JVM, and its most."""

    def __init__(self) -> None:
        self.used = 0
        self.most = 0

    def sample(self, pid: int) -> None:
        now = heap(pid)
        if now is not None:
            self.used, self.most = max(self.used, now.used), max(self.most, now.most)

    def peak(self) -> Heap | None:
        """What the samples saw; None if none read the JVM."""
        return Heap(self.used, self.most) if self.most else None
