"""What a CUDA GPU would do that the meta device and the CPU do not: autocast and the
fused SDPA kernel choice, emulated above autograd by a `TorchFunctionMode`.

Autocast. `torch.autocast("cuda")` only acts on CUDA tensors, and `autocast("cpu")`
has another op list (it keeps layer_norm and softmax in 16 bits, for one). So on every
path the tracer casts as CUDA autocast does, with CUDA's op lists
(aten/src/ATen/autocast_mode.h): the lower-precision list (matmuls, linear,
convolutions, baddbmm, SDPA, the RNN cells, plus the cuDNN RNNs lstm/gru/rnn_*) runs in
the autocast dtype, floating inputs cast first; the fp32 list (exp, log, pow, rsqrt,
layer_norm, group_norm, the losses, norms, ...) casts 16-bit inputs up to fp32; the
set-opt-dtype ops (softmax, log_softmax, sum, prod, cumsum, ...) get `dtype=float32`
when none is given; the promote list (addcmul, cat of mixed inputs, ...) runs in the
widest input dtype. Like autocast, casts of leaf tensors that require grad (the
weights) are cached for the forward pass, the casts are autograd ops (so backward runs
in the forward's dtype and the 16-bit copies are what autograd saves), fp64 is left
alone, and ops given `out=` or an explicit `dtype=` are not touched. It sees torch
functions, not ATen ops: for Python-level `torch.nn.functional` composites that are in
no list (`F.multi_head_attention_forward`, ...) it runs their body under the mode, so
the ops they call are cast as autocast would cast them.

Fused kernels. On meta, `F.scaled_dot_product_attention` falls back to the unfused
math path and dropout to bernoulli/div/mul; on CUDA they run fused kernels. On the meta
and fake-CUDA paths (`cuda_kernels=True`) SDPA is sent to the kernel CUDA would pick:
flash attention for 16-bit inputs without a mask (head size <= 256), memory-efficient
attention otherwise (fp32, masks, bool masks turned into an additive bias); other cases
keep the math path. Dropout in training (0 < p < 1) runs `native_dropout`, as on CUDA.
The CPU path keeps PyTorch's own CPU choices (its fused flash kernel when it applies).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


LOWER_PRECISION = _names(
    """
    _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d
    conv_transpose3d convolution cudnn_convolution cudnn_convolution_transpose prelu
    addmm addmv addr matmul __matmul__ __rmatmul__ einsum mm mv linalg_vecdot vecdot
    linear addbmm baddbmm bmm chain_matmul linalg_multi_dot multi_dot
    _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell
    rnn_relu_cell scaled_dot_product_attention lstm gru rnn_tanh rnn_relu
    """
)
FP32 = _names(
    """
    acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow
    __pow__ __rpow__ __rdiv__ __rtruediv__ softplus layer_norm native_layer_norm
    group_norm frobenius_norm nuclear_norm cosine_similarity poisson_nll_loss
    cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss
    smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss
    soft_margin_loss triplet_margin_loss multi_margin_loss
    binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp norm normalize
    cross_entropy cross_entropy_loss softmin
    """
)
FP32_SET_OPT_DTYPE = _names(
    "prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum"
)
PROMOTE = _names(
    """
    addcdiv addcmul atan2 bilinear cross dot grid_sampler grid_sample index_put
    tensordot scatter_add
    """
)
_TRANSPARENT_MODULES = ("torch.nn.functional", "torch.functional")
_NO_TORCH_FUNCTION = {
    "has_torch_function": lambda *args: False,
    "has_torch_function_unary": lambda *args: False,
    "has_torch_function_variadic": lambda *args: False,
}


def _eligible(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
    )


class CudaEmulation(TorchFunctionMode):
    """Autocast with CUDA's op lists (when `dtype` is given) and CUDA's fused SDPA and
    dropout kernels (when `cuda_kernels`)."""

    def __init__(self, dtype: torch.dtype | None, *, cuda_kernels: bool) -> None:
        super().__init__()
        self.dtype = dtype
        self.cuda_kernels = cuda_kernels
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._transparent: dict[Any, Any] = {}
        self._globals: dict[str, dict[str, Any]] = {}

    def stop_casting(self) -> None:
        """End of the autocast region (the forward pass): casts are no longer made and
        the weight-cast cache is dropped, as on leaving `torch.autocast`."""
        self.dtype = None
        self.cache.clear()

    # -- casting -------------------------------------------------------------------
    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        if not _eligible(value) or value.dtype == dtype:
            return value
        cacheable = (
            dtype != torch.float32
            and value.is_leaf
            and value.requires_grad
            and value.dtype == torch.float32
        )
        if cacheable:
            cached = self.cache.get(id(value))
            if cached is not None:
                return cached[1]
        result = value.to(dtype)
        if cacheable:
            self.cache[id(value)] = (value, result)  # keep the source alive: ids stay valid
        return result

    def _cast_all(self, args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
        return tree_map(lambda v: self._cast(v, dtype), (args, kwargs))

    def _widest(self, args: tuple, kwargs: dict) -> torch.dtype:
        widest = self.dtype
        for value in torch.utils._pytree.tree_leaves((args, kwargs)):
            if _eligible(value) and value.dtype == torch.float32:
                widest = torch.float32
        return widest

    # -- the mode ------------------------------------------------------------------
    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.dtype is not None and "out" not in kwargs:
            if name in LOWER_PRECISION and "dtype" not in kwargs:
                args, kwargs = self._cast_all(args, kwargs, self.dtype)
            elif name in FP32 and "dtype" not in kwargs:
                args, kwargs = self._cast_all(args, kwargs, torch.float32)
            elif name in FP32_SET_OPT_DTYPE:
                if "dtype" not in kwargs and args and _eligible(args[0]):
                    kwargs = {**kwargs, "dtype": torch.float32}
            elif name in PROMOTE:
                args, kwargs = self._cast_all(args, kwargs, self._widest(args, kwargs))
        if self.cuda_kernels:
            if name == "scaled_dot_product_attention":
                routed = _fused_sdpa(*args, **kwargs)
                if routed is not None:
                    return routed
            elif name == "dropout" and not isinstance(func, types.FunctionType):
                routed = _fused_dropout(*args, **kwargs)
                if routed is not None:
                    return routed
        transparent = self._transparent_version(func, name)
        if transparent is not None:
            with self:
                return transparent(*args, **kwargs)
        return func(*args, **kwargs)

    def _transparent_version(self, func: Any, name: str) -> Any:
        """A copy of a Python-level functional that runs its body under this mode
        (it would otherwise hand itself to the mode and run unobserved)."""
        if not isinstance(func, types.FunctionType):
            return None
        if func.__module__ not in _TRANSPARENT_MODULES:
            return None
        if name in LOWER_PRECISION or name in FP32 or name in PROMOTE:
            return None  # already handled as a whole
        if not any(n.startswith("has_torch_function") for n in func.__code__.co_names):
            return None  # hands another function to the mode (boolean_dispatch wrappers)
        found = self._transparent.get(func)
        if found is None:
            module_globals = self._globals.get(func.__module__)
            if module_globals is None:
                module_globals = {**func.__globals__, **_NO_TORCH_FUNCTION}
                self._globals[func.__module__] = module_globals
            found = types.FunctionType(
                func.__code__, module_globals, func.__name__, func.__defaults__, func.__closure__
            )
            found.__kwdefaults__ = func.__kwdefaults__
            self._transparent[func] = found
        return found


def _fused_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """The fused kernel CUDA would run for this call, or None (keep the math path)."""
    tensors = (query, key, value)
    if any(not isinstance(t, torch.Tensor) or t.dim() != 4 for t in tensors):
        return None
    if query.dtype != key.dtype or key.dtype != value.dtype:
        return None
    if query.shape[-1] > 256 or query.shape[-1] != value.shape[-1]:
        return None
    if key.shape[1] != query.shape[1]:
        if not enable_gqa or query.shape[1] % key.shape[1]:
            return None
        repeats = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(repeats, dim=1)
        value = value.repeat_interleave(repeats, dim=1)
    aten = torch.ops.aten
    needs_grad = any(t.requires_grad for t in (query, key, value))
    if attn_mask is None and query.dtype in (torch.float16, torch.bfloat16):
        return aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )[0]
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return None
    bias = None
    if attn_mask is not None:
        if is_causal:
            return None
        if attn_mask.dtype == torch.bool:
            bias = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device)
            bias = bias.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            bias = attn_mask.to(query.dtype)
        batch, heads, lq, _ = query.shape
        bias = bias.expand(batch, heads, lq, key.shape[-2])
    return aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, needs_grad, dropout_p, is_causal, scale=scale
    )[0]


def _fused_dropout(input: torch.Tensor, p: float = 0.5, train: bool = True) -> torch.Tensor | None:
    """`_VF.dropout` as CUDA runs it in training: one native_dropout kernel."""
    if not isinstance(input, torch.Tensor) or not train or not 0.0 < p < 1.0:
        return None
    if not input.is_floating_point() or input.numel() == 0:
        return None
    return torch.native_dropout(input, p, train)[0]
