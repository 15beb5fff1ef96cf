"""The ops TraceLens knows, for parity: which it models (and so counts whole, with everything
launched inside them) and on which family sheet, and which it only puts in a category.

Data of TraceLens 171dd747's `torch_op_mapping` (its `op_to_perf_model_class_map` with the
extensions' pseudo ops, and `CATEGORY_ONLY_OP_MAPPING`), kept by hand: `tests/test_tracelens_ops.py`
holds it against `tests/fixtures/tracelens_ops.json`, which `bench/tracelens_op_table.py` reads out of
a TraceLens checkout, so an op a newer TraceLens adds fails that test until it is added here (and,
for an aten op, given a model in `perf_models`).
"""

from __future__ import annotations

# (category in ops_summary, TraceLens's sheet family) -> the ops TraceLens models with it
MODELLED: dict[tuple[str, str], tuple[str, ...]] = {
    ('CONV_bwd', 'CONV'): (
        'ConvBiasReLU_Backward', 'ConvBias_Backward', 'aten::convolution_backward',
    ),
    ('CONV_fwd', 'CONV'): (
        'ConvBiasReLU_', 'ConvBias_', 'aten::convolution',
    ),
    ('CrossEntropy_fwd', 'CrossEntropy'): (
        'CrossEntropyFunction',
    ),
    ('CustomCollective', 'CustomCollective'): (
        '_C_custom_ar::all_reduce', '_C_custom_ar::qr_all_reduce', 'aiter::all_gather_reg',
        'aiter::fused_allreduce_rmsnorm', 'aiter::fused_allreduce_rmsnorm_', 'aiter::reduce_scatter',
        'sgl_kernel::all_reduce_reg', 'sgl_kernel::qr_all_reduce', 'sglang::reg_all_gather_into_tensor',
    ),
    ('GEMM', 'GEMM'): (
        '_LayerNormLinearBackward_wgrad_mm', '_LayerNormLinearBackward_xgrad_mm', '_LayerNormLinear_yfwd_mm',
        '_LinearBackward_wgrad_mm', '_LinearBackward_xgrad_mm', '_Linear_yfwd_mm', 'aiter::_gemm_a16w16_asm',
        'aiter::_gemm_a4w4_asm', 'aiter::_gemm_a8w8_blockscale_bpreshuffle_asm', 'aiter::batched_gemm_a16wfp4_',
        'aiter::flatmm_a8w8_blockscale_asm', 'aiter::gemm_a16w16', 'aiter::gemm_a16w16_atomic_', 'aiter::gemm_a4w4',
        'aiter::gemm_a8w8_blockscale_bpreshuffle_ck', 'aiter::gemm_a8w8_blockscale_bpreshuffle_cktile',
        'aiter::gemm_a8w8_blockscale_ck', 'aiter::gemm_a8w8_blockscale_cktile', 'aiter::gemm_a8w8_bpreshuffle',
        'aiter::gemm_a8w8_bpreshuffle_ck', 'aiter::gemm_a8w8_ck', 'aiter::gemm_afp4wfp4_',
        'aiter::gfx950_a8w8_blockscale_asm', 'aten::_scaled_mm', 'aten::addmm', 'aten::baddbmm', 'aten::bmm',
        'aten::mm', 'bitsandbytes::int8_linear_matmul', 'primus_turbo::hipblaslt_gemm_fp4',
        'primus_turbo::hipblaslt_gemm_fp8', 'primus_turbo_cpp_extension::hipblaslt_gemm_fp4',
        'primus_turbo_cpp_extension::hipblaslt_gemm_fp8',
        'sglang_profiler::batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant_batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant',
        'sglang_profiler::fp8_utils_gemm_a8w8_blockscale',
        'sglang_profiler::gemm_a8w8_blockscale_gemm_a8w8_blockscale', 'sglang_profiler::gemm_kernels_flydsl_hgemm',
        'tex_ts::te_gemm_ts', 'trtllm::cublas_scaled_mm', 'vllm::_rocm_aiter_preshuffled_per_token_w8a8_gemm',
        'vllm::gemm_with_dynamic_quant', 'vllm::rocm_aiter_triton_gemm_a8w8_blockscale',
        'vllm::rocm_unquantized_gemm',
    ),
    ('GroupQuant', 'BinaryElementwise'): (
        'aiter::dynamic_per_group_scaled_quant', 'aiter::dynamic_per_tensor_quant',
        'aiter::dynamic_per_token_scaled_quant', 'vllm::triton_per_token_group_quant_fp8',
    ),
    ('GroupQuant', 'GroupQuant'): (
        'aiter::dynamic_per_group_scaled_quant_fp4', 'aiter::fused_dynamic_mx_quant_moe_sort_hip',
        'aiter::fused_dynamic_mxfp4_quant_moe_sort_hip',
        'sglang_profiler::fused_mxfp4_quant_fused_flatten_mxfp4_quant', 'sglang_profiler::quant_dynamic_mxfp4_quant',
    ),
    ('GroupedGEMM_fwd', 'GroupedGEMM'): (
        'primus_turbo::grouped_gemm', 'primus_turbo::grouped_gemm_impl', 'primus_turbo::grouped_gemm_variable_k',
        'primus_turbo::grouped_gemm_variable_k_impl', 'primus_turbo_cpp_extension::ck_grouped_gemm',
        'primus_turbo_cpp_extension::ck_grouped_gemm_variable_k', 'primus_turbo_cpp_extension::grouped_gemm',
        'primus_turbo_cpp_extension::grouped_gemm_variable_k',
    ),
    ('InferenceAttention', 'InferenceAttention'): (
        'aiter::fmha_v3_varlen_fwd', 'aiter::linear_attention_with_output_base', 'aiter::mha_batch_prefill',
        'aiter::mha_varlen_fwd', 'aiter::pa_decode_gluon', 'aiter::pa_sparse_prefill_opus_fwd',
        'pseudo_mla_decode_fwd', 'pseudo_mla_prefill_fwd', 'pseudo_v4_paged_decode_csa',
        'pseudo_v4_paged_decode_hca', 'pseudo_v4_paged_decode_swa', 'sglang::store_cache',
        'sglang_profiler::attention_paged_attention_ragged', 'sglang_profiler::tilelang_kernel_tilelang_sparse_fwd',
        'vllm::gdn_attention_core', 'vllm::unified_attention_with_output',
    ),
    ('MoE_aux', 'MoE_aux'): (
        'aiter::biased_grouped_topk_hip', 'aiter::moe_sorting_fwd', 'aiter::mxfp4_moe_sort_hip',
        'aiter::topk_softplus', 'sglang_profiler::fused_moe_triton_kernels_fused_append_shared_experts',
    ),
    ('MoE_comm_fwd', 'MoE_comm'): (
        'MoECombine', 'MoEDispatch',
    ),
    ('MoE_fused', 'MoE_fused'): (
        'aiter::fmoe_fp8_blockscale_g1u1', 'aiter::fmoe_g1u1', 'pseudo_op::moe_aiter_fused_1stage',
    ),
    ('MoE_unfused', 'MoE_unfused'): (
        'aiter::ck_moe_stage1', 'aiter::ck_moe_stage2', 'aiter::moe_cktile2stages_gemm1_ck',
        'aiter::moe_cktile2stages_gemm2_ck', 'pseudo_op::moe_flydsl_stage1', 'pseudo_op::moe_flydsl_stage2',
        'pseudo_op::moe_gptq_awq_down', 'pseudo_op::moe_gptq_awq_up', 'pseudo_op::moe_triton_unfused_down',
        'pseudo_op::moe_triton_unfused_up', 'sglang_profiler::fused_moe_triton_kernels_invoke_fused_moe_kernel',
    ),
    ('NORM_bwd', 'Normalization'): (
        'aten::_fused_rms_norm_backward', 'aten::batch_norm_backward', 'aten::cudnn_batch_norm_backward',
        'aten::cudnn_group_norm_backward', 'aten::cudnn_instance_norm_backward', 'aten::cudnn_layer_norm_backward',
        'aten::cudnn_rms_norm_backward', 'aten::group_norm_backward', 'aten::instance_norm_backward',
        'aten::layer_norm_backward', 'aten::miopen_batch_norm_backward', 'aten::miopen_group_norm_backward',
        'aten::miopen_instance_norm_backward', 'aten::miopen_layer_norm_backward', 'aten::miopen_rms_norm_backward',
        'aten::native_batch_norm_backward', 'aten::native_group_norm_backward',
        'aten::native_instance_norm_backward', 'aten::native_layer_norm_backward', 'aten::native_rms_norm_backward',
        'aten::rms_norm_backward', 'primus::fused_ln_modulate_backward',
    ),
    ('NORM_fwd', 'Normalization'): (
        'aiter::_groupnorm_run', 'aten::_fused_rms_norm', 'aten::batch_norm', 'aten::cudnn_batch_norm',
        'aten::cudnn_group_norm', 'aten::cudnn_instance_norm', 'aten::cudnn_layer_norm', 'aten::group_norm',
        'aten::instance_norm', 'aten::layer_norm', 'aten::miopen_batch_norm', 'aten::miopen_group_norm',
        'aten::miopen_instance_norm', 'aten::miopen_layer_norm', 'aten::native_batch_norm',
        'aten::native_group_norm', 'aten::native_instance_norm', 'aten::native_layer_norm',
        'primus::fused_ln_modulate',
    ),
    ('RMSNorm', 'RMSNorm'): (
        'aiter::_fuse_rmsnorm_fp4_quant', 'aiter::add_rmsnorm', 'aiter::fused_add_rmsnorm_pad_', 'aiter::rms_norm',
        'aiter::rmsnorm', 'aiter::rmsnorm2d_fwd_ck', 'aiter::rmsnorm2d_fwd_with_add_ck',
        'aiter::rmsnorm2d_fwd_with_dynamicquant_ck', 'aiter::rmsnorm_quant',
        'sglang_profiler::fused_mxfp4_quant_fused_rms_mxfp4_quant', 'vllm::rocm_aiter_rmsnorm_fp8_group_quant',
        'vllm::rocm_aiter_rmsnorm_with_add_fp8_group_quant', 'vllm::rocm_aiter_triton_add_rmsnorm_pad',
    ),
    ('RoPE_fwd', 'FusedRoPE'): (
        'aiter::fused_qk_rope_cat_and_cache_mla', 'aiter::fused_qk_rope_concat_and_cache_mla',
    ),
    ('RoPE_fwd', 'RoPE'): (
        'FusedRoPEFunc', 'aiter::rope_cached_positions_2c_fwd_impl', 'sgl_kernel::rotary_embedding',
    ),
    ('SDPA_bwd', 'SDPA'): (
        'aiter::_flash_attn_backward', 'aiter::mha_bwd', 'aiter::wrapper_fmha_v3_bwd',
        'flash_attn::_flash_attn_backward', 'flash_attn::_flash_attn_varlen_backward',
    ),
    ('SDPA_fwd', 'SDPA'): (
        'EvoformerAttention', 'FlashAttnFunc', 'aiter::_flash_attn_forward', 'aiter::fmha_v3_fwd', 'aiter::mha_fwd',
        'aiter::wrapper_fmha_v3_fwd', 'aten::_scaled_dot_product_cudnn_attention',
        'aten::_scaled_dot_product_efficient_attention', 'aten::_scaled_dot_product_flash_attention',
        'flash_attn::_flash_attn_forward', 'flash_attn::_flash_attn_varlen_forward', 'flash_attn_3::fwd',
    ),
    ('SSM_fwd', 'SSM'): (
        'DaoAILab::_causal_conv1d_fwd_cpp', 'MambaSplitConv1dScanCombinedFn',
    ),
    ('elementwise', 'BinaryElementwise'): (
        'LigerSiLUMulFunction', 'aten::add', 'aten::add_', 'aten::div', 'aten::div_', 'aten::mul', 'aten::mul_',
        'aten::sigmoid_backward', 'aten::threshold_backward',
    ),
    ('elementwise', 'UnaryElementwise'): (
        '_C::silu_and_mul', 'aiter::gelu_and_mul', 'aiter::gelu_tanh_and_mul', 'aiter::silu_and_mul',
        'aten::clamp_max', 'aten::clamp_max_', 'aten::clamp_min', 'aten::clamp_min_', 'aten::copy', 'aten::copy_',
        'aten::neg', 'aten::pow', 'aten::replication_pad1d', 'aten::replication_pad2d', 'aten::replication_pad3d',
        'aten::rsqrt', 'aten::sigmoid', 'aten::silu', 'aten::upsample_nearest1d', 'aten::upsample_nearest2d',
        'aten::upsample_nearest3d', 'primus::quantize_mxfp4_dual', 'primus_turbo::quantize_fp8_tensorwise',
        'primus_turbo::quantize_mxfp4_dual', 'primus_turbo_cpp_extension::quantize_fp8_tensorwise',
        'primus_turbo_cpp_extension::quantize_mxfp4_dual', 'sgl_kernel::silu_and_mul',
    ),
    ('elementwise', 'elementwise'): (
        'aiter::mixed_sample_outer_exponential',
    ),
    ('mHC', 'mHC'): (
        'aiter::mhc_fused_post_pre_gemm_sqrsum', 'aiter::mhc_post', 'aiter::mhc_pre_big_fuse_rmsnorm',
        'aiter::mhc_pre_gemm_sqrsum',
    ),
    ('reduce', 'Reduce'): (
        'aten::amax', 'aten::amin', 'aten::cumprod', 'aten::cumsum', 'aten::linalg_norm', 'aten::logsumexp',
        'aten::max', 'aten::mean', 'aten::min', 'aten::norm', 'aten::std', 'aten::sum', 'aten::var',
    ),
}
# category -> the ops TraceLens puts in it without a model (their perf cells blank)
CATEGORY_ONLY: dict[str, tuple[str, ...]] = {
    'CONV_fwd': (
        'aten::cudnn_convolution', 'aten::miopen_convolution',
    ),
    'CrossEntropy_bwd': (
        'CrossEntropyFunctionBackward',
    ),
    'CustomCollective': (
        'aiter::allgather_lastdim<std::bfloat16_t, 2>(aiter::RankData*, aiter::RankSignals, aiter::Signal*, std::bfloat16_t*, int, int, int) (Synthetic Op)',
        'aiter::allgather_lastdim<std::bfloat16_t, 4>(aiter::RankData*, aiter::RankSignals, aiter::Signal*, std::bfloat16_t*, int, int, int) (Synthetic Op)',
    ),
    'FusedRoPE': (
        'aiter::unified_attention_with_output_base->_fused_qk_rope_reshape_and_cache_kernel (Synthetic Op)',
        'aiter::v4_attention_with_output->_inverse_rope_gptj_kernel (Synthetic Op)',
        'aiter::v4_attention_with_output->hca_norm_rope_scatter_D512_RD64_R128_KB1_rmsbf16_flydsl (Synthetic Op)',
        'aiter::v4_attention_with_output->qk_norm_rope_H32_D512_RD64_flydsl (Synthetic Op)',
        'aiter::v4_attention_with_output->qk_norm_rope_H64_D512_RD64_flydsl (Synthetic Op)',
    ),
    'InferenceAttention': (
        '_C_cache_ops::concat_and_cache_mla', '_C_cache_ops::reshape_and_cache_flash', 'aiter::get_mla_metadata_v1',
        'aiter::indexer_score_topk', 'aiter::v4_attention_with_output->_swa_write_kernel (Synthetic Op)',
        'aiter::v4_attention_with_output->_update_compressor_states_kernel (Synthetic Op)',
        'aiter::v4_attention_with_output->fused_compress_attn_D128_RD64_R4_OVL_SS8_KB32_Q_ue8m0_psh_rmsbf16_pf_flydsl (Synthetic Op)',
        'aiter::v4_attention_with_output->fused_compress_attn_D512_RD64_R4_OVL_SS8_KB32_rmsbf16_pf_flydsl (Synthetic Op)',
        'aiter::v4_attention_with_output->hca_compress_forward_D512_R128_NW4_SL256_S128_flydsl (Synthetic Op)',
        'aiter::v4_attention_with_output->hca_compress_forward_D512_R128_NW8_SL128_S128_flydsl (Synthetic Op)',
        'hipModuleLaunchKernel->kv_indices_generate_kernel (Synthetic Op)',
    ),
    'MoE_aux': (
        '_moe_C::moe_align_block_size', 'aiter::fused_dynamic_mxfp4_quant_moe_sort_hip',
        'aiter::fused_moe_->_fused_dynamic_mxfp4_quant_moe_sort_kernel (Synthetic Op)', 'aiter::grouped_topk',
        'aiter::moe_align_block_size', 'aiter::moe_fused_gate', 'aiter::moe_sorting_opus_fwd', 'aiter::moe_sum',
        'aiter::topk_sigmoid', 'aiter::topk_softmax', 'aiter::topk_softmax_asm',
    ),
    'MoE_comm_bwd': (
        'MoECombineBackward', 'MoEDispatchBackward', 'TokenPermuteMaskMapBackward',
        '_OperationFuserAutogradFunctionBackward',
    ),
    'MoE_comm_fwd': (
        'TokenPermuteMaskMap', '_OperationFuserAutogradFunction',
    ),
    'RoPE_bwd': (
        'FusedRoPEFuncBackward',
    ),
    'SDPA_bwd': (
        'FlashAttnFuncBackward', 'FusedAttnFuncBackward', 'aten::_efficient_attention_backward',
        'aten::_scaled_dot_product_cudnn_attention_backward',
        'aten::_scaled_dot_product_efficient_attention_backward',
        'aten::_scaled_dot_product_flash_attention_backward',
    ),
    'SDPA_fwd': (
        'aten::_efficient_attention_forward',
    ),
    'SSM_bwd': (
        'DaoAILab::_causal_conv1d_bwd_cpp', 'MambaSplitConv1dScanCombinedFnBackward',
    ),
}

# TraceLens files these sheets once for forward and backward ops; any other family gets a
# `<family>_fwd` and a `<family>_bwd` sheet
_ONE_SHEET = ("GEMM", "UnaryElementwise", "BinaryElementwise", "Normalization")
# Op names TraceLens categorises by their start when it knows the op by neither table
NAME_PATTERNS = (("triton", "triton"), ("record_param_comms", "record_param_comms"))


def _sheet(category: str, family: str) -> str:
    if family in _ONE_SHEET:
        return family
    return f"{family}_bwd" if category.endswith("_bwd") else f"{family}_fwd"


# op -> the family sheet (file name) TraceLens writes its calls on
SHEET: dict[str, str] = {op: _sheet(category, family) for (category, family), ops in MODELLED.items() for op in ops}
# op -> its category in TraceLens's op tables
CATEGORY: dict[str, str] = {
    **{op: category for (category, _), ops in MODELLED.items() for op in ops},
    **{op: category for category, ops in CATEGORY_ONLY.items() for op in ops},
}


def category_by_name(name: str) -> str | None:
    """TraceLens's category of an op from its name alone (None: it goes by what the op launched)."""
    known = CATEGORY.get(name)
    if known is not None:
        return known
    return next((category for start, category in NAME_PATTERNS if name.startswith(start)), None)
