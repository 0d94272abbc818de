"""Triton kernels of the folded verifier (SPEC §5), one op per module, each a private ``_<op>_kernel`` and a public
launcher that checks shapes, strides and dtypes and picks block sizes.

=====================  ===========================================================================
module                 op
=====================  ===========================================================================
``gate``               :func:`~specfold.engine.kernels.gate.gate_compact` — Eq. 4/5 + atomic compaction
``resolve``            :func:`~specfold.engine.kernels.resolve.resolve_sources` — fold chains, hop by hop
``qkv``                :func:`~specfold.engine.kernels.qkv.qkv_rope` — RMSNorm + QKV GEMM + RoPE + scatter
``attention``          :func:`~specfold.engine.kernels.attention.attend_rows` — streaming row attention
``correction``         :func:`~specfold.engine.kernels.correction.correct_folded` — Eq. 8 + guard
``ffn``                :func:`~specfold.engine.kernels.ffn.ffn_rows` — RMSNorm + gate/up + SiLU·mul + down
=====================  ===========================================================================

Importing this package imports Triton; nothing outside ``backend="triton"`` does. The same-signature PyTorch
references live in :mod:`specfold.engine.reference`. Under ``TRITON_INTERPRET=1`` (set before the first import)
the kernels run on CPU tensors in Triton's interpreter.
"""
