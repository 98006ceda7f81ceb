"""Pretrained Hugging Face models on attn's own layers and kernels (torch not needed).

    import attn.models
    m = attn.models.from_pretrained("path/to/all-MiniLM-L6-v2")   # config.json, model.safetensors, tokenizer.json
    ids = m.tokenizer.encode("Hello world")                       # the ids `tokenizers` gives, [CLS] ... [SEP]
    h = m.forward(np.array([ids]))                                 # (B, L, E): the last hidden state
    e = m.embed(["Hello world", "Goodbye"])                        # (N, E): sentence-transformers' pooling
    g = attn.models.from_pretrained("path/to/gpt2")               # GPT-2, Llama, Mistral, Qwen2, Gemma 2, BLOOM
    new = g.generate(g.tokenizer.encode("Hello"), max_new_tokens=20)   # greedy through the KV cache
    t = attn.models.from_pretrained("path/to/t5")                 # T5ForConditionalGeneration, BART
    out = t.generate(t.tokenizer.encode("translate: Hello"), max_new_tokens=20)   # the target's ids

Not a hub client: a local directory only.
"""
import os

import numpy as np

import _attn


class PretrainedModel:
    """A loaded model directory. Float32 weights are read in place from the mapped safetensors file."""

    def __init__(self, directory, dtype="float32"):
        self._p = _attn.Pretrained(_path(directory), _dtype_name(dtype))
        self.dtype = self._p.dtype
        self.tokenizer = self._p.tokenizer
        self.architecture = self._p.architecture
        self.hidden_size = self._p.hidden_size
        self.num_layers = self._p.num_layers
        self.num_heads = self._p.num_heads

    def forward(self, ids, attention_mask=None):
        """ids (B, L) int -> the last hidden state (B, L, E); attention_mask (B, L), 1 = token, 0 = padding
        (None: all tokens). Padded positions are computed not at all and come back as 0."""
        return self._p.forward(np.asarray(ids), None if attention_mask is None else np.asarray(attention_mask))

    __call__ = forward

    def attention_weights(self, ids, attention_mask=None):
        """Per layer, the attention weights (B, H, L, L) of forward(ids, attention_mask). ids may be a text:
        tokenized as tokenizer.encode does (special tokens included), one row (B = 1)."""
        if isinstance(ids, (str, bytes)):
            ids = [self.tokenizer.encode(ids)]
        return self._p.attention_weights(np.asarray(ids),
                                         None if attention_mask is None else np.asarray(attention_mask))

    def embed(self, texts, batch_size=32, max_length=None):
        """Sentence embeddings (N, E) of a list of texts, pooled as the directory's sentence-transformers files
        say; each text truncated to max_length tokens (None: sentence_bert_config.json's max_seq_length, else
        the tokenizer's truncation)."""
        if isinstance(texts, str):
            raise _attn.AttnError("Expected a list of texts, but got one str instead (wrap it in a list)")
        return self._p.embed(list(texts), batch_size, max_length or 0)


class PretrainedDecoder(PretrainedModel):
    """A loaded decoder (GPT-2, Llama, Mistral, Qwen2, Gemma 2, BLOOM): forward gives logits, generate continues
    ids."""

    def forward(self, ids, attention_mask=None):
        """ids (B, L) int -> logits (B, L, V); attention_mask (B, L), 1 = token, 0 = padding (None: all tokens).
        Padded positions are computed not at all and come back as 0; positions are 0..L-1 by index."""
        return super().forward(ids, attention_mask)

    __call__ = forward

    @property
    def eos_token_ids(self):
        """The ids generate() stops at by default: generation_config.json's, else config.json's."""
        return self._p.eos_token_ids

    def generate(self, prompt_ids, max_new_tokens=None, temperature=None, top_k=None, seed=None, kv_dtype="f32",
                 eos_token_ids=None):
        """The new token ids after prompt_ids (a list of ints), one at a time through the KV cache: greedy at
        temperature 0, else sampled (top_k 0: every token; seeded); kv_dtype "f32", "f16" or "bf16". Stops
        after max_new_tokens or an eos token (included), as transformers' generate does; eos_token_ids
        None: the model's (eos_token_ids), [] never stops early. An option left None takes the library's one
        default (attn/sampling.h's SampleOptions: 100 tokens, greedy, as transformers' generate)."""
        given = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed)
        return self._p.generate([int(t) for t in prompt_ids], kv_dtype=kv_dtype,
                                eos_token_ids=None if eos_token_ids is None else [int(t) for t in eos_token_ids],
                                **{k: v for k, v in given.items() if v is not None})


def _path(directory):
    """A directory given as str, bytes or os.PathLike, as a str (bytes decoded as the file system does:
    str(b"/tmp/m") was "b'/tmp/m'"); anything else, None included, is refused rather than looked up as "None"."""
    try:
        return os.fsdecode(directory)
    except TypeError:
        raise _attn.AttnError(f"Expected a model directory (a str, bytes or os.PathLike), but got "
                              f"{type(directory).__name__} {directory!r} instead") from None


class PretrainedSeq2Seq(PretrainedModel):
    """A loaded encoder-decoder (T5ForConditionalGeneration, BartForConditionalGeneration): forward gives the
    encoder's last hidden state, logits the decoder's (teacher forced), generate translates source ids."""

    @property
    def eos_token_ids(self):
        """The ids generate() stops at by default: generation_config.json's, else config.json's."""
        return self._p.eos_token_ids

    @property
    def decoder_start_token_id(self):
        """The target's first token (generate's output starts after it)."""
        return self._p.decoder_start_token_id

    def logits(self, source_ids, target_ids, attention_mask=None):
        """source (B, S) and target (B, T) ids -> the decoder's logits (B, T, V) (target_ids as transformers'
        decoder_input_ids: the start token first); attention_mask (B, S) marks the source's tokens (None: all)."""
        return self._p.seq2seq_logits(np.asarray(source_ids), np.asarray(target_ids),
                                      None if attention_mask is None else np.asarray(attention_mask))

    def all_attention_weights(self, source_ids, target_ids):
        """One source and target (lists of ids): {"encoder": per layer (1, H, S, S), "decoder": (1, H, T, T),
        "cross": (1, H, T, S)}: the target tokens' attention over the source's beside each side's own."""
        return self._p.seq2seq_attention_weights([int(t) for t in source_ids], [int(t) for t in target_ids])

    def generate(self, source_ids, max_new_tokens=100, temperature=0.0, top_k=0, seed=0, kv_dtype="f32",
                 eos_token_ids=None):
        """The target ids after decoder_start_token_id for source_ids (a list of ints): the source encoded once,
        then one token at a time through the decoder's KV cache, greedy at temperature 0, else sampled; stops
        as PretrainedDecoder.generate does (forced_bos/eos_token_id of the config applied as transformers does)."""
        return self._p.generate([int(t) for t in source_ids], max_new_tokens, temperature, top_k, seed, kv_dtype,
                                None if eos_token_ids is None else [int(t) for t in eos_token_ids])


def _dtype_name(dtype):
    """"float32"/"bfloat16" (or "f32"/"bf16", numpy's float32, torch.float32/torch.bfloat16) as attn names it."""
    name = str(getattr(dtype, "__name__", dtype)).replace("torch.", "")
    return {"float32": "f32", "f32": "f32", "bfloat16": "bf16", "bf16": "bf16"}.get(name, name)


def from_pretrained(directory, dtype="float32"):
    """The model in a Hugging Face model directory: BertModel (an encoder: PretrainedModel), GPT2LMHeadModel,
    LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Gemma2ForCausalLM or BloomForCausalLM (decoders:
    PretrainedDecoder), T5ForConditionalGeneration or BartForConditionalGeneration (encoder-decoders:
    PretrainedSeq2Seq). dtype "bfloat16": its matmuls multiply bf16 products
    with fp32 sums (attn.info()["gemm_bf16"] says whether the CPU's instruction or its exact emulation runs);
    weights stay the mapped float32."""
    m = PretrainedModel(directory, dtype)
    if m._p.is_decoder:
        m.__class__ = PretrainedDecoder
    elif m._p.is_seq2seq:
        m.__class__ = PretrainedSeq2Seq
    return m
