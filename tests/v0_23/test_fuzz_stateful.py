"""Hypothesis state machine: hybridcache.KVCacheManager against vLLM 0.23.0's,
the same operations to both (hybridcache.request.Request objects, which
vLLM's manager only reads), every output compared (block ids and which are
unhashed, hit lengths, None, free count, usage, events, stats, common prefix
blocks, new block ids, every block's ref_cnt / hash, the free-queue order,
every request's table) and `check_invariants()` after every operation.

The operations and their legality rules live in `hybridcache_dev.fuzz.Driver`
(shared with the long fuzz, `python -m hybridcache_dev.fuzz`); here hypothesis
draws every choice, so failures shrink to a minimal sequence. Bad inputs go
to hybridcache only and must be rejected cleanly without any state change.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

# Compares against vLLM 0.23.0 (tests/conftest.py: left to that release's venv elsewhere).
pytestmark = pytest.mark.vllm("0.23.0")

pytest.importorskip("hypothesis")
pytest.importorskip("vllm.v1.core.kv_cache_manager")

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule  # noqa: E402

from hybridcache_dev.fuzz import MIXES, Driver, random_setup  # noqa: E402


class DataChooser:
    """`Driver`'s chooser interface over hypothesis' `data.draw`."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def randint(self, a: int, b: int) -> int:
        return self.data.draw(st.integers(a, b))

    def chance(self, p: float) -> bool:
        return self.data.draw(st.integers(0, 999)) < p * 1000

    def choice(self, seq: Any) -> Any:
        return self.data.draw(st.sampled_from(list(seq)))

    def random(self) -> float:
        return self.data.draw(st.floats(0, 1, exclude_max=True))


class ManagerMachine(RuleBasedStateMachine):
    """One random setup of a spec mix per example; rules are the API ops."""

    d: Driver

    @initialize(mix=st.sampled_from(MIXES), caching=st.booleans(), seed=st.integers(0, 2**16))
    def setup(self, mix: str, caching: bool, seed: int) -> None:
        self.d = Driver(random_setup(random.Random(seed), mix, caching))

    def _op(self, name: str, data: Any) -> None:
        self.d.run_op(name, DataChooser(data))

    @rule(data=st.data())
    def arrive(self, data: Any) -> None:
        self._op("arrive", data)

    @rule(data=st.data())
    def lookup(self, data: Any) -> None:
        self._op("lookup", data)

    @rule(data=st.data())
    def admit(self, data: Any) -> None:
        self._op("admit", data)

    @rule(data=st.data())
    def step(self, data: Any) -> None:
        self._op("step", data)

    @rule(data=st.data())
    def step_again(self, data: Any) -> None:  # decode rounds dominate real traffic
        self._op("step", data)

    @rule(data=st.data())
    def raw_step(self, data: Any) -> None:
        self._op("raw_step", data)

    @rule(data=st.data())
    def finish_load(self, data: Any) -> None:
        self._op("finish_load", data)

    @rule(data=st.data())
    def preempt(self, data: Any) -> None:
        self._op("preempt", data)

    @rule(data=st.data())
    def finish(self, data: Any) -> None:
        self._op("finish", data)

    @rule(data=st.data())
    def free_unknown(self, data: Any) -> None:
        self._op("free_unknown", data)

    @rule(data=st.data())
    def evict(self, data: Any) -> None:
        self._op("evict", data)

    @rule(data=st.data())
    def reset(self, data: Any) -> None:
        self._op("reset", data)

    @rule(data=st.data())
    def remove_skipped(self, data: Any) -> None:
        self._op("remove_skipped", data)

    @rule(data=st.data())
    def new_step(self, data: Any) -> None:
        self._op("new_step", data)

    @rule(data=st.data())
    def cache_blocks(self, data: Any) -> None:
        self._op("cache_blocks", data)

    @rule(data=st.data())
    def common_prefix(self, data: Any) -> None:
        self._op("common_prefix", data)

    @rule(data=st.data())
    def queries(self, data: Any) -> None:
        self._op("queries", data)

    @rule(data=st.data())
    def bad_input(self, data: Any) -> None:
        self._op("bad_input", data)

    @invariant()
    @precondition(lambda self: hasattr(self, "d"))
    def invariants_hold(self) -> None:
        self.d.hc.check_invariants()

    def teardown(self) -> None:
        if hasattr(self, "d"):
            # Freeing everything gives every block back; reset then succeeds.
            self.d.drain()


ManagerMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TestManagerMachine = ManagerMachine.TestCase
