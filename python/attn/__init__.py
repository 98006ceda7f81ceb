"""attn: multi-head attention in C++ (numpy in, numpy out).

    import attn
    out = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
"""
from _attn import (__version__, AttnError, gemm, gemm_bf16, gemm_kernel, get_num_threads, info,  # noqa: F401
                   set_num_threads)
from _attn import GPT, AdamW, CharTokenizer, Trainer, TrainOptions, gpt_config  # noqa: F401

from .functional import (  # noqa: F401
    scaled_dot_product_attention, scaled_dot_product_attention_backward, varlen_attention, varlen_attention_backward)
from .io import load_safetensors, save_safetensors  # noqa: F401
from . import models, viz  # noqa: F401
from .layers import (  # noqa: F401
    GELU, Dropout, Embedding, FeedForward, LayerNorm, Linear, MultiheadAttention, ReLU, TransformerDecoderLayer,
    TransformerEncoderLayer)
