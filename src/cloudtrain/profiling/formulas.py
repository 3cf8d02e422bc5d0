"""FLOPs, bytes and GEMM shape of one dispatched ATen op.

FLOPs come from `torch.utils.flop_counter`'s formulas where it has one (mm, addmm,
bmm, baddbmm, _scaled_mm, convolutions, the SDPA kernels and their backward), and from
the formulas here where it has none or a wrong one:

- convolution_backward: one forward convolution per gradient asked for (input,
  weight), as one op (flop_counter's formula counts the weight gradient of a grouped
  convolution `groups` times over);

- RNNs (aten.lstm / gru / rnn_*, _cudnn_rnn, mkldnn_rnn_layer and their backward):
  2 x tokens x (numel of every 2-D weight matrix) forward, which is
  2 x gates x (input + hidden) x hidden x tokens per layer and direction (gates: LSTM
  4, GRU 3, RNN 1), twice that backward (grad input + grad weights);
- the CPU flash-attention kernels (flop_counter's SDPA formula);
- mv, addmv, dot, addr, addbmm, linear, matmul when they reach the dispatcher;
- scatter-adds (embedding_dense_backward, index_add, index_put, scatter_add): one per
  added element;
- everything else per element, weights in `ops.flop_weight`.

Bytes are read plus written: every distinct tensor among inputs and outputs once, at
the elements it spans (a broadcast input its unexpanded size). Gathers (embedding,
index_select, gather, index, nll_loss) read only the rows they gather; factory ops that
take a tensor for its shape (new_zeros, zeros_like, ...) do not read it; in-place
scatters read-modify-write only the indexed part.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils import flop_counter

from cloudtrain.profiling.ops import flop_weight

_DTYPES = {
    torch.float32: "fp32",
    torch.float64: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.complex64: "fp32",
    torch.complex128: "fp32",
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = "fp8"
_WIDTH = {"fp8": 1, "bf16": 2, "fp16": 2, "fp32": 4}

_RNN_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
_RNN_WEIGHTS_ARG = {
    "aten.lstm": 2,
    "aten.gru": 2,
    "aten.rnn_tanh": 2,
    "aten.rnn_relu": 2,
    "aten._cudnn_rnn": 1,
    "aten._cudnn_rnn_backward": 1,
    "aten.miopen_rnn": 1,
    "aten.miopen_rnn_backward": 1,
    "aten.mkldnn_rnn_layer": (1, 2),
    "aten.mkldnn_rnn_layer_backward": (1, 2),
}
_GATHERS = {
    "aten.embedding": 0,
    "aten.index_select": 0,
    "aten.gather": 0,
    "aten.index": 0,
    "aten._unsafe_index": 0,
    "aten.take": 0,
}
_NLL_FORWARD = ("aten.nll_loss_forward", "aten.nll_loss2d_forward")
_NLL_BACKWARD = ("aten.nll_loss_backward", "aten.nll_loss2d_backward")
_SHAPE_ONLY_SELF = {
    "aten.new_zeros",
    "aten.new_ones",
    "aten.new_full",
    "aten.zeros_like",
    "aten.ones_like",
    "aten.full_like",
    "aten.rand_like",
    "aten.randn_like",
    "aten.randint_like",
}
_SCATTERS_INPLACE = {
    # name -> index of the values/src argument
    "aten.index_put_": 2,
    "aten._index_put_impl_": 2,
    "aten._unsafe_index_put": 2,
    "aten.scatter_": 3,
    "aten.scatter_add_": 3,
    "aten.scatter_reduce_": 3,
    "aten.index_add_": 3,
    "aten.index_copy_": 3,
}
_SCATTER_ADDS = {
    "aten.embedding_dense_backward": 0,
    "aten.index_add": 3,
    "aten.index_add_": 3,
    "aten.index_put": 2,
    "aten.index_put_": 2,
    "aten._index_put_impl_": 2,
    "aten.scatter_add": 3,
    "aten.scatter_add_": 3,
    "aten.scatter_reduce": 3,
    "aten.scatter_reduce_": 3,
}


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts (what dispatched ops take)."""
    found: list[torch.Tensor] = []
    _collect(value, found)
    return found


def _collect(value: Any, found: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _collect(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, found)


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPES.get(dtype, "int")


def span_bytes(tensor: torch.Tensor) -> int:
    """Bytes a kernel touches to read or write `tensor` (broadcast dims once)."""
    if tensor.numel() == 0:
        return 0
    elements = 1
    for size, stride in zip(tensor.shape, tensor.stride(), strict=True):
        if stride != 0:
            elements *= size
    return elements * tensor.element_size()


def _tensor_key(tensor: torch.Tensor) -> tuple:
    try:
        storage = tensor.untyped_storage()._cdata
    except Exception:  # sparse or nested: no plain storage
        return (id(tensor),)
    return (storage, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)


def _distinct_bytes(tensors: list[torch.Tensor], seen: set | None = None) -> int:
    seen = set() if seen is None else seen
    total = 0
    for tensor in tensors:
        key = _tensor_key(tensor)
        if key in seen:
            continue
        seen.add(key)
        total += span_bytes(tensor)
    return total


def op_bytes(name: str, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes read plus written by one op (see the module docstring)."""
    outputs = tensors_in(out)
    args = list(args)
    if name in _SHAPE_ONLY_SELF and args:
        args = args[1:]
    elif name in _GATHERS and args and isinstance(args[_GATHERS[name]], torch.Tensor):
        # Reads as many source elements as it writes, not the whole source.
        source = args.pop(_GATHERS[name])
        out_elements = sum(t.numel() for t in outputs)
        return _distinct_bytes(tensors_in((args, kwargs)) + outputs) + (
            out_elements * source.element_size()
        )
    elif name in _NLL_FORWARD and len(args) > 1:
        source, target = args[0], args[1]
        gathered = target.numel() * source.element_size()
        return _distinct_bytes(tensors_in((args[1:], kwargs)) + outputs) + gathered
    elif name in _NLL_BACKWARD and len(args) > 1:
        args = [args[0], *args[2:]]  # self is read for its shape only
    elif name in _SCATTERS_INPLACE and len(args) > _SCATTERS_INPLACE[name]:
        values = args[_SCATTERS_INPLACE[name]]
        rest = args[1:]
        rmw = span_bytes(values) if isinstance(values, torch.Tensor) else 0
        return _distinct_bytes(tensors_in((rest, kwargs))) + rmw
    return _distinct_bytes(tensors_in((args, kwargs)) + outputs)


def compute_dtype(args: tuple, kwargs: dict, out: Any) -> str:
    """The dtype of the largest floating input (the outputs when no input is floating;
    the wider on a tie): what the kernel computes in — a flash-attention backward's
    fp32 log-sum-exp does not make it an fp32 kernel. 'int' when nothing is floating."""
    for group in (tensors_in((args, kwargs)), tensors_in(out)):
        floating = [(t.numel(), _WIDTH[_DTYPES[t.dtype]], _DTYPES[t.dtype])
                    for t in group if t.dtype in _DTYPES]  # fmt: skip
        if floating:
            return max(floating)[2]
    return "int"


def _numel(tensors: list[torch.Tensor]) -> int:
    return max((t.numel() for t in tensors), default=0)


def _shape(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (list, tuple)):
        return type(value)(_shape(v) for v in value)
    return value


Gemm = tuple[float, float, float] | None


class OpCost:
    """FLOPs, GEMM dims and groups of one op occurrence."""

    __slots__ = ("flops", "gemm", "groups")

    def __init__(self, flops: float, gemm: Gemm = None, groups: int = 1) -> None:
        self.flops = float(flops)
        self.gemm = gemm
        self.groups = int(groups)


def _registry_flops(packet: Any, args: tuple, kwargs: dict, out: Any) -> float | None:
    formula = flop_counter.flop_registry.get(packet)
    if formula is None:
        return None
    return float(formula(*args, out_val=out, **kwargs))


def _mm_gemm(a: torch.Tensor, b: torch.Tensor) -> Gemm:
    return (a.shape[-2], b.shape[-1], a.shape[-1])


def _conv_groups(name: str, args: tuple) -> int:
    index = {
        "aten.convolution": 8,
        "aten._convolution": 8,
        "aten.convolution_overrideable": 8,
        "aten.convolution_backward": 9,
        "aten.convolution_backward_overrideable": 9,
        "aten.cudnn_convolution": 5,
        "aten.cudnn_convolution_transpose": 6,
        "aten.mkldnn_convolution": 6,
        "aten.miopen_convolution": 6,
        "aten.miopen_depthwise_convolution": 6,
    }.get(name)
    if index is not None and len(args) > index and isinstance(args[index], int):
        return max(1, args[index])
    if name.startswith(("aten._slow_conv2d", "aten.slow_conv")):
        return 1
    return 0  # unknown: from the shapes


def _conv_transposed(name: str, args: tuple) -> bool:
    index = {
        "aten.convolution": 6,
        "aten._convolution": 6,
        "aten.convolution_overrideable": 6,
        "aten.convolution_backward": 7,
        "aten.convolution_backward_overrideable": 7,
    }.get(name)
    if index is not None and len(args) > index:
        return bool(args[index])
    return "transpose" in name


def conv_cost(name: str, args: tuple, kwargs: dict, out: Any, packet: Any) -> OpCost:
    backward = "backward" in name
    if backward:
        grad_out, x, weight = args[0], args[1], args[2]
        y_shape = grad_out.shape
    else:
        x, weight = args[0], args[1]
        y_shape = tensors_in(out)[0].shape
    transposed = _conv_transposed(name, args)
    groups = _conv_groups(name, args)
    if not groups:
        groups = max(1, x.shape[1] // weight.shape[1]) if not transposed else 1
    kernel = math.prod(weight.shape[2:])
    if transposed:
        c_in, c_out = weight.shape[0], weight.shape[1] * groups
        gemm = (x.shape[0] * math.prod(x.shape[2:]), c_out / groups, c_in / groups * kernel)
    else:
        c_out, c_in_g = weight.shape[0], weight.shape[1]
        gemm = (y_shape[0] * math.prod(y_shape[2:]), c_out / groups, c_in_g * kernel)
    forward = 2.0 * groups * gemm[0] * gemm[1] * gemm[2]
    if backward:
        # grad input and grad weight each cost one forward convolution (flop_counter's
        # convolution_backward formula leaves groups out of the weight gradient).
        mask = args[10] if len(args) > 10 else (True, True)
        return OpCost(forward * (bool(mask[0]) + bool(mask[1])), gemm, groups)
    flops = _registry_flops(packet, args, kwargs, out)
    return OpCost(forward if flops is None else flops, gemm, groups)


def _attention_layout(name: str, args: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    start = 1 if "backward" in name else 0
    q, k, v = args[start], args[start + 1], args[start + 2]
    if name.startswith(("aten._flash_attention", "aten._efficient_attention")):
        # These take [B, L, H, D]; the SDPA wrappers [B, H, L, D].
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return q, k, v


def attention_cost(name: str, args: tuple, kwargs: dict, out: Any, packet: Any) -> OpCost:
    q, k, v = _attention_layout(name, args)
    batch, heads, lq, dim = q.shape
    gemm = (lq, k.shape[-2], dim)
    flops = None
    try:
        flops = _registry_flops(packet, args, kwargs, out)
    except Exception:
        flops = None
    if flops is None:
        shapes = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
        if "backward" in name:
            flops = flop_counter.sdpa_backward_flop_count(shapes[0], *shapes)
        else:
            flops = flop_counter.sdpa_flop_count(*shapes)
    return OpCost(flops, gemm, batch * heads)


def rnn_cost(name: str, args: tuple) -> OpCost:
    where = _RNN_WEIGHTS_ARG[name]
    weights = [args[i] for i in where] if isinstance(where, tuple) else tensors_in(args[where])
    matrices = [w for w in weights if isinstance(w, torch.Tensor) and w.dim() == 2]
    x = args[0]
    tokens = x.numel() // max(1, x.shape[-1])
    weight_numel = sum(w.numel() for w in matrices)
    factor = 2 if "backward" in name else 1
    flops = 2.0 * tokens * weight_numel * factor
    rows = matrices[0].shape[0] if matrices else 1
    gemm = (tokens, rows, weight_numel / rows) if matrices else None
    return OpCost(flops, gemm, 1)


def matmul_cost(name: str, args: tuple, kwargs: dict, out: Any, packet: Any) -> OpCost:
    flops = _registry_flops(packet, args, kwargs, out)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    gemm: Gemm = None
    groups = 1
    if name in ("aten.mm", "aten._scaled_mm", "aten._int_mm"):
        gemm = _mm_gemm(args[0], args[1])
    elif name in ("aten.addmm", "aten._addmm_activation"):
        gemm = _mm_gemm(args[1], args[2])
    elif name == "aten.bmm":
        gemm, groups = _mm_gemm(args[0], args[1]), args[0].shape[0]
    elif name in ("aten.baddbmm", "aten.addbmm"):
        gemm, groups = _mm_gemm(args[1], args[2]), args[1].shape[0]
    elif name in ("aten.mv", "aten.addmv"):
        a = args[0] if name == "aten.mv" else args[1]
        gemm = (a.shape[0], 1, a.shape[1])
    elif name in ("aten.dot", "aten.vdot"):
        gemm = (1, 1, args[0].shape[0])
    elif name == "aten.addr":
        gemm = (args[1].shape[0], args[2].shape[0], 1)
    elif name == "aten.linear":
        x, weight = args[0], args[1]
        gemm = (x.numel() // max(1, x.shape[-1]), weight.shape[0], weight.shape[1])
    elif name == "aten.matmul" and len(tensors) == 2 and min(t.dim() for t in tensors) >= 2:
        a, b = tensors
        groups = math.prod(tuple(tensors_in(out)[0].shape[:-2]))
        gemm = _mm_gemm(a, b)
    if flops is None:
        if gemm is not None:
            flops = 2.0 * groups * gemm[0] * gemm[1] * gemm[2]
        else:
            flops = float(_numel(tensors_in(out)))
    return OpCost(flops, gemm, groups)


def op_cost(name: str, op_class: str, func: Any, args: tuple, kwargs: dict, out: Any) -> OpCost:
    """FLOPs, GEMM and groups of one op (elementwise defaults for unknown ones)."""
    packet = getattr(func, "_overloadpacket", None)
    if name in _RNN_WEIGHTS_ARG:
        return rnn_cost(name, args)
    if op_class == "convolution":
        return conv_cost(name, args, kwargs, out, packet)
    if op_class == "attention":
        return attention_cost(name, args, kwargs, out, packet)
    if op_class == "matmul":
        return matmul_cost(name, args, kwargs, out, packet)
    if name in _SCATTER_ADDS:
        index = _SCATTER_ADDS[name]
        source = args[index] if len(args) > index else None
        return OpCost(source.numel() if isinstance(source, torch.Tensor) else 0)
    if op_class == "data_movement":
        return OpCost(0)
    weight = flop_weight(name)
    outputs = tensors_in(out)
    if op_class == "reduction":
        elements = max(_numel(tensors_in((args, kwargs))), _numel(outputs))
    else:
        elements = _numel(outputs) or _numel(tensors_in((args, kwargs)))
    return OpCost(weight * elements)


def shape_text(args: tuple, kwargs: dict, limit: int = 4) -> str:
    """The input tensors' shapes, for display: '[2,64] [32,64] [32]'."""
    shapes = ["[" + ",".join(str(s) for s in t.shape) + "]" for t in tensors_in((args, kwargs))]
    more = f" +{len(shapes) - limit}" if len(shapes) > limit else ""
    return " ".join(shapes[:limit]) + more
