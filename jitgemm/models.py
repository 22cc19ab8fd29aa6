"""The (N, K) of the linear layers of a few public LLMs, for `jitgemm precompile --model NAME
--m RANGE`: y = x @ W with x (M, K) the tokens' activations and W (K, N) a full, unsharded
weight (with tensor parallelism divide N, column-parallel, or K, row-parallel, by the degree).

Each preset is derived from the fields of the model's public Hugging Face ``config.json``, as
given in the comments: attention as one fused QKV projection and the MLP's gate and up
projections as one fused GEMM, as serving engines run them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    name: str
    source: str  # the Hugging Face repository whose config.json gives the sizes
    layers: tuple[tuple[str, int, int], ...]  # (layer, N, K)

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """The distinct (N, K) pairs, in layer order."""
        return list(dict.fromkeys((n, k) for _, n, k in self.layers))


def _llama_like(
    name: str,
    source: str,
    hidden_size: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
) -> Model:
    """A Llama-style decoder layer: grouped-query attention (head_dim = hidden_size /
    num_attention_heads) and a SwiGLU MLP."""
    head_dim = hidden_size // num_attention_heads
    return Model(
        name,
        source,
        (
            ("qkv_proj", (num_attention_heads + 2 * num_key_value_heads) * head_dim, hidden_size),
            ("o_proj", hidden_size, num_attention_heads * head_dim),
            ("gate_up_proj", 2 * intermediate_size, hidden_size),
            ("down_proj", hidden_size, intermediate_size),
        ),
    )


MODELS = {
    m.name: m
    for m in (
        # meta-llama/Meta-Llama-3-8B (and Llama-3.1-8B): hidden_size 4096, intermediate_size 14336,
        # num_attention_heads 32, num_key_value_heads 8 -> QKV 6144x4096, O 4096x4096,
        # gate_up 28672x4096, down 4096x14336
        _llama_like("llama-3-8b", "meta-llama/Meta-Llama-3-8B", 4096, 14336, 32, 8),
        # meta-llama/Meta-Llama-3-70B (and Llama-3.1-70B): hidden_size 8192, intermediate_size 28672,
        # num_attention_heads 64, num_key_value_heads 8 -> QKV 10240x8192, O 8192x8192,
        # gate_up 57344x8192, down 8192x28672
        _llama_like("llama-3-70b", "meta-llama/Meta-Llama-3-70B", 8192, 28672, 64, 8),
        # Qwen/Qwen2.5-7B: hidden_size 3584, intermediate_size 18944, num_attention_heads 28,
        # num_key_value_heads 4 -> QKV 4608x3584 (its bias is no part of the GEMM), O 3584x3584,
        # gate_up 37888x3584, down 3584x18944
        _llama_like("qwen2.5-7b", "Qwen/Qwen2.5-7B", 3584, 18944, 28, 4),
        # mistralai/Mistral-7B-v0.1 (and v0.3): hidden_size 4096, intermediate_size 14336,
        # num_attention_heads 32, num_key_value_heads 8: the same GEMMs as Llama-3-8B
        _llama_like("mistral-7b", "mistralai/Mistral-7B-v0.1", 4096, 14336, 32, 8),
        # deepseek-ai/DeepSeek-V3: hidden_size 7168; the dense MLP of its first
        # first_k_dense_replace = 3 layers, intermediate_size 18432 -> gate_up 36864x7168,
        # down 7168x18432. (Its MoE layers' experts are grouped GEMMs, which jitgemm does not run yet.)
        Model(
            "deepseek-v3-mlp",
            "deepseek-ai/DeepSeek-V3",
            (("gate_up_proj", 2 * 18432, 7168), ("down_proj", 7168, 18432)),
        ),
        # deepseek-ai/DeepSeek-V3's multi-head latent attention: hidden_size 7168, q_lora_rank 1536,
        # kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128,
        # num_attention_heads 128 -> q_a_proj and kv_a_proj_with_mqa fused (1536 + 512 + 64 = 2112)
        # 2112x7168, q_b_proj 128 * (128 + 64) = 24576 x 1536, kv_b_proj 128 * (128 + 128) = 32768
        # x 512, o_proj 7168 x 128 * 128 = 16384
        Model(
            "deepseek-v3-mla",
            "deepseek-ai/DeepSeek-V3",
            (
                ("q_a_kv_a_proj", 1536 + 512 + 64, 7168),
                ("q_b_proj", 128 * (128 + 64), 1536),
                ("kv_b_proj", 128 * (128 + 128), 512),
                ("o_proj", 7168, 128 * 128),
            ),
        ),
    )
}
