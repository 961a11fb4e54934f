"""Trace a user's `nn.Module` into a layer graph: per module parameters, forward FLOPs per token and
bytes saved for backward per token, measured on the meta device (no weights, no memory).

`fsdp-planner trace` runs this on the user's own machine, so the planning service never imports or
runs user code. The model is built under `torch.device("meta")`, cast to bf16 (the planner prices a
traced unit's saved bytes at 2 per element) and run forward once on int64 tokens [batch, seq_len]:

- FLOPs come from `torch.utils.flop_counter.FlopCounterMode` (matmuls, convolutions, attention).
  Attention is counted in full, not halved for a causal mask: the PaLM / torchtitan convention of
  the catalog's `attention_flops_convention`.
- Saved bytes come from `torch.autograd.graph.saved_tensors_hooks`: every tensor autograd keeps,
  each storage counted once, parameters and buffers excluded. On the meta device
  `scaled_dot_product_attention` would take the math path and keep the [seq, seq] attention
  weights; a fused kernel (flash / memory-efficient, what a GPU runs) keeps only q, k, v, the
  output and the log-sum-exp, so that is what is recorded here.

A *unit* is one repeated block (the modules the runtime wraps and checkpoints: the model's
`parallel_parts()`, else its longest `nn.ModuleList`, see `executor.runtime.models.find_parts`) or
one largest subtree holding no block (embeddings, final norm, head). Work done outside every unit
(e.g. a residual add in the root's forward) is charged to the unit that ran last, or before any
unit ran, to the first one. Blocks of identical structure and parameter shapes form one block type.
This module uses only the standard library and torch.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from executor.runtime.models import ModelFactoryError, find_parts, import_factory

TRACE_DTYPE = torch.bfloat16
"""Parameters and activations are traced in bf16: the planner reads saved bytes at 2 per element."""
MAX_NAME_CHARS = 200
"""Longest unit name the planner's `LayerUnit.name` accepts."""


class TraceError(ValueError):
    """The factory or its model cannot be traced; the message says what to change."""


@dataclass(frozen=True, slots=True)
class TracedUnit:
    """One unit of the layer graph (the fields of the planner's `LayerUnit`, plus its block type)."""

    name: str
    """Module path, e.g. `layers.3`."""
    num_params: int
    """Parameters this unit owns (a tied weight counts once, at the first unit that runs it)."""
    fwd_flops_per_token: float
    """Forward FLOPs per token."""
    activation_bytes_per_token: float
    """Bytes saved for backward per token (bf16), storages counted once."""
    is_block: bool
    """A repeated block: an FSDP wrap unit and checkpoint unit of its own."""
    block_type: str | None = None
    """The block type's name (class name, numbered when one class has several shapes)."""

    def as_layer_unit(self) -> dict[str, Any]:
        """The planner's `LayerUnit` JSON."""
        return {
            "name": self.name,
            "num_params": self.num_params,
            "fwd_flops_per_token": self.fwd_flops_per_token,
            "activation_bytes_per_token": self.activation_bytes_per_token,
            "is_block": self.is_block,
        }


@dataclass(frozen=True, slots=True)
class BlockType:
    """Blocks of one structure and parameter shapes."""

    name: str
    """Class name, numbered (`Block#2`) when one class has several shapes."""
    count: int
    """How many blocks of this type the model has."""
    first: str
    """Module path of the first such block."""
    last: str
    """Module path of the last such block."""


@dataclass(frozen=True, slots=True)
class Trace:
    """A traced model: its units in forward order and what was noticed on the way."""

    name: str
    """Display name of the model."""
    seq_len: int
    """Tokens per sequence the forward was traced at (attention FLOPs grow with it)."""
    batch: int
    """Sequences in the traced batch."""
    units: list[TracedUnit]
    """Units in forward order."""
    block_types: list[BlockType]
    """Repeated block types in the order they first appear."""
    notes: list[str] = field(default_factory=list)
    """Things the user should know (no blocks found, modules never called, ...)."""

    @property
    def num_params(self) -> int:
        return sum(u.num_params for u in self.units)

    @property
    def fwd_flops_per_token(self) -> float:
        return sum(u.fwd_flops_per_token for u in self.units)

    @property
    def activation_bytes_per_token(self) -> float:
        return sum(u.activation_bytes_per_token for u in self.units)

    def as_model_spec(self) -> dict[str, Any]:
        """The planner's `ModelSpec` JSON for this graph: what the API takes as `model`."""
        return {
            "name": self.name,
            "architecture": "layer_graph",
            # FLOPs were counted at this length: the model is priced as built for it.
            "max_seq_len": self.seq_len,
            "num_layers": max(1, sum(1 for u in self.units if u.is_block)),
            "layer_graph": [u.as_layer_unit() for u in self.units],
        }


def parse_factory_args(pairs: list[str]) -> dict[str, Any]:
    """`k=v` strings as keyword arguments: JSON values (`4`, `1e-5`, `true`, `"x"`, `[1,2]`) are
    decoded, anything else stays a string."""
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise TraceError(f"--arg {pair!r}: write it as name=value, e.g. --arg num_layers=4")
        try:
            kwargs[key] = json.loads(raw)
        except ValueError:
            kwargs[key] = raw
    return kwargs


def build_on_meta(factory: str, kwargs: Mapping[str, Any]) -> nn.Module:
    """Import `package.module:function`, call it with `kwargs` on the meta device, check the result."""
    label = "trace"
    try:
        fn = import_factory(
            factory, label=label, hint="run trace in the directory that holds it, or put it on PYTHONPATH"
        )
    except ModelFactoryError as exc:
        raise TraceError(str(exc)) from None
    except Exception as exc:  # the user's module failed while importing
        raise TraceError(
            f"{label} {factory!r}: importing it raised {type(exc).__name__}: {exc}"
        ) from None
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as exc:
        raise TraceError(
            f"{label} {factory!r}: cannot call it with {_describe_kwargs(kwargs)} ({exc}); its signature "
            f"is {fn.__name__}{_signature(fn)}: pass its arguments with --arg name=value"
        ) from None
    except ValueError:
        pass  # no inspectable signature (a builtin): just call it
    try:
        with torch.device("meta"):
            model = fn(**kwargs)
    except Exception as exc:
        raise TraceError(f"{label} {factory!r} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise TraceError(
            f"{label} {factory!r} returned {type(model).__name__}, not a torch.nn.Module: the factory "
            "must build and return the model"
        )
    return model


def trace_factory(
    factory: str, *, kwargs: Mapping[str, Any], seq_len: int, batch: int = 1, name: str | None = None
) -> Trace:
    """Build the factory's model on the meta device and trace it."""
    model = build_on_meta(factory, kwargs)
    return trace_model(model, seq_len=seq_len, batch=batch, name=name or factory)


def trace_model(model: nn.Module, *, seq_len: int, batch: int = 1, name: str) -> Trace:
    """Trace `model` (moved to the meta device and cast to bf16) forward over [batch, seq_len] tokens."""
    if seq_len < 1 or batch < 1:
        raise TraceError(f"seq_len ({seq_len}) and batch ({batch}) must be at least 1")
    notes: list[str] = []
    if any(t.device.type != "meta" for t in (*model.parameters(), *model.buffers())):
        notes.append("the factory put tensors off the meta device (explicit device=...): moved to meta")
    model = model.to(device="meta", dtype=TRACE_DTYPE).train()

    try:
        blocks = [b for b in find_parts(model).blocks if b is not model]
    except Exception as exc:  # the model's own parallel_parts()
        raise TraceError(f"the model's parallel_parts() raised {type(exc).__name__}: {exc}") from None
    units, own_params = _partition(model, blocks)
    if not blocks:
        notes.append(
            "no repeated blocks found: the runtime wraps the modules returned by the model's "
            "`parallel_parts()` or its longest nn.ModuleList; without them every module is one unit"
        )
    meter = _Meter(model, units)
    tokens = torch.zeros(batch, seq_len, dtype=torch.long, device="meta")
    try:
        with meter.recording():
            model(tokens)
    except TraceError:
        raise
    except Exception as exc:
        raise TraceError(
            f"the model's forward failed on int64 tokens of shape [{batch}, {seq_len}] "
            f"({type(exc).__name__}: {exc}); trace calls forward(tokens) the way the trainer does"
        ) from None

    tokens_n = float(batch * seq_len)
    order = sorted(units, key=lambda path: meter.first_call.get(path, len(meter.first_call)))
    for path in order:
        if path not in meter.called and any(True for _ in units[path].parameters()):
            notes.append(f"{path} was never called by forward: its parameters are counted, not its work")
    # A tied weight belongs to the first unit that runs it (the embedding, not the head).
    seen: set[int] = set()
    block_ids = {id(b) for b in blocks}
    signatures = {path: _signature_of(units[path]) for path in order if id(units[path]) in block_ids}
    type_names = _block_type_names(order, signatures)
    traced = []
    if own_params:
        root_params = _count_new(own_params, seen)
        if root_params:
            traced.append(
                TracedUnit(
                    name=_unit_name("", model), num_params=root_params, fwd_flops_per_token=0.0,
                    activation_bytes_per_token=0.0, is_block=False,
                )
            )
    for path in order:
        module = units[path]
        params = _count_new(list(module.parameters()), seen)
        flops = meter.flops.get(path, 0.0) / tokens_n
        saved = meter.saved_bytes.get(path, 0.0) / tokens_n
        is_block = path in signatures
        if not (params or flops or saved or is_block):
            continue  # a helper with no weights whose work ran inside a block (e.g. rotary tables)
        traced.append(
            TracedUnit(
                name=_unit_name(path, model), num_params=params, fwd_flops_per_token=flops,
                activation_bytes_per_token=saved, is_block=is_block,
                block_type=type_names.get(path),
            )
        )
    return Trace(
        name=name[:MAX_NAME_CHARS] or "traced-model",
        seq_len=seq_len,
        batch=batch,
        units=traced,
        block_types=_block_types(traced),
        notes=notes,
    )


def _partition(model: nn.Module, blocks: list[nn.Module]) -> tuple[dict[str, nn.Module], list[nn.Parameter]]:
    """Units by module path, and the parameters held directly by the blocks' ancestors."""
    block_ids = {id(b) for b in blocks}
    paths = {id(m): p for p, m in model.named_modules()}
    holders = {""}  # module paths that contain a block somewhere below
    for block in blocks:
        path = paths.get(id(block))
        if path is None:
            raise TraceError("a block returned by parallel_parts() is not a submodule of the model")
        parts = path.split(".")
        holders.update(".".join(parts[:i]) for i in range(len(parts)))
    units: dict[str, nn.Module] = {}
    own: list[nn.Parameter] = []

    def walk(prefix: str, module: nn.Module) -> None:
        own.extend(module.parameters(recurse=False))
        for child_name, child in module.named_children():
            path = f"{prefix}.{child_name}" if prefix else child_name
            if id(child) in block_ids or path not in holders:
                units[path] = child
            else:
                walk(path, child)

    if not blocks and not any(True for _ in model.children()):
        return {"": model}, []  # a single layer: the whole model is the one unit
    walk("", model)
    return units, own


class _Meter:
    """Charges FLOPs and saved bytes to the unit whose forward is running (outermost unit only)."""

    def __init__(self, model: nn.Module, units: dict[str, nn.Module]) -> None:
        self.units = units
        self.flops: dict[str, float] = {}
        self.saved_bytes: dict[str, float] = {}
        self.first_call: dict[str, int] = {}
        # Weights and buffers are not activations: a linear layer saves its weight for backward.
        self._static = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
        self._seen: set[int] = set()
        # Saved tensors are kept alive to the end, so that no storage address is reused and a new
        # storage mistaken for one already counted (meta tensors cost no memory).
        self._held: list[torch.Tensor] = []
        self._counter = FlopCounterMode(display=False)
        self._active: str | None = None
        self._depth = 0
        self._last: str | None = None
        self._pending_flops = 0.0
        self._pending_bytes = 0.0
        self._interval_bytes = 0.0
        self._mark = 0
        self.called: set[str] = set()

    @contextmanager
    def recording(self) -> Iterator[None]:
        handles = []
        for path, module in self.units.items():
            handles.append(module.register_forward_pre_hook(self._enter_hook(path)))
            handles.append(module.register_forward_hook(self._exit_hook(path), always_call=True))
        try:
            with (
                self._counter,
                _fused_attention_on_meta(),
                torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t),
            ):
                yield
            self._close_interval()
            if self._pending_flops or self._pending_bytes:
                # Work done before any unit ran, and no unit ran at all: the root is the only unit.
                owner = self._last or next(iter(self.units))
                self._charge(owner, self._pending_flops, self._pending_bytes)
        finally:
            for handle in handles:
                handle.remove()

    def _enter_hook(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self.called.add(path)
            if self._depth == 0:
                self._close_interval()
                self._active = path
                self.first_call.setdefault(path, len(self.first_call))
            self._depth += 1

        return hook

    def _exit_hook(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self._depth -= 1
            if self._depth == 0:
                self._close_interval()
                self._last, self._active = self._active, None

        return hook

    def _close_interval(self) -> None:
        """Charge what happened since the last unit boundary."""
        total = self._counter.get_total_flops()
        flops, self._mark = float(total - self._mark), total
        saved, self._interval_bytes = self._interval_bytes, 0.0
        owner = self._active or self._last
        if owner is None:  # before the first unit: charged to whichever unit runs first
            self._pending_flops += flops
            self._pending_bytes += saved
            return
        if self._pending_flops or self._pending_bytes:
            flops += self._pending_flops
            saved += self._pending_bytes
            self._pending_flops = self._pending_bytes = 0.0
        self._charge(owner, flops, saved)

    def _charge(self, owner: str, flops: float, saved: float) -> None:
        self.flops[owner] = self.flops.get(owner, 0.0) + flops
        self.saved_bytes[owner] = self.saved_bytes.get(owner, 0.0) + saved

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage._cdata
        # A storage saved by several ops (or viewed several ways) is held once.
        if key not in self._static and key not in self._seen:
            self._seen.add(key)
            self._held.append(tensor)
            self._interval_bytes += storage.nbytes()
        return tensor


class _FusedAttention(torch.autograd.Function):
    """Attention that keeps for backward what a fused GPU kernel keeps: q, k, v, the output and the
    fp32 log-sum-exp per query (plus an additive mask when given), never the attention weights."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        dropout_p: float,
        is_causal: bool,
        scale: float | None,
        enable_gqa: bool,
    ) -> torch.Tensor:
        # The math kernel gives the output's shape and dtype, and its matmuls are what the FLOP
        # counter counts; grad mode is off in here, so autograd keeps nothing of it.
        out, _ = torch.ops.aten._scaled_dot_product_attention_math(
            q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
        )
        if out.dim() >= 4:
            # Fused kernels write [batch, seq, heads, dim] and return it transposed, so the usual
            # `out.transpose(1, 2).reshape(b, t, -1)` is a view, not a copy that a projection saves.
            b_dims, (heads, seq, dim) = out.shape[:-3], out.shape[-3:]
            out = out.new_empty(*b_dims, seq, heads, dim).transpose(-3, -2).copy_(out)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        kept = [q, k, v, out, lse]
        if isinstance(attn_mask, torch.Tensor):
            kept.append(attn_mask)
        ctx.save_for_backward(*kept)
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError("a traced model is never trained: trace runs forward only")


def _fused_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    return _FusedAttention.apply(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@contextmanager
def _fused_attention_on_meta() -> Iterator[None]:
    """While tracing, `scaled_dot_product_attention` on meta tensors runs `_FusedAttention`.

    Registered as the op's meta autograd kernel rather than intercepted in Python, so that it also
    applies where torch calls it internally (nn.MultiheadAttention, nn.TransformerEncoderLayer).
    Only meta tensors are affected, and only until the trace ends.
    """
    library = torch.library.Library("aten", "IMPL")
    try:
        library.impl("scaled_dot_product_attention", _fused_attention, "AutogradMeta")
        yield
    finally:
        library._destroy()


def _count_new(params: list[nn.Parameter], seen: set[int]) -> int:
    total = 0
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def _unit_name(path: str, model: nn.Module) -> str:
    name = path or type(model).__name__
    return name if len(name) <= MAX_NAME_CHARS else name[: MAX_NAME_CHARS - 3] + "..."


def _signature_of(module: nn.Module) -> tuple:
    """What makes two blocks the same: module classes in order and parameter names, shapes, dtypes."""
    return (
        tuple((name, type(m).__qualname__) for name, m in module.named_modules()),
        tuple((name, tuple(p.shape), str(p.dtype)) for name, p in module.named_parameters()),
    )


def _block_type_names(order: list[str], signatures: dict[str, tuple]) -> dict[str, str]:
    names: dict[tuple, str] = {}
    per_class: dict[str, int] = {}
    out = {}
    for path in order:
        signature = signatures.get(path)
        if signature is None:
            continue
        if signature not in names:
            cls = signature[0][0][1]
            per_class[cls] = per_class.get(cls, 0) + 1
            names[signature] = cls if per_class[cls] == 1 else f"{cls}#{per_class[cls]}"
        out[path] = names[signature]
    return out


def _block_types(units: list[TracedUnit]) -> list[BlockType]:
    found: dict[str, list[str]] = {}
    for unit in units:
        if unit.block_type is not None:
            found.setdefault(unit.block_type, []).append(unit.name)
    return [BlockType(name=n, count=len(paths), first=paths[0], last=paths[-1]) for n, paths in found.items()]


def _describe_kwargs(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no arguments"


def _signature(fn: Callable[..., Any]) -> str:
    """`(width, depth=4)`: parameter names and defaults, without annotations."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return "(...)"
    bare = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=signature.empty))
