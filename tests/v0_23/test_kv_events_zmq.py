"""KV-cache events through vLLM 0.23.0's own `ZmqEventPublisher`, on loopback
(127.0.0.1) only: the scheduler built stock and with hybridcache each publish
to their own SUB socket; a subscriber decodes the wire bytes into vLLM's
msgspec classes (`KVEventBatch` of `BlockStored` / `BlockRemoved` /
`AllBlocksCleared`). The decoded streams must be identical, batch by batch,
live and through the publisher's replay endpoint. Every wait is bounded."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")

from v0_23.test_vllm_scheduler_e2e import Case, build_scheduler, run_lockstep, stub_model_dir  # noqa: E402
from vllm.config import KVEventsConfig  # noqa: E402
from vllm.distributed.kv_events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)

LOOPBACK = "127.0.0.1"
TOPIC = "hybridcache-test"
RECV_DEADLINE_S = 20.0
END_SEQ = int.from_bytes(ZmqEventPublisher.END_SEQ, "big", signed=True)


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class Subscriber:
    """SUB socket bound on loopback (the publisher connects to it)."""

    def __init__(self, ctx: Any) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        self.port = self.sock.bind_to_random_port(f"tcp://{LOOPBACK}")
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.batches: dict[int, KVEventBatch] = {}

    def poll_once(self, timeout_ms: int) -> bool:
        if not self.sock.poll(timeout_ms):
            return False
        topic, seq, payload = self.sock.recv_multipart()
        assert topic == TOPIC.encode()
        self.batches[int.from_bytes(seq, "big")] = self.decoder.decode(payload)
        return True

    def close(self) -> None:
        self.sock.close(linger=0)


def _events_config(sub: Subscriber, replay_port: int) -> KVEventsConfig:
    # No "*" in the endpoint: vLLM's publisher connects to our bound SUB.
    return KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=f"tcp://{LOOPBACK}:{sub.port}",
        replay_endpoint=f"tcp://{LOOPBACK}:{replay_port}",
        topic=TOPIC,
    )


def _build(case: Case, model_dir: str, hybrid: bool, sub: Subscriber) -> Any:
    for attempt in range(5):  # the replay port is picked free, then bound by the publisher
        try:
            sched = build_scheduler(case, model_dir, hybrid, _events_config(sub, _free_loopback_port()))
        except zmq.ZMQError:
            if attempt == 4:
                raise
            continue
        assert isinstance(sched.kv_event_publisher.inner, ZmqEventPublisher)
        return sched
    raise AssertionError("unreachable")


def _handshake(sched: Any, sub: Subscriber) -> int:
    """PUB drops messages until the subscription reaches it: publish empty
    probe batches until one arrives. Returns the number of probes sent."""
    publisher = sched.kv_event_publisher.inner
    deadline = time.monotonic() + RECV_DEADLINE_S
    sent = 0
    while time.monotonic() < deadline:
        publisher.publish(KVEventBatch(ts=time.time(), events=[]))
        sent += 1
        if sub.poll_once(100):
            # Drain the probes still in flight (bounded).
            while sub.poll_once(200):
                pass
            return sent
    raise AssertionError("the ZMQ subscriber never received a probe batch")


def _receive_all(sub: Subscriber, last_seq: int) -> None:
    deadline = time.monotonic() + RECV_DEADLINE_S
    while max(sub.batches, default=-1) < last_seq:
        assert time.monotonic() < deadline, f"timed out: got seqs up to {max(sub.batches, default=-1)}, want {last_seq}"
        sub.poll_once(100)


def _replay(ctx: Any, sched: Any, start_seq: int) -> dict[int, KVEventBatch]:
    """vLLM's replay protocol: send a start sequence number to the ROUTER,
    receive (seq, payload) frames until END_SEQ."""
    endpoint = sched.kv_event_publisher.inner._replay_endpoint
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    out: dict[int, KVEventBatch] = {}
    try:
        dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
        deadline = time.monotonic() + RECV_DEADLINE_S
        while True:
            assert time.monotonic() < deadline, "timed out waiting for the replay"
            if not dealer.poll(100):
                continue
            _, seq_bytes, payload = dealer.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == END_SEQ:
                return out
            out[seq] = decoder.decode(payload)
    finally:
        dealer.close(linger=0)


def _strip(batches: dict[int, KVEventBatch], first: int) -> list[list[Any]]:
    """Event lists of the batches from `first` on, in sequence order (ts dropped)."""
    seqs = sorted(s for s in batches if s >= first)
    assert seqs == list(range(first, first + len(seqs))), "sequence numbers have gaps"
    return [batches[s].events for s in seqs]


CASES = [
    Case("zmq_prefix_caching_resets", prefix_caching=True, events=True, num_spec=3, num_blocks=120,
         max_num_seqs=12, prompt_len=(16, 260), arrival_p=0.5, reset_every=53, steps=160, seed=21),
    Case("zmq_hybrid_mamba_align", prefix_caching=True, events=True, mamba="align", num_spec=2, eagle=True,
         num_blocks=90, max_num_seqs=10, prompt_len=(20, 240), arrival_p=0.5, steps=160, seed=22),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kv_events_over_zmq_identical(case: Case, tmp_path_factory: Any) -> None:
    model_dir = stub_model_dir(tmp_path_factory.mktemp("hybridcache-zmq"))
    ctx = zmq.Context.instance()
    subs = [Subscriber(ctx), Subscriber(ctx)]
    scheds: list[Any] = []
    try:
        scheds = [_build(case, model_dir, hybrid, sub) for hybrid, sub in zip((False, True), subs)]
        probes = [_handshake(s, sub) for s, sub in zip(scheds, subs)]
        # In-process comparison every step (as the e2e test), then the wire.
        totals = run_lockstep(case, model_dir, schedulers=(scheds[0], scheds[1]))
        assert totals["events"] > 0

        streams = []
        for s, sub, n_probes in zip(scheds, subs, probes):
            recorder = s.kv_event_publisher
            last_seq = n_probes + recorder.num_published - 1
            _receive_all(sub, last_seq)
            live = _strip(sub.batches, n_probes)
            assert len(live) == recorder.num_published
            replayed = _strip(_replay(ctx, s, n_probes), n_probes)
            assert replayed == live
            streams.append(live)
        stock, hybrid = streams
        assert stock == hybrid

        kinds = {type(e) for batch in stock for e in batch}
        assert BlockStored in kinds and BlockRemoved in kinds
        if case.reset_every:
            assert AllBlocksCleared in kinds
        if case.mamba:
            assert {e.group_idx for batch in stock for e in batch if isinstance(e, BlockStored)} == {0, 1}
        for batch in stock:
            for e in batch:
                if isinstance(e, BlockStored) and e.kv_cache_spec_kind == "full_attention":
                    assert len(e.token_ids) == len(e.block_hashes) * e.block_size
    finally:
        for s in scheds:
            s.shutdown()
        for sub in subs:
            sub.close()
