"""An MTE pipe on its own: issue order, streaming one at a time, fences (hand arithmetic)."""

from __future__ import annotations

from npusim.engine.env import SimEnv
from npusim.hw.pipe import TransferPipe


def test_transfers_stream_in_order_and_a_fence_waits_for_every_delivery():
    env = SimEnv()
    pipe = TransferPipe(env, "mte3")
    log: list[tuple[str, str, float]] = []

    def transfer(name: str, stream_ns: float, flight_ns: float):
        def delivered(_e):
            log.append((name, "delivered", env.now))
            pipe.delivered()

        def sent(_e):
            log.append((name, "sent", env.now))
            pipe.sent()
            env.timeout(flight_ns).callbacks.append(delivered)

        def begin():
            log.append((name, "start", env.now))
            env.timeout(stream_ns).callbacks.append(sent)
        return begin

    pipe.submit(2.0, transfer("a", 3.0, 10.0))  # free pipe: starts at its issue time, 2
    pipe.submit(0.0, transfer("b", 1.0, 10.0))  # streams once a's last byte has left, 5
    pipe.fence()
    pipe.submit(0.0, transfer("c", 1.0, 1.0))  # fenced: after a (15) and b (16) landed
    pipe.submit(0.0, transfer("d", 1.0, 1.0))  # unfenced, but behind c in issue order
    env.run()
    assert log == [
        ("a", "start", 2.0), ("a", "sent", 5.0), ("b", "start", 5.0), ("b", "sent", 6.0),
        ("a", "delivered", 15.0), ("b", "delivered", 16.0), ("c", "start", 16.0),
        ("c", "sent", 17.0), ("d", "start", 17.0), ("d", "sent", 18.0),
        ("c", "delivered", 18.0), ("d", "delivered", 19.0),
    ]
