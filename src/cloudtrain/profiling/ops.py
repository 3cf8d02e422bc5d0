"""What each ATen op is, for the cost model: one table, torch-free.

`OP_RULES` maps an ATen name without the overload ('aten.addmm') to its class (one of
`cloudtrain.plan.profile.OP_CLASSES`) or to `DROP`: pure views and allocations that
launch no kernel (view, t, transpose, expand, slice, select, detach, split outputs,
empty, ...) are left out of the profile.

Lookups also resolve, in order: an in-place variant ('aten.add_' -> 'aten.add') and a
backward ('aten.gelu_backward' -> 'aten.gelu', '..._backward_data', '..._backward_input'
and '..._backward_weight' likewise). An op that still has no rule is counted as
elementwise, and the tracer names it in the profile's notes, so nothing is lost silently.

FLOPs outside the GEMM / convolution / attention / RNN formulas (see `formulas`):
elementwise ops cost `ELEMENTWISE_FLOPS` per output element (1, or `HEAVY_FLOPS` = 5 for
transcendental ones: exp, tanh, gelu, silu, sigmoid, erf, ...); reductions and
normalisations cost their weight per element of their largest operand (1 for sum/mean/
max, 5 for softmax, log_softmax and the layer/batch/group/RMS norms, forward or
backward); data movement costs none (scatter-adds: one per added element).
"""

from __future__ import annotations

DROP = "drop"
"""Not recorded: the op launches no kernel (a view, an alias or an uninitialised
allocation)."""

HEAVY_FLOPS = 5
"""FLOPs per element of a transcendental or normalising op (a rough, documented
constant: the roofline needs the order of magnitude, these ops are memory-bound)."""

_VIEWS = """
view _unsafe_view _reshape_alias reshape view_as t transpose permute expand expand_as
as_strided slice select unsqueeze squeeze alias detach split split_with_sizes
unsafe_split unsafe_split_with_sizes chunk unsafe_chunk unbind narrow diagonal unfold
movedim moveaxis swapaxes swapdims numpy_T mT mH adjoint _conj _neg_view conj
resolve_conj resolve_neg real imag view_as_real view_as_complex lift_fresh
_nested_view_from_buffer _nested_view_from_jagged flatten unflatten
empty empty_like empty_strided new_empty new_empty_strided empty_permuted resize_ set_
_has_same_storage_numel _version
"""

_MATMUL = """
mm addmm bmm baddbmm matmul linear _scaled_mm _int_mm mv addmv dot vdot addr addbmm
_addmm_activation _weight_int8pack_mm _weight_int4pack_mm einsum
lstm gru rnn_tanh rnn_relu _cudnn_rnn _cudnn_rnn_backward miopen_rnn miopen_rnn_backward
mkldnn_rnn_layer mkldnn_rnn_layer_backward _thnn_differentiable_lstm_cell_backward
"""

_CONVOLUTION = """
convolution _convolution convolution_overrideable convolution_backward
convolution_backward_overrideable cudnn_convolution cudnn_convolution_transpose
cudnn_convolution_relu cudnn_convolution_add_relu miopen_convolution
miopen_depthwise_convolution miopen_convolution_transpose mkldnn_convolution
_slow_conv2d_forward _slow_conv2d_backward slow_conv3d_forward slow_conv_dilated2d
slow_conv_dilated3d slow_conv_transpose2d slow_conv_transpose3d _conv_depthwise2d
conv_depthwise3d _convolution_double_backward conv1d conv2d conv3d conv_transpose1d
conv_transpose2d conv_transpose3d conv_tbc
"""

_ATTENTION = """
_scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_backward
_scaled_dot_product_efficient_attention _scaled_dot_product_efficient_attention_backward
_scaled_dot_product_cudnn_attention _scaled_dot_product_cudnn_attention_backward
_scaled_dot_product_flash_attention_for_cpu
_scaled_dot_product_flash_attention_for_cpu_backward
_scaled_dot_product_fused_attention_overrideable
_scaled_dot_product_fused_attention_overrideable_backward
_flash_attention_forward _flash_attention_backward _efficient_attention_forward
_efficient_attention_backward _cudnn_attention_forward _cudnn_attention_backward
scaled_dot_product_attention
"""

_REDUCTION = """
sum mean amax amin max min aminmax argmax argmin prod var var_mean std std_mean norm
linalg_vector_norm linalg_norm frobenius_norm logsumexp cumsum cumprod logcumsumexp
all any count_nonzero nansum nanmean median topk sort kthvalue
softmax _softmax log_softmax _log_softmax _safe_softmax _softmax_backward_data
_log_softmax_backward_data
layer_norm native_layer_norm group_norm native_group_norm batch_norm native_batch_norm
_native_batch_norm_legit _native_batch_norm_legit_functional
_native_batch_norm_legit_no_training _batch_norm_with_update
_batch_norm_with_update_functional _batch_norm_no_update batch_norm_backward
cudnn_batch_norm miopen_batch_norm batch_norm_stats batch_norm_elemt
batch_norm_gather_stats batch_norm_gather_stats_with_counts batch_norm_backward_reduce
batch_norm_backward_elemt instance_norm rms_norm _fused_rms_norm
nll_loss nll_loss_forward nll_loss2d nll_loss2d_forward nll_loss_nd cross_entropy_loss
mse_loss l1_loss smooth_l1_loss huber_loss binary_cross_entropy
binary_cross_entropy_with_logits kl_div soft_margin_loss multilabel_margin_loss
multilabel_margin_loss_forward multi_margin_loss margin_ranking_loss
hinge_embedding_loss poisson_nll_loss cosine_embedding_loss ctc_loss _ctc_loss
max_pool1d max_pool2d max_pool3d max_pool2d_with_indices max_pool3d_with_indices
avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d
adaptive_avg_pool3d _adaptive_avg_pool2d _adaptive_avg_pool3d adaptive_max_pool1d
adaptive_max_pool2d adaptive_max_pool3d mkldnn_max_pool2d _cdist_forward cdist
"""

_DATA_MOVEMENT = """
copy _copy_from _copy_from_and_resize _to_copy to clone contiguous cat stack hstack
vstack index index_select gather scatter scatter_add scatter_reduce index_put
_index_put_impl index_add index_copy index_fill masked_scatter masked_select take
put _unsafe_index _unsafe_index_put _unsafe_masked_index embedding
embedding_dense_backward embedding_bag _embedding_bag _embedding_bag_backward
constant_pad_nd pad reflection_pad1d reflection_pad2d reflection_pad3d
replication_pad1d replication_pad2d replication_pad3d repeat repeat_interleave tile
flip roll rot90 im2col col2im pixel_shuffle pixel_unshuffle channel_shuffle
narrow_copy slice_scatter select_scatter diagonal_scatter as_strided_scatter
select_backward slice_backward expand_copy permute_copy transpose_copy view_copy
t_copy unsqueeze_copy squeeze_copy alias_copy detach_copy unbind_copy split_copy
split_with_sizes_copy lift_fresh_copy _local_scalar_dense item
zeros ones full zeros_like ones_like full_like new_zeros new_ones new_full fill zero
arange linspace logspace scalar_tensor tensor eye tril_indices triu_indices
upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d
_upsample_nearest_exact2d _upsample_nearest_exact3d nonzero unique _unique2
unique_consecutive searchsorted bucketize histc bincount _pin_memory
"""

_ELEMENTWISE = """
add sub rsub mul div neg abs sign sgn pow float_power sqrt rsqrt exp exp2 expm1 log log2
log10 log1p reciprocal sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh
atanh erf erfc erfinv sigmoid logit gelu silu mish relu relu6 leaky_relu elu selu celu
hardtanh hardswish hardsigmoid softplus softshrink hardshrink threshold
log_sigmoid_forward log_sigmoid glu prelu _prelu_kernel rrelu_with_noise
where masked_fill clamp clamp_min clamp_max clip maximum minimum fmax fmin
eq ne lt le gt ge isnan isinf isfinite logical_and logical_or logical_not logical_xor
bitwise_and bitwise_or bitwise_not bitwise_xor bitwise_left_shift bitwise_right_shift
__and__ __or__ __xor__ __lshift__ __rshift__ remainder fmod floor_divide floor ceil
round trunc frac lerp addcmul addcdiv square nan_to_num copysign hypot xlogy
tril triu polar sinc heaviside
native_dropout dropout feature_dropout alpha_dropout bernoulli rand rand_like randn
randn_like randint randint_like normal uniform exponential geometric cauchy
log_normal random multinomial _fused_dropout _masked_scale
upsample_linear1d upsample_bilinear2d upsample_bicubic2d upsample_trilinear3d
_upsample_bilinear2d_aa _upsample_bicubic2d_aa grid_sampler grid_sampler_2d
grid_sampler_3d affine_grid_generator
_thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell
rnn_relu_cell
_foreach_add _foreach_mul _foreach_div _foreach_sub _foreach_addcmul
_foreach_addcdiv _foreach_lerp _foreach_sqrt _foreach_copy _foreach_zero
_foreach_norm _amp_foreach_non_finite_check_and_unscale _amp_update_scale
_fused_adam _fused_adamw _fused_sgd
"""

_HEAVY = """
exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan atan2 sinh cosh tanh asinh
acosh atanh erf erfc erfinv sigmoid logit gelu silu mish elu selu celu softplus
log_sigmoid_forward log_sigmoid pow float_power rsqrt sqrt reciprocal glu
_thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell
rnn_relu_cell
softmax _softmax log_softmax _log_softmax _safe_softmax logsumexp
layer_norm native_layer_norm group_norm native_group_norm batch_norm native_batch_norm
_native_batch_norm_legit _native_batch_norm_legit_functional
_native_batch_norm_legit_no_training _batch_norm_with_update
_batch_norm_with_update_functional _batch_norm_no_update cudnn_batch_norm
miopen_batch_norm instance_norm rms_norm _fused_rms_norm var var_mean std std_mean
"""


def _table() -> dict[str, str]:
    rules: dict[str, str] = {}
    for words, op_class in (
        (_VIEWS, DROP),
        (_MATMUL, "matmul"),
        (_CONVOLUTION, "convolution"),
        (_ATTENTION, "attention"),
        (_REDUCTION, "reduction"),
        (_DATA_MOVEMENT, "data_movement"),
        (_ELEMENTWISE, "elementwise"),
    ):
        for word in words.split():
            rules.setdefault(f"aten.{word}", op_class)
    # Not ATen, but they reach a dispatch mode: metadata queries of the dispatcher.
    for word in ("prim.device", "prim.layout", "prim.dtype"):
        rules[word] = DROP
    return rules


OP_RULES: dict[str, str] = _table()
"""ATen name -> op class (or DROP). The one table of op classes."""

HEAVY_OPS: frozenset[str] = frozenset(f"aten.{word}" for word in _HEAVY.split())
"""Ops that cost HEAVY_FLOPS per element (and their backward)."""

ELEMENTWISE_FLOPS = 1
"""FLOPs per output element of an elementwise op without a heavier weight."""

_SUFFIXES = ("_backward_data", "_backward_input", "_backward_weight", "_backward")


def rule_of(name: str) -> str | None:
    """The class (or DROP) of an ATen op name, or None when no rule covers it."""
    found = OP_RULES.get(name)
    if found is not None:
        return found
    base = name
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]
        found = OP_RULES.get(base)
        if found is not None:
            return found
    for suffix in _SUFFIXES:
        if base.endswith(suffix):
            found = OP_RULES.get(base[: -len(suffix)])
            if found is not None:
                return "data_movement" if found == DROP else found
    if base.startswith("aten._foreach_"):
        return "elementwise"
    return None


def op_class_of(name: str) -> str:
    """The op class of an ATen op ('aten.addmm' -> 'matmul'). Views and allocations,
    which the profile leaves out, are 'data_movement'; ops without a rule 'elementwise'."""
    found = rule_of(name)
    if found is None:
        return "elementwise"
    return "data_movement" if found == DROP else found


def is_dropped(name: str) -> bool:
    """True for ops that launch no kernel (views, aliases, empty allocations)."""
    return OP_RULES.get(name) == DROP


def flop_weight(name: str) -> int:
    """FLOPs per element for ops counted per element (elementwise and reductions)."""
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    if base in HEAVY_OPS:
        return HEAVY_FLOPS
    for suffix in _SUFFIXES:
        if base.endswith(suffix) and base[: -len(suffix)] in HEAVY_OPS:
            return HEAVY_FLOPS
    return ELEMENTWISE_FLOPS
