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
"""`llama` (Llama 2/3, Mistral, Qwen2 dimensions), `gpt2`, or `layer_graph` (a traced user model)."""

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
    num_params: int | None = None
    """Parameter count the planner priced (tied weights once)."""
    flops_per_token: float | None = None
    """Training FLOPs per token (6N + 12LHQT) at the plan's sequence length: the MFU numerator."""

    def __post_init__(self) -> None:
        check_fields(self)
