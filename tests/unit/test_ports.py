"""`free_port`: a port another process's bind to port 0 cannot take before ours."""

from __future__ import annotations

import socket

import pytest

from redrive.ports import ephemeral_low, free_port, port_in_use


@pytest.mark.skipif(ephemeral_low() is None, reason="no ephemeral port range to read")
def test_a_free_port_is_bindable_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    below = ephemeral_low()
    assert below is not None
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports), "a port was handed out twice"
    assert all(10_000 <= port < below for port in ports)
    port = ports[-1]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert port_in_use(port)
        # Taken now: the next ones are others.
        assert port not in {free_port() for _ in range(50)}
