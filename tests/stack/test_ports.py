"""The stack's ports (kept in .local/ports.json) are picked outside the kernel's ephemeral
range, so no client's outgoing connection holds one when its service starts late in a test
session; a port in use, or kept for another service, is passed over."""

from __future__ import annotations

import socket

from exactly_once_stack import settings
from exactly_once_stack.settings import LOOPBACK, PORT_NAMES


def test_the_ports_are_picked_outside_the_ephemeral_range_each_its_own():
    first, last = settings._ephemeral_ports()
    kept: dict[str, int] = {}
    for name in PORT_NAMES:
        kept[name] = settings._free_port(name, kept)
    assert len(set(kept.values())) == len(PORT_NAMES), kept
    assert not [port for port in kept.values() if first <= port <= last], (first, last, kept)


def test_a_port_in_use_or_kept_is_passed_over(monkeypatch):
    kept = {"postgres": settings._free_port("postgres", {})}
    free = settings._free_port("kafka", kept)
    with socket.socket() as busy:
        busy.bind((LOOPBACK, 0))
        busy.listen()
        picks = iter([busy.getsockname()[1], kept["postgres"], free])
        monkeypatch.setattr(settings.secrets, "choice", lambda _ports: next(picks))
        assert settings._free_port("kafka", kept) == free
