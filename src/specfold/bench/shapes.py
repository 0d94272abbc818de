"""The real layer shapes of the supported model families — the one table every benchmark and the kernel compile
check read (``specfold bench layer / pass / batch / kernels --shape NAME``).

Each entry is the published ``config.json`` of the checkpoint named (hidden size, heads, KV heads, head dim, FFN
size, q/k/v bias, vocabulary, layers; the family when it is neither of the first two). A family added later adds its
checkpoints here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    qkv_bias: bool  # Qwen2 layers (Fast-dLLM-v2); no bias: the NLD family (Ministral3, Llama-4 query scale)
    vocab: int
    layers: int
    family: str = ""  # "" = by the bias: fast_dllm_v2 with, nld without; "sdar": Qwen3 layers (qk-norm, no bias);
    # "llada" / "dream": fully bidirectional families (Llama block without bias / Qwen2 with)

    @property
    def family_name(self) -> str:
        return self.family or ("fast_dllm_v2" if self.qkv_bias else "nld")


SHAPES: dict[str, LayerShape] = {
    # Fast-dLLM-v2 = Qwen2.5 layers (Efficient-Large-Model/Fast_dLLM_v2_1.5B and _7B)
    "fast-dllm-v2-1.5b": LayerShape(1536, 12, 2, 128, 8960, True, 151936, 28),
    "fast-dllm-v2-7b": LayerShape(3584, 28, 4, 128, 18944, True, 152064, 28),
    # Nemotron-Labs-Diffusion = Ministral 3 backbones (3B / 8B / 14B)
    "nld-3b": LayerShape(3072, 32, 8, 128, 9216, False, 131072, 26),
    "nld-8b": LayerShape(4096, 32, 8, 128, 14336, False, 131072, 34),  # published NLD-8B config.json
    "nld-14b": LayerShape(5120, 32, 8, 128, 16384, False, 131072, 40),
    # SDAR = Qwen3 layers (JetLM SDAR-4B-Chat / SDAR-8B-Chat; Qwen3-4B / 8B shapes, q/k RMSNorm, no bias)
    "sdar-4b": LayerShape(2560, 32, 8, 128, 9728, False, 151936, 36, family="sdar"),
    "sdar-8b": LayerShape(4096, 32, 8, 128, 12288, False, 151936, 36, family="sdar"),
    # LLaDA = OLMo's Llama block, MHA (GSAI-ML/LLaDA-8B-Instruct: d_model 4096, 32/32 heads, mlp_hidden_size 12288,
    # embedding_size 126464); Dream = Qwen2.5-7B layers (Dream-org/Dream-v0-Instruct-7B). Both fully bidirectional.
    "llada-8b": LayerShape(4096, 32, 32, 128, 12288, False, 126464, 32, family="llada"),
    "dream-7b": LayerShape(3584, 28, 4, 128, 18944, True, 152064, 28, family="dream"),
}
