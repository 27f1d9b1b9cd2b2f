"""Tiny local models for vLLM's real engine: a folder with config.json, a
word-level tokenizer (tokenizer.json built with the `tokenizers` package) and
no weights: the engine runs them with `load_format="dummy"` (random weights
from the engine's seed, the same on both sides of a comparison).

Three architectures the CPU build of vLLM runs: a Llama-style dense model,
Gemma2 (every other layer a sliding window) and Qwen3-Next (Gated-DeltaNet
layers, which vLLM manages as Mamba groups, and one full-attention layer).
"""

from __future__ import annotations

import json
from pathlib import Path

from hybridcache.verify_workload import WORDS

SPECIAL = ["<unk>", "<s>", "</s>"]
VOCAB_SIZE = 512  # rows of the embedding: the tokenizer's words and spare ids


def write_tokenizer(folder: Path) -> None:
    """A whitespace word-level tokenizer over the verify workload's words."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(SPECIAL + sorted(set(WORDS)))}
    assert len(vocab) <= VOCAB_SIZE
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
        "eos_token": "</s>", "model_max_length": 4096, "clean_up_tokenization_spaces": False,
    }))


def _common() -> dict:
    return {"vocab_size": VOCAB_SIZE, "bos_token_id": 1, "eos_token_id": 2, "max_position_embeddings": 4096,
            "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "initializer_range": 0.02}


def llama() -> dict:
    return {**_common(), "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 64, "hidden_act": "silu", "rope_theta": 10000.0,
            "tie_word_embeddings": False}


def gemma2() -> dict:
    # vLLM's Gemma2 asserts tied embeddings; layers alternate sliding/full.
    return {**_common(), "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 64, "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": 64, "sliding_window": 64, "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0, "rope_theta": 10000.0, "tie_word_embeddings": True,
            "pad_token_id": 0}


def qwen3_next() -> dict:
    # Three Gated-DeltaNet layers and one attention layer; vLLM's Qwen3-Next
    # needs at least one MoE layer (decoder_sparse_step 1: all are MoE). One
    # key and one value head keep the recurrent state small (4.6 KiB), so the
    # attention page vLLM pads it to stays at 32-token blocks.
    return {**_common(), "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
            "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 64, "hidden_act": "silu", "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
            "linear_num_key_heads": 1, "linear_num_value_heads": 1, "decoder_sparse_step": 1,
            "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "num_experts_per_tok": 2,
            "num_experts": 4, "norm_topk_prob": True, "mlp_only_layers": [], "tie_word_embeddings": False}


BUILDERS = {"llama": llama, "gemma2": gemma2, "qwen3_next": qwen3_next}


def make_model(folder: Path, kind: str) -> Path:
    """Writes the tiny model `kind` (a key of BUILDERS) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(BUILDERS[kind](), indent=1))
    write_tokenizer(folder)
    return folder
