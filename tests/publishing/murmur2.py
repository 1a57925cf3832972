"""Java's default partitioner for keyed records (org.apache.kafka.common.utils.Utils.murmur2),
to check that published records land where Java producers would put them."""

from __future__ import annotations

_M, _MASK = 0x5BD1E995, 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = data[length - length % 4:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def java_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions
