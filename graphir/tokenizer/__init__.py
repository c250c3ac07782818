"""GGUF vocabularies, tokenized and detokenized exactly as llama.cpp does: graphir.tokenizer.vocab.Vocab.

The modules, from the bottom up: unicode (Unicode 15.1 classes and lowercase, embedded), metadata (typed
tokenizer keys), tokens (the token list and its attributes), pretokenize (the ``tokenizer.ggml.pre`` regexes),
model (the interface of a tokenizer model), merge (the merge loop of BPE and SentencePiece), one module per
kind of ``tokenizer.ggml.model`` -- bpe (``gpt2``, ``gemma4``, ``whitespace``, ``hybriddna``), spm (``llama``),
wpm (``bert``), ugm (``t5``), plamo2 (``plamo2``), rwkv (``rwkv``), chunks (``test``) -- and vocab, which picks
the model and does what all models share. ``no_vocab``/``none`` files have no vocabulary and are refused.
This file imports none of them, so that importing one loads only what it needs.
"""
