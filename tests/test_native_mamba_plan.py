"""The manager's native Mamba copy plan equals the plan vLLM 0.23.0's worker
builds (the Python reference planner, fed the worker's append-only block
tables), step by step, with chunked prefill and draft counts that change
every round. vLLM 0.33.0's worker decides the same copies (its
`preprocess_mamba` and the post-copy kernel keep 0.23.0's source, bias and
boundary rules), so the 0.33.0 facade's tables are checked against the same
reference (without prefix caching, the Mamba layout it covers)."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from hybridcache import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheManager, MambaSpec, Request
from hybridcache.releases.v0_33.manager import KVCacheManager033
from hybridcache.kernels import (
    native_post_plan,
    native_pre_plan,
    plan_from_block_tables,
    post_plan_from_block_tables,
)

B = 8


def _manager(k: int, num_mamba_groups: int, release: str = "v0_23") -> KVCacheManager:
    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=B))]
    for g in range(num_mamba_groups):
        spec = MambaSpec(block_size=B, mamba_cache_mode="align", num_speculative_blocks=k)
        groups.append(KVCacheGroupSpec([f"m{g}"], spec))
    config = KVCacheConfig(num_blocks=400, kv_cache_groups=groups)
    if release == "v0_33":
        return KVCacheManager033(config, 2048, B, B, enable_caching=False)
    return KVCacheManager(config, 2048, B, B)


@pytest.mark.parametrize("release", ["v0_23", "v0_33"])
@pytest.mark.parametrize("k", [0, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_native_plan_matches_worker_reference(k: int, seed: int, release: str) -> None:
    rng = random.Random(seed)
    m = _manager(k, num_mamba_groups=2, release=release)
    mamba_groups = [1, 2]
    reqs = [Request(f"r{i}", [rng.randrange(20) for _ in range(rng.randrange(5, 60))], B) for i in range(6)]
    for r in reqs:
        r.num_in_flight_tokens = 0  # type: ignore[attr-defined]  # read by 0.33.0's window frees
    worker_ids: dict[str, list[list[int]]] = {}
    state_idx: dict[str, int] = {}
    accepted: dict[str, int] = {r.request_id: 1 for r in reqs}
    copies = 0
    for step in range(40):
        batch, sched, drafts = [], [], []
        for r in reqs:
            if r.num_computed_tokens < r.num_prompt_tokens:
                left = r.num_prompt_tokens - r.num_computed_tokens
                n, d = (min(left, 2 * B) if left > B else left), 0  # block-aligned chunks
            else:
                d = rng.choice([0, k, min(1, k)]) if k else 0
                n = 1 + d
            new = m.allocate_slots(r, n)
            assert new is not None
            ids = m.get_block_ids(r.request_id) if r.request_id not in worker_ids else new.get_block_ids()
            if r.request_id not in worker_ids:
                worker_ids[r.request_id] = [list(ids[g]) for g in mamba_groups]
            else:
                for j, g in enumerate(mamba_groups):
                    worker_ids[r.request_id][j].extend(ids[g])
            batch.append(r)
            sched.append(n)
            drafts.append(d)
        rids = [r.request_id for r in batch]
        ref = plan_from_block_tables(
            [worker_ids[i] for i in rids],
            [r.num_computed_tokens for r in batch],
            sched,
            [accepted[i] for i in rids],
            [state_idx.get(i) for i in rids],
            B,
            k,
        )
        got = native_pre_plan(m, rids, [accepted[i] for i in rids])
        assert torch.equal(got, ref.plan), (step, got, ref.plan)
        copies += len(got)
        for i, cur in zip(rids, ref.state_idx):
            state_idx[i] = cur
        for i, a in zip(rids, ref.num_accepted):
            accepted[i] = a
        ref_post = post_plan_from_block_tables(
            [worker_ids[i] for i in rids],
            [state_idx[i] for i in rids],
            [r.num_computed_tokens for r in batch],
            sched,
            drafts,
            B,
            k,
        )
        assert torch.equal(native_post_plan(m, rids, drafts), ref_post)
        # Model step: prefill chunks complete; decode accepts 1..1+d tokens.
        for r, n, d in zip(batch, sched, drafts):
            if r.num_computed_tokens < r.num_prompt_tokens:
                r.num_computed_tokens += n
                if r.num_computed_tokens >= r.num_prompt_tokens:
                    r.append_output_token_ids([1])
                continue
            a = rng.randint(1, 1 + d)
            r.append_output_token_ids([rng.randrange(20) for _ in range(a)])
            r.num_computed_tokens += a
            accepted[r.request_id] = a
        m.new_step_starts()
        m.check_invariants()
    assert copies > 0


def test_plan_for_unknown_request_is_a_clear_error() -> None:
    m = _manager(0, 1)
    with pytest.raises(KeyError, match="no allocation"):
        native_pre_plan(m, ["ghost"], [1])
    with pytest.raises(ValueError, match="2 entries for 1 requests"):
        m.mamba_pre_copy_plan(["ghost"], [1, 1])
