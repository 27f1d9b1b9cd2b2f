"""How vLLM 0.33.0's own tests are run against hybridcache, for
scripts/run_vllm_peer_tests.py (see its docstring for what each table means).
The files come from scripts/vllm_tests/vllm-0.33.0.sha256.

The swap needs the 0.33.0 facade (hybridcache.releases); until it is listed
there only `--against-vllm` runs. INTERNALS / VIEWS / UNSUPPORTED are filled
from reading each test once hybridcache's 0.33.0 objects exist, as for 0.23.0
(peer_0_23_0.py); keys are a test function's name, or `FILE_STEM::name` where
two files share one.
"""

# vLLM 0.33.0 cannot infer a device on a machine without a GPU: tests that
# build a VllmConfig fail with "Failed to infer device type" unless told.
ENV: dict[str, str] = {"VLLM_TARGET_DEVICE": "cpu"}
# Model configs the tests load from the Hugging Face cache (HF_HUB_OFFLINE=1):
# hand-written from each model's architecture metadata, no weights, in
# scripts/vllm_tests/hf/ORG/NAME/config.json.
HF_MODELS: tuple[str, ...] = ("facebook/opt-125m",)
# The 0.33.0 scheduler tests build the manager through vLLM's Scheduler, so
# the scheduler's `KVCacheManager` is swapped too.
SWAP_SCHEDULER = True

INTERNALS: dict[str, tuple[str, tuple[str, ...]]] = {}
UNSUPPORTED: dict[str, str] = {}
VIEWS: dict[str, str] = {}
NOT_IMPLEMENTED: tuple[str, ...] = ()
