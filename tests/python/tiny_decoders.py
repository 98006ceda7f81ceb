"""Tiny random model directories written by transformers (save_pretrained: config.json, model.safetensors):
the decoders GPT-2, Llama, Mistral, Qwen2, Gemma 2 and BLOOM, the encoder-decoders T5 and BART, and BERT,
plus a WordPiece tokenizer.json built with `tokenizers` (the kind attn's HfTokenizer reads today) over the
model's vocabulary size. Shared by tests/python/test_decoders.py, test_seq2seq.py, test_transformers.py,
test_hostile_dirs.py and bench/generate_vs_torch.py. No eos token unless asked: greedy runs the full length
in both libraries."""
from pathlib import Path

WORDS = ("the of and to a in that is was he for it with as his on be at by i this had not are but from or "
         "have an they which one you were her all she there would their we him been has when who will more no "
         "if out so said what up its about into than them can only other new some could time these two may "
         "then do first any my now such like our over man me even most made after also did many before must "
         "through back years where much your way well down should because each just those people how too "
         "little state good very make world still own see men work long get here between both life being under "
         "never day same another know while last might us great old year off come since against go came right "
         "used take three").split()


def write_tokenizer(path, vocab_size):
    """A WordPiece tokenizer.json with exactly vocab_size tokens: specials, letters, ##letters, words."""
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = ["[UNK]", "[PAD]"] + letters + ["##" + c for c in letters] + list(".,!?;:'")
    tokens += [w for w in WORDS if w not in tokens]
    tokens = tokens[:vocab_size]
    tokens += [f"tok{i}" for i in range(vocab_size - len(tokens))]
    t = tokenizers.Tokenizer(models.WordPiece({w: i for i, w in enumerate(tokens)}, unk_token="[UNK]"))
    t.normalizer = normalizers.BertNormalizer(lowercase=True)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.decoder = decoders.WordPiece()
    t.save(str(path))
    return t


def gpt2(directory, n_embd=72, n_head=3, n_layer=2, vocab_size=211, n_positions=128, tie=True, seed=0, **kw):
    import torch
    import transformers
    torch.manual_seed(seed)
    c = transformers.GPT2Config(n_embd=n_embd, n_head=n_head, n_layer=n_layer, vocab_size=vocab_size,
                                n_positions=n_positions, tie_word_embeddings=tie, bos_token_id=None,
                                eos_token_id=None, pad_token_id=None, **kw)
    return save(transformers.GPT2LMHeadModel(c), directory, vocab_size)


def llama(directory, hidden_size=64, heads=4, kv_heads=2, head_dim=16, layers=2, vocab_size=97, intermediate=96,
          rope_theta=10000.0, tie=False, max_positions=256, seed=0, **kw):
    import torch
    import transformers
    torch.manual_seed(seed)
    c = transformers.LlamaConfig(hidden_size=hidden_size, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                 head_dim=head_dim, num_hidden_layers=layers, vocab_size=vocab_size,
                                 intermediate_size=intermediate, rope_theta=rope_theta, tie_word_embeddings=tie,
                                 max_position_embeddings=max_positions, bos_token_id=None, eos_token_id=None,
                                 pad_token_id=None, **kw)
    return save(transformers.LlamaForCausalLM(c), directory, vocab_size)


def bert(directory, hidden_size=32, heads=4, layers=2, vocab_size=120, intermediate=48, max_positions=64, seed=0,
         **kw):
    import torch
    import transformers
    torch.manual_seed(seed)
    c = transformers.BertConfig(hidden_size=hidden_size, num_attention_heads=heads, num_hidden_layers=layers,
                                vocab_size=vocab_size, intermediate_size=intermediate,
                                max_position_embeddings=max_positions, **kw)
    return save(transformers.BertModel(c, add_pooling_layer=False), directory, vocab_size)


NO_IDS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def jitter_norms(model, std=0.1):
    """Norm weights (and biases) are ones (zeros, Gemma 2's) at init: noise on them, so a test sees them."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * std)
    return model


def _decoder(cls_name, config_name, directory, vocab_size, seed, **config):
    import torch
    import transformers
    torch.manual_seed(seed)
    c = getattr(transformers, config_name)(vocab_size=vocab_size, **{**NO_IDS, **config})
    return save(jitter_norms(getattr(transformers, cls_name)(c)), directory, vocab_size)


def mistral(directory, hidden_size=64, heads=4, kv_heads=2, head_dim=16, layers=2, vocab_size=97, intermediate=96,
            sliding_window=8, max_positions=256, seed=0, **kw):
    return _decoder("MistralForCausalLM", "MistralConfig", directory, vocab_size, seed, hidden_size=hidden_size,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                    num_hidden_layers=layers, intermediate_size=intermediate, sliding_window=sliding_window,
                    max_position_embeddings=max_positions, **kw)


def qwen2(directory, hidden_size=64, heads=4, kv_heads=2, layers=2, vocab_size=97, intermediate=96,
          max_positions=256, seed=0, **kw):
    return _decoder("Qwen2ForCausalLM", "Qwen2Config", directory, vocab_size, seed, hidden_size=hidden_size,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
                    intermediate_size=intermediate, max_position_embeddings=max_positions, **kw)


def gemma2(directory, hidden_size=64, heads=4, kv_heads=2, head_dim=16, layers=3, vocab_size=97, intermediate=96,
           sliding_window=6, max_positions=256, seed=0, **kw):
    return _decoder("Gemma2ForCausalLM", "Gemma2Config", directory, vocab_size, seed, hidden_size=hidden_size,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                    num_hidden_layers=layers, intermediate_size=intermediate, sliding_window=sliding_window,
                    max_position_embeddings=max_positions, **kw)


def bloom(directory, hidden_size=48, heads=6, layers=2, vocab_size=101, seed=0, **kw):
    return _decoder("BloomForCausalLM", "BloomConfig", directory, vocab_size, seed, hidden_size=hidden_size,
                    n_head=heads, n_layer=layers, **kw)


def t5(directory, d_model=48, d_kv=12, d_ff=80, layers=2, decoder_layers=None, heads=4, vocab_size=97, seed=0,
       **kw):
    import torch
    import transformers
    torch.manual_seed(seed)
    c = transformers.T5Config(d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=layers, num_heads=heads,
                              num_decoder_layers=decoder_layers, vocab_size=vocab_size, eos_token_id=None,
                              decoder_start_token_id=0, **kw)
    return save(jitter_norms(transformers.T5ForConditionalGeneration(c)), directory, vocab_size)


def bart(directory, d_model=48, heads=4, layers=2, ffn=80, vocab_size=97, max_positions=128, seed=0, **kw):
    import torch
    import transformers
    torch.manual_seed(seed)
    c = transformers.BartConfig(d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                                encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
                                decoder_ffn_dim=ffn, vocab_size=vocab_size, max_position_embeddings=max_positions,
                                **{"eos_token_id": None, "forced_eos_token_id": None, "bos_token_id": None, **kw})
    m = jitter_norms(transformers.BartForConditionalGeneration(c))
    with torch.no_grad():  # zeros at init: random, so that the test sees the bias
        m.final_logits_bias.normal_(0, 0.1)
    return save(m, directory, vocab_size)


def save(model, directory, vocab_size):
    directory = Path(directory)
    model = model.eval()
    model.save_pretrained(directory)
    write_tokenizer(directory / "tokenizer.json", vocab_size)
    return model
