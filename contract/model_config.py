"""The model's architecture and dimensions, declared once.

The runtime reads them from a plan (contract.plan_document) and builds the model from them
(executor/runtime/models); the planner's request spec `planner.specs.ModelSpec` takes its fields from
here, adding the bounds a request must keep (planner/bounds.py) and its checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from contract.fields import DOCUMENT_CONFIG, AtLeast, check_fields

Architecture = Literal["llama", "gpt2", "layer_graph"]
"""`llama` (Llama 2/3, Mistral, Qwen2/3 dimensions; with `moe` and `latent_attention` the
mixture-of-experts families: Mixtral, Qwen3-MoE, DeepSeek-V3, gpt-oss, Llama 4), `gpt2`, or
`layer_graph` (a traced user model)."""

DERIVED_COUNTS = ("num_params", "flops_per_token")
"""Fields the planner derives (a plan carries them, a request does not)."""


class ModelShape:
    """Derived dimensions, for a class with the fields `hidden_size`, `num_heads`, `num_kv_heads`,
    `head_size` and `intermediate_size` (the contract's ModelConfig and the planner's ModelSpec)."""

    __slots__ = ()

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def attention_width(self) -> int:
        """Width of the query projection and of the attention output: num_heads x head_dim (the
        hidden size, unless `head_size` says otherwise)."""
        return self.num_heads * self.head_dim

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def routed_experts(self) -> int | None:
        """Routed experts per MoE block (`moe.num_experts`), None for a dense model (a class without
        `moe`, a traced layer graph, has none)."""
        moe = getattr(self, "moe", None)
        return moe.num_experts if moe is not None else None


RouterScore = Literal["softmax", "sigmoid"]
"""How a router scores the experts: `softmax` over the experts (Mixtral, Qwen3-MoE, gpt-oss, Llama 4's
sigmoid-free routers), or `sigmoid` per expert with the chosen scores renormalised (DeepSeek-V3)."""


@dataclass(frozen=True, slots=True)
class MoeConfig:
    """A mixture-of-experts feed-forward: which blocks route their tokens to experts, and the experts'
    shapes. The other blocks (`first_dense_layers`, and those between `layer_interval` steps) keep the
    dense feed-forward of `ModelConfig.intermediate_size`. Hugging Face names in brackets."""

    __pydantic_config__: ClassVar[dict[str, Any]] = DOCUMENT_CONFIG

    num_experts: Annotated[int, AtLeast(2)]
    """Routed experts per MoE block (`n_routed_experts`, `num_local_experts`, `num_experts`)."""
    experts_per_token: Annotated[int, AtLeast(1)]
    """Routed experts each token is sent to: the router's top-k (`num_experts_per_tok`)."""
    expert_intermediate_size: Annotated[int, AtLeast(1)]
    """Hidden size of one routed expert's SwiGLU (`moe_intermediate_size`; Mixtral's `intermediate_size`)."""
    num_shared_experts: Annotated[int, AtLeast(0)] = 0
    """Experts every token goes through besides the routed ones (`n_shared_experts`; Llama 4: 1)."""
    shared_expert_intermediate_size: Annotated[int, AtLeast(1)] | None = None
    """Hidden size of each shared expert; None: `expert_intermediate_size`."""
    first_dense_layers: Annotated[int, AtLeast(0)] = 0
    """Blocks at the start that keep the dense feed-forward (`first_k_dense_replace`: DeepSeek-V3's 3)."""
    layer_interval: Annotated[int, AtLeast(1)] = 1
    """After the dense ones, every `layer_interval`-th block is an MoE block, the others dense
    (`interleave_moe_layer_step`: Llama 4 Maverick's 2); 1: every one."""
    router: RouterScore = "softmax"
    """How the router scores the experts."""
    router_bias: bool = False
    """A per-expert bias added to the scores for choosing only, adjusted between steps to balance the
    load without an auxiliary loss (DeepSeek-V3's `topk_method: noaux_tc`)."""
    expert_bias: bool = False
    """Biases on the experts' projections (gpt-oss)."""

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def shared_size(self) -> int:
        return self.shared_expert_intermediate_size or self.expert_intermediate_size

    def is_moe_layer(self, index: int) -> bool:
        """Whether block `index` (from 0) routes its tokens to experts."""
        after_dense = index - self.first_dense_layers
        return after_dense >= 0 and after_dense % self.layer_interval == 0


@dataclass(frozen=True, slots=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values projected through low-rank
    latents, each head's query and key split into a part without position (`qk_nope_head_dim`) and a
    rotary part (`qk_rope_head_dim`, the key's shared by every head). Hugging Face names."""

    __pydantic_config__: ClassVar[dict[str, Any]] = DOCUMENT_CONFIG

    kv_lora_rank: Annotated[int, AtLeast(1)]
    """Width of the key/value latent."""
    qk_nope_head_dim: Annotated[int, AtLeast(1)]
    """Per head: the query/key width without rotary positions."""
    qk_rope_head_dim: Annotated[int, AtLeast(1)]
    """Per head: the rotary query/key width (the key's part is one shared head)."""
    v_head_dim: Annotated[int, AtLeast(1)]
    """Per head: the value width (and of the attention output)."""
    q_lora_rank: Annotated[int, AtLeast(1)] | None = None
    """Width of the query latent; None: queries projected from the hidden state directly (V2-Lite)."""

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class ModelConfig(ModelShape):
    """A model's architecture and dimensions: enough to count parameters, FLOPs and activations."""

    __pydantic_config__: ClassVar[dict[str, Any]] = DOCUMENT_CONFIG

    name: str
    """Display name, e.g. `llama3-8b`."""
    architecture: Architecture
    """`llama` (covers Llama 2/3, Mistral, Qwen2 dims), `gpt2`, or `layer_graph` (traced module)."""
    vocab_size: Annotated[int, AtLeast(1)] = 1
    """Token vocabulary size."""
    hidden_size: Annotated[int, AtLeast(1)] = 1
    """Model width (embedding dimension)."""
    num_layers: Annotated[int, AtLeast(1)] = 1
    """Number of transformer blocks."""
    num_heads: Annotated[int, AtLeast(1)] = 1
    """Attention query heads."""
    num_kv_heads: Annotated[int, AtLeast(1)] | None = None
    """Key/value heads for grouped-query attention; None means equal to `num_heads`."""
    head_size: Annotated[int, AtLeast(1)] | None = None
    """Width of one attention head where it is not hidden_size / num_heads (a Hugging Face config's
    `head_dim`: Mistral-NeMo's 32 heads are 128 wide at hidden 5120); None: hidden_size / num_heads."""
    intermediate_size: Annotated[int, AtLeast(1)] | None = None
    """Feed-forward hidden size; None means 4 x hidden (GPT-2)."""
    max_seq_len: Annotated[int, AtLeast(1)] = 2048
    """Longest context the model was built for (GPT-2: the size of its learned position table)."""
    tie_word_embeddings: bool = False
    """Whether the output head shares the token embedding weight."""
    qkv_bias: bool = False
    """Bias on the q/k/v projections (Qwen2 style)."""
    rope_theta: float = 10000.0
    """RoPE base frequency (Llama family)."""
    norm_eps: float = 1e-5
    """Epsilon of RMSNorm / LayerNorm."""
    qk_norm: bool = False
    """RMSNorm on each head's queries and keys before RoPE (Qwen3, OLMo 2): a head_dim-wide weight each."""
    moe: MoeConfig | None = None
    """The mixture-of-experts feed-forward of a llama-family model (None: every block dense)."""
    latent_attention: LatentAttention | None = None
    """Multi-head latent attention instead of grouped-query attention (llama family; None: GQA)."""
    num_params: int | None = None
    """Parameter count the planner priced (tied weights once)."""
    flops_per_token: float | None = None
    """Training FLOPs per token (6N + 12LHQT) at the plan's sequence length: the MFU numerator."""

    def __post_init__(self) -> None:
        check_fields(self)
