"""One table, every family: each row is a tiny model, and every row runs the same scenarios.

The tiny models come from llama.cpp itself where it can make them (tests/llama_made.py: its loader creates
every tensor the architecture may read, optional ones included), so the tensor set a row checks is llama.cpp's;
its own quantizer makes every row's F16 and Q8_0 files from the F32 one. Where llama.cpp cannot save a model of the family (its
saver has no T5; the BERT file it writes lacks token_embd), the row's model is graphir's own tiny GGUF
(tests/conftest.py). The scenarios:

- logits: a prompt's logits at every position, then a few greedy steps, llama.cpp's (F32 weights and cache;
  bit for bit on llama.cpp's own CPU path); an encoder's token embeddings instead; an encoder-decoder's decoder
  after both engines encoded the prompt;
- greedy: the tokens llama.cpp chooses for F16 and Q8_0 weights, token for token;
- a bidirectional decoder (no cache: the diffusion models) instead refines a masked sequence as llama.cpp's
  diffusion example does, every step's logits llama.cpp's, and each engine's own choices llama.cpp's for F16 and
  Q8_0; a batch beyond one ubatch is refused;
- batch and ubatch invariance: a prompt as one ubatch, in ubatches of 3 and token by token gives the same logits;
- sequences: several sequences interleaved in one batch equal llama.cpp's and each one alone;
- state: a context saved and loaded into another continues bit for bit as the first;
- failure: a ubatch whose computation fails leaves every byte of the memory as it was;
- reference: the numba backend's outputs within 1e-3 of the reference backend's (numpy, graphir.backends.reference);
- graph: graphir's graph of the model is llama.cpp's own (``graphir diff M llama.cpp:M``), in every phase;
- experts (mixture-of-experts rows): each token's chosen experts and their weights are llama.cpp's, layer by layer;
- snapshot: the family has golden graphs (tests/test_graphs.py).

Adding a family to CI is adding a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from conftest import assert_llama_logits as assert_logits
from conftest import make_tiny_preset, oracle_is_exact, process_folder, write_model_gguf
from test_embd_input import rows_between_text
from test_families import LlamaCpp, failing_second_ubatch_changes_nothing, interleaved_against_llama_cpp

import llama_made
from graphir.model.meta import from_preset
from graphir.model.presets import Preset, all_presets
from graphir.batch import Batch
from graphir.memory.layers import kinds_of
from graphir.running.runtime import Model, load

Q = gguf.GGMLQuantizationType
SNAPSHOTS = Path(__file__).parent.parent / "snapshots" / "test_graphs"


@dataclass(frozen=True)
class Row:
    """One tiny model: its architecture, who makes it, and the keys it is made with."""

    arch: str
    variant: str = ""  # tells two rows of one architecture apart ("moe")
    made_by: str = "llama.cpp"  # or "graphir": a family llama.cpp cannot save
    moe: bool = False
    keys: dict[str, Any] = field(default_factory=dict)
    # Where graphir on llama.cpp's AVX2 path is not yet bit for bit llama.cpp's on this row's model: the largest
    # logit difference measured there, which the row is then held to on that path (0: bit for bit everywhere)
    avx2_apart: float = 0.0
    # The same for one scenario only, where the logits are bit for bit there but the scenario's values are not:
    # "states" (the recurrent states after the prompt), "rows" (logits after embedding rows)
    avx2_apart_in: dict[str, float] = field(default_factory=dict)
    # The sequences scenario's ubatch size: smaller where llama.cpp's graph mixes the sequences of a ubatch that
    # holds several tokens of several sequences (every ubatch then has one sequence or one token of each)
    seq_ubatch: int = 5
    # Where llama.cpp's own logits move with how a prompt is split into ubatches (its products sum in another order
    # for one token than for several, and the row's model turns that rounding into more: say how at the row), the
    # split scenarios compare each split with llama.cpp's own of that split, bit for bit, instead of with each other
    split_moves: bool = False

    @property
    def id(self) -> str:
        return f"{self.arch}-{self.variant}" if self.variant else self.arch


ROWS = [
    Row("bert", made_by="graphir"),
    Row("nomic-bert", made_by="graphir"),
    Row("t5encoder"),
    Row("t5", made_by="graphir"),  # llama.cpp's saver has no T5
    Row("deepseek2", "moe", moe=True),  # llama.cpp builds it with experts only
    Row("gpt2"),
    Row("rwkv6"),
    Row("qwen35", avx2_apart_in={"states": 1e-9}),  # AVX2: states 1.75e-10 apart
    Row("llama"),
    Row("llama", "moe", moe=True),
    Row("qwen2"),
    Row("qwen3"),
    Row("qwen3moe", moe=True),
    # every layer chooses layer 0's two experts; layer 1 sums the first only (a per-layer expert_used_count)
    # (llama.cpp's saver writes one count: graphir writes the file)
    Row("qwen3moe", "used-per-layer", made_by="graphir", moe=True, keys={"qwen3moe.expert_used_count": [2, 1]}),
    Row("smollm3", keys={"n_layer": 4}),  # its fourth layer attends without positions
    Row("phi3"),
    Row("gemma2", keys={"gemma2.attention.sliding_window": 4}),  # a window the prompt outgrows
    Row("gemma3", keys={"gemma3.attention.sliding_window": 4}),
    Row("gemma"),
    Row("command-r"),
    Row("gpt-oss", moe=True),
    # on the AVX2 path these three are within 3e-8 of llama.cpp (decode steps; the MoE hybrid's attention), not
    # yet found where; bit for bit on the AVX-512 path
    Row("mamba", avx2_apart=1e-7),
    Row("mamba2", avx2_apart=1e-7),
    Row("granitehybrid", avx2_apart_in={"states": 1e-8}),  # AVX2: states 3.7e-9 apart
    Row("granitehybrid", "moe", moe=True, avx2_apart=1e-7),
    # pre-norm decoders of llama.cpp's own files (graphir.model.prenorm)
    Row("arcee"),
    Row("ernie4_5"),
    Row("exaone"),
    Row("xverse"),
    Row("orion"),
    Row("internlm2"),
    Row("qwen"),
    Row("seed_oss"),
    Row("pangu-embedded"),
    Row("pangu-embedded", "longrope", keys={"pangu-embedded.rope.scaling.type": "longrope"}),  # factors unread
    Row("maincoder"),
    Row("hunyuan-dense"),
    Row("hunyuan-dense", "alpha", keys={"hunyuan-dense.rope.scaling.alpha": 1000.0}),  # NTK-aware RoPE base
    Row("mistral3"),
    Row("mistral3", "moe", moe=True),  # every FFN a mixture of experts
    Row("mistral3", "longrope", keys={"mistral3.rope.scaling.type": "longrope"}),  # the short factors (64 cells)
    Row("mistral3", "temperature", keys={"mistral3.attention.temperature_scale": 0.1,  # Llama 4's, rising
                                         "mistral3.rope.scaling.original_context_length": 4}),  # every 4 tokens
    Row("mistral3", "yarn", keys={f"mistral3.rope.scaling.{k}": v for k, v in (  # Ministral 3's YaRN keys
        ("type", "yarn"), ("factor", 4.0), ("original_context_length", 64), ("yarn_beta_fast", 16.0),
        ("yarn_beta_slow", 2.0), ("yarn_log_multiplier", 2.0))}),
    Row("baichuan"),  # a depth of neither released model: no positions at all
    Row("baichuan", "7b", keys={"n_layer": 32}),  # RoPE
    Row("baichuan", "13b", keys={"n_layer": 40}),  # ALiBi
    # dense decoders: Granite's multipliers (MiniCPM's graph), MLA over a plain cache, per-layer sizes, loops, xIELU
    Row("granite"),
    Row("granite", "moe", moe=True),
    Row("granitemoe", moe=True),  # Granite's graph, RoPE'd whatever rope.scaling.finetuned says
    Row("minicpm"),
    Row("minicpm3"),  # every value of a head RoPE'd (llama.cpp's own test's sizes)
    Row("minicpm3", "nope", keys={"minicpm3.rope.dimension_count": 64}),  # 64 values without positions, 64 with
    Row("plm"),
    Row("plm", "nope", keys={"plm.rope.dimension_count": 64}),
    Row("deci"),
    # attending (one KV head), linear-attention, FFN-free, attention-free and attending layers
    Row("deci", "layers", keys={"n_layer": 5, "deci.attention.head_count": [2, 2, 2, 0, 2],
                                "deci.attention.head_count_kv": [1, 0, 1, 0, 1],
                                "deci.feed_forward_length": [384, 384, 0, 256, 384]}),
    Row("openelm"),
    Row("openelm", "layers", keys={"openelm.attention.head_count": [2, 4], "openelm.attention.head_count_kv": [1, 1],
                                   "openelm.attention.key_length": 64, "openelm.attention.value_length": 64,
                                   "openelm.rope.dimension_count": 64, "openelm.feed_forward_length": [256, 384]}),
    Row("nanbeige"),
    # two passes through the stack (llama.cpp's saver writes a looped model's logical layers, which it cannot load)
    Row("nanbeige", "loops", made_by="graphir", keys={"nanbeige.num_loops": 2, "nanbeige.block_count": 1}),
    Row("nanbeige", "loops-unnormed", made_by="graphir",
        keys={"nanbeige.num_loops": 3, "nanbeige.skip_loop_final_norm": True}),
    Row("bitnet", made_by="graphir"),  # llama.cpp's saver has no BitNet; its weight scales in the file
    # llama.cpp's saver has no Apertus; each layer's xIELU its own, the second's alpha_p past softplus's 20
    Row("apertus", made_by="graphir", keys={"xielu.alpha_n": [0.8, -1.5], "xielu.alpha_p": [0.8, 21.0],
                                            "xielu.beta": [0.5, 0.25], "xielu.eps": [-1e-6, 1e-7]}),
    # mixtures of experts: sigmoid and softmax routing, shared experts, leading dense layers
    Row("glm4moe", moe=True),  # the M-RoPE sections every tiny model is given: GLM-4.5V's text form
    Row("glm4moe", "rope", moe=True, keys={"glm4moe.rope.dimension_sections": [0, 0, 0, 0]}),  # GLM-4.5's
    Row("qwen2moe", moe=True),
    Row("minimax-m2", moe=True),
    Row("olmoe", moe=True),
    Row("ernie4_5-moe", moe=True),  # its second layer, the last of a step of 2, routes
    Row("dbrx", moe=True, keys={"dbrx.attention.clamp_kqv": 0.001}),  # a bound the tiny model's QKV passes
    Row("deepseek", moe=True),
    Row("dots1", moe=True),
    Row("bailingmoe", moe=True),
    Row("bailingmoe2", moe=True),
    Row("hunyuan-moe", moe=True),
    Row("phimoe", moe=True),
    Row("hy_v3", moe=True),
    # mixture-of-experts families, second group (issue 39)
    Row("llama4", moe=True, keys={"n_layer": 4}),  # its fourth layer attends without positions
    Row("qwen35moe", moe=True, avx2_apart_in={"states": 1e-9, "rows": 1e-7}),  # AVX2: 1.75e-10, 3e-8
    Row("mistral4", moe=True),
    Row("grok", moe=True),
    Row("arctic", moe=True),
    Row("smallthinker", moe=True),
    Row("maple", moe=True),
    Row("mellum", moe=True),
    Row("exaone-moe", moe=True),
    Row("laguna", moe=True),
    Row("mimo2", moe=True),
    # Granite's sliding-window form: sinks, a window the prompt outgrows on odd layers; fused gate/up stacks
    Row("granite_swa", keys={"granite_swa.attention.sliding_window": 4}),
    # GroveMoE: 4 experts in groups of 2, so the adjugate mixture's ids are the chosen experts' halved
    Row("grovemoe", moe=True, keys={"grovemoe.expert_count": 4, "grovemoe.experts_per_group": 2,
                                    "grovemoe.expert_group_scale": 0.5}),
    Row("grovemoe", "ungrouped", moe=True, keys={"grovemoe.expert_count": 3, "grovemoe.expert_used_count": 3}),
    # layer 0 dense and roped, 1-3 sliding over a window the prompt outgrows, 4 global without positions
    Row("cohere2moe", moe=True, keys={"n_layer": 5, "cohere2moe.attention.sliding_window": 4}),
    Row("cohere2moe", "layernorm", moe=True, keys={"cohere2moe.attention.layer_norm_rms_epsilon": 0.0}),
    # AFMoE: layers 0-3 of four, the fourth without positions; a window the prompt outgrows on the sliding ones,
    # which rotate at their own base
    Row("afmoe", moe=True, keys={"n_layer": 4, "afmoe.attention.sliding_window": 4, "afmoe.rope.freq_base_swa": 500.0}),
    Row("granite_swa", "moe", moe=True, keys={"granite_swa.attention.sliding_window": 4,
                                              "granite_swa.attention.rope_pattern": [1, 0]}),  # layer 1 without RoPE
    # llama.cpp's saver has no Step-3.5: a global layer, three sliding ones with their own RoPE base and more heads
    Row("step35", made_by="graphir", moe=True, keys={"step35.rope.freq_base_swa": 500.0}),
    # issue 40: every layer attention and Mamba-2 at once (both needs of one layer, in the hybrid memory's two parts)
    Row("falcon-h1", avx2_apart_in={"states": 1e-8}),  # AVX2: states 1.9e-9 apart
    # issue 40: Nemotron-H's attention, Mamba-2 and FFN-only layers (an FFN layer keeps nothing in the hybrid memory);
    # its experts' weights normalised and scaled; in a latent space narrower than the model with the last layer
    # using one of its experts (llama.cpp's saver writes neither the latent size nor per-layer counts: graphir writes
    # that file, tests/conftest.py's TINY_FAMILY)
    Row("nemotron_h", avx2_apart_in={"states": 1e-8}),  # AVX2: states 3.7e-9 apart
    Row("nemotron_h_moe", moe=True, avx2_apart_in={"states": 1e-8}, keys={"nemotron_h_moe.expert_weights_norm": True,
                                         "nemotron_h_moe.expert_weights_scale": 2.5}),
    Row("nemotron_h_moe", "latent", made_by="graphir", moe=True, avx2_apart=2e-6),
    # Jamba: attention (layer 0) and Mamba with dt, B and C norms (layer 1), dense SwiGLUs or experts in every layer
    Row("jamba", avx2_apart=1e-7),
    Row("jamba", "moe", moe=True, avx2_apart_in={"states": 2e-8}),  # AVX2: states 7.5e-9 apart
    # a draft layer, loaded and left out
    Row("nemotron_h_moe", "nextn", made_by="graphir", moe=True, avx2_apart=2e-6, keys={
        "nemotron_h_moe.nextn_predict_layers": 1, "nemotron_h_moe.block_count": 4,
        "nemotron_h_moe.attention.head_count_kv": [2, 0, 2, 2], "nemotron_h_moe.feed_forward_length": [0, 0, 128, 128],
        "nemotron_h_moe.expert_used_count": [2, 2, 1, 2]}),
    # issue 38, ALiBi and the rest
    Row("refact"),
    Row("bloom"),
    Row("starcoder"),
    Row("starcoder2"),
    Row("cohere2", keys={"cohere2.attention.sliding_window": 4}),  # a window the prompt outgrows
    Row("olmo2"),
    Row("olmo2", "olmo3", keys={"olmo2.attention.sliding_window": 4}),  # OLMo 3's window
    Row("gptneox", keys={"gptneox.use_parallel_residual": True, "gptneox.rope.dimension_count": 16}),
    Row("gptneox", "sequential", keys={"gptneox.use_parallel_residual": False}),
    Row("phi2", keys={"phi2.rope.dimension_count": 16}),
    Row("falcon"),
    Row("stablelm", keys={"stablelm.rope.dimension_count": 32}),
    Row("chatglm", keys={"chatglm.rope.dimension_count": 64}),
    Row("codeshell"),
    Row("jais2"),
    Row("nemotron", keys={"nemotron.rope.dimension_count": 64}),  # RoPE over half of each head
    Row("olmo", keys={"olmo.attention.clamp_kqv": 0.3}),  # a bound its Q, K and V pass (llama.cpp's 1.0: none do)
    Row("plamo"),
    Row("jais"),
    Row("talkie"),
    # layer 0 slides over a window the prompt outgrows, rotating half its heads with its own base; heads per layer
    Row("spark2_5", keys={"spark2_5.attention.sliding_window": 4,
                          "spark2_5.attention.sliding_window_pattern": [True, False],
                          "spark2_5.rope.dimension_count_swa": 64, "spark2_5.rope.freq_base_swa": 500.0,
                          "spark2_5.attention.head_count": [2, 1], "spark2_5.attention.head_count_kv": [2, 1]}),
    # a window the prompt outgrows, a logit multiplier and a cap that bites
    Row("muse-glimmer", keys={"muse-glimmer.attention.sliding_window": 4, "muse-glimmer.logit_scale": 0.5,
                              "muse-glimmer.final_logit_softcapping": 3.0}),
    Row("plamo3", keys={"plamo3.attention.sliding_window": 0}),  # no window: every layer global
    # a window the prompt outgrows on the sliding layers, their own RoPE base, a head count per layer
    Row("plamo3", "swa", keys={"plamo3.attention.sliding_window": 4, "plamo3.rope.freq_base_swa": 500.0,
                               "plamo3.attention.head_count": [2, 1], "plamo3.attention.head_count_kv": [2, 1]}),
    Row("exaone4"),  # the 1.2B's form: every layer global and RoPE'd
    # the 32B's form (64 layers): the sliding layers (every other, as the tiny model's pattern says) rotate, over a
    # window the prompt outgrows
    # EXAONE 4.5's prediction layer after two: loaded, never run (llama.cpp cannot make a model it skips tensors of)
    Row("exaone4", "nextn", made_by="graphir", keys={"exaone4.nextn_predict_layers": 1, "exaone4.block_count": 3}),
    Row("exaone4", "32b", keys={"n_layer": 64, "n_embd": 64, "n_ff": 64, "exaone4.attention.sliding_window": 4}),
    Row("glm4", keys={"glm4.rope.dimension_sections": [0, 0, 0, 0], "glm4.rope.dimension_count": 64}),
    Row("glm4", "mrope"),  # llama.cpp's tiny model has RoPE sections: GLM-4.1V's text model
    # GLM-OCR's multi-token-prediction layer after two: llama.cpp cannot make a model whose loader skips tensors
    Row("glm4", "nextn", made_by="graphir", keys={"glm4.nextn_predict_layers": 1, "glm4.block_count": 3}),
    Row("mpt", keys={"mpt.attention.clamp_kqv": 0.3}),  # ALiBi, a position table, AWQ's scales, a clamp that bites
    # short convolutions beside attention (issue 40): llama.cpp's tiny models slide, a form graphir refuses
    Row("lfm2", keys={"lfm2.attention.sliding_window": 0}),
    Row("lfm2moe", moe=True, keys={"lfm2moe.attention.sliding_window": 0}),
    # gated DeltaNet and Mamba-2-like hybrids (issue 40)
    Row("qwen3next", moe=True, avx2_apart=1e-7),
    # twice the value heads of key heads: each key head's q and k repeated in place for its two value heads
    Row("qwen3next", "heads", moe=True, avx2_apart=1e-7,
        keys={"qwen3next.ssm.time_step_rank": 4, "qwen3next.ssm.inner_size": 512}),
    # issue 40: Kimi Delta Attention (layer 1: q, k and v convolved apart, a decay per key channel) beside absorbed
    # MLA without positions (layer 0), the latent cache as the hybrid memory's attention part
    Row("kimi-linear", moe=True, avx2_apart=1e-7, avx2_apart_in={"states": 1e-8}),  # AVX2: 6e-8, 1.9e-9
    # Ling 3.0: the same composition with the safe gate, M-RoPE'd (its VL files' sections) and gated MLA with a
    # compressed query, clamped SwiGLUs in layer 1 (llama.cpp's own test's figures)
    Row("bailingmoe3", moe=True, avx2_apart=1e-7, avx2_apart_in={"states": 1e-8}),  # AVX2: 3e-8, 9.3e-10
    # and its text files' plain RoPE (no sections)
    Row("bailingmoe3", "rope", moe=True, avx2_apart=1e-7, avx2_apart_in={"states": 1e-8}, keys={"bailingmoe3.rope.dimension_sections": [0, 0, 0, 0]}),
    # linear-attention recurrent blocks (issue 40): QRWKV6's gated linear attention, k and v heads shared by two heads
    # (llama.cpp's saver writes RWKV6's time_first, which sends its graph to a tensor its loader never makes: graphir
    # writes the file); and with a k and v head per head
    Row("rwkv6qwen2", made_by="graphir"),
    Row("rwkv6qwen2", "heads", made_by="graphir", keys={"rwkv6qwen2.attention.head_count_kv": 4}),
    # sparse attention: MLA beside a lightning indexer's key cache (issue 40)
    Row("deepseek32", moe=True),
    # a top_k below the prompt's length: each token attends to the 4 keys its indexer scores best
    Row("deepseek32", "top_k", moe=True, keys={"deepseek32.attention.indexer.top_k": 4}),
    Row("glm-dsa", moe=True),
    # layer 1 runs no indexer: it attends over the keys layer 0 selected, and keeps no indexer keys
    Row("glm-dsa", "shared", moe=True, keys={"glm-dsa.attention.indexer.types": [1, 0]}),
    # PLaMo 2: layer 1 of 2 the state-space block (no K/V heads); llama.cpp's mixer reads another sequence's rows in
    # a ubatch of several tokens of several sequences (tests/test_plamo2.py), so the sequences scenario's ubatches
    # hold one sequence or one token of each
    Row("plamo2", seq_ubatch=3, avx2_apart=2e-7, avx2_apart_in={"states": 2e-8}),  # AVX2: 1.2e-7, 1.1e-8
    # LFM2 with a window the prompt outgrows: its attention layers slide, in the hybrid_iswa memory
    Row("lfm2", "swa", keys={"lfm2.attention.sliding_window": 4}),
    # RWKV-7 (issue 40): heads of 128 (llama.cpp's wkv7 is deterministic only for heads a multiple of its vector
    # step: tests/test_arch_rwkv7.py), and of 64, the released models'
    Row("rwkv7"),
    Row("rwkv7", "head64", keys={"rwkv7.wkv.head_size": 64}),
    Row("arwkv7"),
    # layers reading another layer's cache (issue 40); llama.cpp's saver has no Gemma 3n. Its two GELUs a layer read
    # ggml's table of halves (GGML_GELU_FP16) and its V is RMS-normalised into an f16 cache: a product one ulp
    # apart (one token's vec_dot, several tokens' tinyBLAS) can round to the next half there, and 22 layers make
    # that likely: llama.cpp's own last logits move by 1.3e-4 between n_ubatch 64 and 1 (5.2e-6 between 64 and 3)
    Row("gemma3n", made_by="graphir", split_moves=True),
    # Gemma 4 (issue 40; llama.cpp's saver writes neither its per-layer input width nor its shared layers: graphir
    # writes the files): sliding and global layers of different head sizes (a window the prompt outgrows), the global
    # ones through rope_freqs, layers 3-5 reading layers 1 and 2's caches, per-layer inputs, per-layer output scales;
    # and with experts beside the dense FFN (their fused gate and up, per-expert scales), without per-layer inputs: as
    # Gemma 3n's, its GELUs read ggml's f16 table, where products a rounding apart (one token's vec_dot, several
    # tokens' tinyBLAS) can fall into neighbouring entries, so llama.cpp's own logits move with the ubatch split
    Row("gemma4", made_by="graphir"),
    Row("gemma4", "moe", made_by="graphir", moe=True, split_moves=True,
        keys={"gemma4.embedding_length_per_layer_input": 0, "gemma4.expert_count": 4, "gemma4.expert_used_count": 2,
              "gemma4.expert_feed_forward_length": 32}),
    # encoders of llama.cpp's BERT graph (issue 41; its saver writes no token_embd for them: graphir writes the file)
    Row("jina-bert-v2", made_by="graphir"),  # ALiBi, Q/K LayerNorms, the second norm, a GELU-gated FFN
    Row("jina-bert-v3", made_by="graphir"),  # fused QKV with its bias, RoPE, a GELU MLP
    Row("nomic-bert-moe", made_by="graphir", moe=True),  # layer 1 of 2 a mixture of GELU experts
    # Gemma 3's layers both ways, the local ones through a symmetric window the prompt outgrows (2 either side)
    Row("gemma-embedding", keys={"gemma-embedding.attention.sliding_window": 4}),
    Row("modern-bert", made_by="graphir"),  # llama.cpp's saver writes no token_embd for it
    # pre-RMSNorm encoders with RoPE and SwiGLU (llama.cpp's saver writes no token_embd for them): NeoBERT's fused
    # QKV and [gate; up], grouped KV heads; EuroBERT's Q, K, V and gate apart
    Row("neo-bert", made_by="graphir"),
    Row("eurobert", made_by="graphir"),
    # Llama without a cache or an LM head, bidirectional (the converted, causal form: tests/test_encoders.py)
    Row("llama-embed", keys={"llama-embed.attention.causal": False}),
    Row("llama-embed", "moe", moe=True, keys={"llama-embed.attention.causal": False}),
    # vision-language text decoders (issue 41): M-RoPE sections, an image's rows entering through the batch
    Row("qwen2vl"),
    Row("qwen3vl"),
    Row("qwen3vl", "deepstack", keys={"qwen3vl.n_deepstack_layers": 1}),  # rows twice n_embd wide, layer 0 adds half
    Row("qwen3vlmoe", moe=True, keys={"qwen3vlmoe.n_deepstack_layers": 1}),
    Row("paddleocr"),
    Row("hunyuan_vl"),  # M-RoPE: llama.cpp's tiny model has sections
    Row("hunyuan_vl", "neox", keys={"hunyuan_vl.rope.dimension_sections": [0, 0, 0, 0]}),  # none: split halves
    Row("deepseek2-ocr", moe=True),
    Row("cogvlm"),  # rows take the vision expert's matrices
    # MiniMax-Text-01 (issue 40): lightning attention (layer 0, decays filled per ubatch) beside softmax attention
    Row("minimax-01", moe=True),
    # by the flags of attention.recurrent_layers: lightning in the last layer (its output rows, its slopes scaled to
    # 1e-5), softmax attention before it
    Row("minimax-01", "flags", moe=True, keys={"minimax-01.attention.recurrent_layers": [False, True]}),
    # diffusion decoders (issue 41): an LM head over tokens attending both ways, no cache
    Row("dream"),
    Row("llada"),  # Llama's layers; the attention-output and FFN biases and rope_freqs its loader takes, unread
    Row("llada-moe", moe=True, keys={"llada-moe.expert_count": 4}),  # 2 of 4 experts: weights not renormalised
    Row("rnd1", moe=True, keys={"rnd1.expert_count": 4}),  # 2 of 4 experts, their weights renormalised
]

_rng = np.random.default_rng(7)
PROMPT = _rng.integers(0, 128, 10).tolist()
SEQS = [_rng.integers(0, 128, n).tolist() for n in (6, 3, 8)]


def _arch(row: Row) -> Any:
    """The row's architecture from its metadata alone (no model is made to collect the table)."""
    import graphir.arch

    return graphir.arch.get(row.arch).from_metadata(row.id, _metadata(row))


def _metadata(row: Row) -> dict[str, Any]:
    return make_tiny_preset(row.arch, **row.keys).metadata() if row.made_by == "graphir" else \
        llama_made.metadata(row.arch, row.moe, **row.keys)


_KINDS: dict[str, str] = {}


def kind(row: Row) -> str:
    """What the row's architecture is: a decoder (an LM head read causally), an encoder (embeddings), an
    encoder-decoder (an encoder whose output a decoder's cross-attention reads), or a bidirectional decoder (an
    LM head over tokens that attend both ways without a cache: the diffusion models)."""
    if row.id not in _KINDS:
        arch = _arch(row)
        if arch.encoder_stack is not None:
            _KINDS[row.id] = "encoder-decoder"
        elif arch.hp.causal and arch.hp.pooling == "none":
            _KINDS[row.id] = "decoder"
        else:
            _KINDS[row.id] = "bidirectional decoder" if _has_lm_head(row) else "encoder"
    return _KINDS[row.id]


def _has_lm_head(row: Row) -> bool:
    """Whether the graph of the row's architecture has logits among its outputs (every tensor it may read
    declared, optional ones too)."""
    preset = Preset(row.arch, _metadata(row), tied=False, include=".*")
    return "logits" in from_preset(row.id, preset).build_graph().outputs


def rows(*kinds: str) -> Any:
    """The table as a parametrization, narrowed to the rows of the kinds a scenario applies to."""
    return pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS if kind(r) in kinds])


_PATHS: dict[tuple[str, Q], Path] = {}
_MODELS: dict[tuple[str, Q], Model] = {}


def _path(row: Row, dtype: Q) -> Path:
    """The row's model file of type ``dtype`` (made once per test session)."""
    if (row.id, dtype) not in _PATHS:
        folder = process_folder(f"conformance-{row.id}-")
        if dtype == Q.F32 and row.made_by == "graphir":
            path = write_model_gguf(folder / "F32.gguf", make_tiny_preset(row.arch, **row.keys))
        elif dtype == Q.F32:
            path = llama_made.make(folder / "F32.gguf", row.arch, moe=row.moe, **row.keys)
        else:  # llama.cpp's own quantizer, whoever made the F32 file
            path = llama_made.quantize(_path(row, Q.F32), folder / f"{dtype.name}.gguf", dtype.name)
        _PATHS[row.id, dtype] = path
    return _PATHS[row.id, dtype]


def _model(row: Row, dtype: Q) -> Model:
    if (row.id, dtype) not in _MODELS:
        _MODELS[row.id, dtype] = load(str(_path(row, dtype)))
    return _MODELS[row.id, dtype]


# ---- the scenarios ---------------------------------------------------------------------------------------


def begin(row: Row, ctx: Any, o: LlamaCpp) -> list[int]:
    """The tokens a row's model is given to decode first, in both engines: the prompt, or for an
    encoder-decoder the prompt encoded in both and the decoder's first few tokens."""
    if kind(row) != "encoder-decoder":
        return PROMPT
    ctx.encode(Batch.from_tokens(PROMPT, 0))
    o.encode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
    return [_arch(row).decoder_start() or 0, *PROMPT[:3]]


def assert_as_llama_cpps(row: Row, ours: np.ndarray, ref: np.ndarray, what: str, scenario: str = "") -> None:
    """llama.cpp's values (conftest's assert_llama_logits), or within the row's measured gap on the AVX2 path (the
    scenario's own where the row states one)."""
    from graphir.backends.numba.primitives.isa import numerics

    apart = row.avx2_apart_in.get(scenario, row.avx2_apart)
    if apart and numerics().path.name == "avx2" and oracle_is_exact():
        assert float(np.abs(np.asarray(ours, np.float32) - ref).max()) <= apart, what
    else:
        assert_logits(ours, ref, what)


@pytest.mark.oracle
@rows("decoder", "encoder-decoder")
def test_logits_equal_llama_cpps_at_every_position_and_step(row: Row) -> None:
    m, path = _model(row, Q.F32), _path(row, Q.F32)
    ctx, o = m.new_context(n_ctx=64), LlamaCpp(path, n_ctx=64)
    try:
        prompt = begin(row, ctx, o)
        ctx.decode(Batch.from_tokens(prompt, 0, outputs="all"))
        o.decode(prompt, range(len(prompt)), [0] * len(prompt))
        theirs = np.stack([o.logits_ith(i) for i in range(len(prompt))])
        assert_as_llama_cpps(row, ctx.logits(), theirs, "prompt logits")
        for p in range(len(prompt), len(prompt) + 4):
            token = int(np.argmax(o.logits_ith(-1)))
            ctx.decode(Batch.one(token, p))
            o.decode([token], [p], [0])
            assert_as_llama_cpps(row, ctx.logits_ith(-1), o.logits_ith(0), f"step {p}")
    finally:
        o.close()


@pytest.mark.oracle
@rows("encoder")
def test_token_embeddings_equal_llama_cpps(row: Row) -> None:
    m, path = _model(row, Q.F32), _path(row, Q.F32)
    ctx = m.new_context(n_ctx=64, pooling="none", embeddings=True)
    ctx.decode(Batch.from_tokens(PROMPT, 0, outputs="all"))
    o = LlamaCpp(path, n_ctx=64, pooling="none")
    try:
        o.encode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
        ours = ctx.embeddings()
        theirs = np.stack([o.embeddings_ith(i) for i in range(len(PROMPT))])
        assert np.abs(ours - theirs).max() <= 1e-3
    finally:
        o.close()


@pytest.mark.oracle
@pytest.mark.parametrize("dtype", [Q.F16, Q.Q8_0], ids=["F16", "Q8_0"])
@rows("decoder", "encoder-decoder")
def test_greedy_tokens_are_llama_cpps(row: Row, dtype: Q) -> None:
    """Each engine chooses its own next token eight times over (the weights as llama.cpp quantized them)."""
    ctx, o = _model(row, dtype).new_context(n_ctx=64), LlamaCpp(_path(row, dtype), n_ctx=64)
    try:
        prompt = begin(row, ctx, o)
        ctx.decode(Batch.from_tokens(prompt, 0))
        o.decode(prompt, range(len(prompt)), [0] * len(prompt))
        ours, theirs = [], []
        for p in range(len(prompt), len(prompt) + 8):
            ours.append(int(np.argmax(ctx.logits_ith(-1))))
            theirs.append(int(np.argmax(o.logits_ith(-1))))
            ctx.decode(Batch.one(ours[-1], p))
            o.decode([theirs[-1]], [p], [0])
        assert ours == theirs
    finally:
        o.close()


# the diffusion example's mask token, standing at the end of the sequence it refines (the tiny vocabulary's last)
MASK = 127
N_MASKED = 4


def unmask(decode: Any) -> list[int]:
    """llama.cpp's diffusion example in its simplest order: the prompt and masked positions after it decoded whole,
    every position's logits out (``decode`` returns them), then the first masked position takes its most likely
    token, until none is left; the sequence refined."""
    seq = PROMPT + [MASK] * N_MASKED
    for at in range(len(PROMPT), len(seq)):
        seq[at] = int(np.argmax(decode(seq)[at]))
    return seq


@pytest.mark.oracle
@rows("bidirectional decoder")
def test_a_masked_sequence_refines_through_llama_cpps_logits(row: Row) -> None:
    """Every step's logits at every position are llama.cpp's; both fill in llama.cpp's choice."""
    ctx, o = _model(row, Q.F32).new_context(n_ctx=64), LlamaCpp(_path(row, Q.F32), n_ctx=64)

    def theirs(seq: list[int]) -> np.ndarray:
        ctx.decode(Batch.from_tokens(seq, 0, outputs="all"))
        o.decode(seq, range(len(seq)), [0] * len(seq))
        logits = np.stack([o.logits_ith(i) for i in range(len(seq))])
        assert_as_llama_cpps(row, ctx.logits(), logits, f"{seq.count(MASK)} masked")
        return logits

    try:
        unmask(theirs)
    finally:
        o.close()


@pytest.mark.oracle
@pytest.mark.parametrize("dtype", [Q.F16, Q.Q8_0], ids=["F16", "Q8_0"])
@rows("bidirectional decoder")
def test_each_engine_refines_a_masked_sequence_to_llama_cpps_tokens(row: Row, dtype: Q) -> None:
    """Each engine fills the masked positions with its own choices (the weights as llama.cpp quantized them)."""
    ctx, o = _model(row, dtype).new_context(n_ctx=64), LlamaCpp(_path(row, dtype), n_ctx=64)

    def ours(seq: list[int]) -> np.ndarray:
        ctx.decode(Batch.from_tokens(seq, 0, outputs="all"))
        return ctx.logits()

    def theirs(seq: list[int]) -> np.ndarray:
        o.decode(seq, range(len(seq)), [0] * len(seq))
        return np.stack([o.logits_ith(i) for i in range(len(seq))])

    try:
        assert unmask(ours) == unmask(theirs)
    finally:
        o.close()


@rows("bidirectional decoder")
def test_a_batch_beyond_one_ubatch_is_refused_and_the_outputs_stay(row: Row) -> None:
    """Without a cache a token attends to its ubatch only, so a batch must be one ubatch (llama.cpp asserts
    n_ubatch >= n_tokens): one line naming the cause, the last outputs as they were."""
    from graphir.errors import BatchError

    ctx = _model(row, Q.F32).new_context(n_ctx=64, n_ubatch=4)
    ctx.decode(Batch.from_tokens(PROMPT[:4], 0, outputs="all"))
    before = ctx.logits().copy()
    with pytest.raises(BatchError, match="n_ubatch=4"):
        ctx.decode(Batch.from_tokens(PROMPT, 0, outputs="all"))
    assert ctx.logits().tobytes() == before.tobytes()


@rows("decoder")
def test_logits_do_not_depend_on_how_the_prompt_is_split(row: Row) -> None:
    if row.split_moves:
        return each_split_is_llama_cpps(row)
    m = _model(row, Q.F32)
    last = []
    for n_ubatch in (64, 3, 1):
        ctx = m.new_context(n_ctx=64, n_ubatch=n_ubatch)
        ctx.decode(Batch.from_tokens(PROMPT, 0))
        last.append(ctx.logits_ith(-1).copy())
    one_by_one = m.new_context(n_ctx=64)
    for p, t in enumerate(PROMPT):
        one_by_one.decode(Batch.one(t, p))
    last.append(one_by_one.logits_ith(-1))
    for other in last[1:]:
        assert np.abs(other - last[0]).max() <= 1e-5


def each_split_is_llama_cpps(row: Row) -> None:
    """A prompt in one ubatch, in ubatches of 3 and of 1: every position's logits llama.cpp's for the same split."""
    m, path = _model(row, Q.F32), _path(row, Q.F32)
    for n_ubatch in (64, 3, 1):
        ctx, o = m.new_context(n_ctx=64, n_ubatch=n_ubatch), LlamaCpp(path, n_ctx=64, n_ubatch=n_ubatch)
        try:
            ctx.decode(Batch.from_tokens(PROMPT, 0, outputs="all"))
            o.decode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
            assert_logits(ctx.logits(), np.stack([o.logits_ith(i) for i in range(len(PROMPT))]), f"n_ubatch {n_ubatch}")
        finally:
            o.close()


@pytest.mark.oracle
@rows("decoder", "bidirectional decoder")
def test_sequences_in_one_batch_equal_llama_cpps_and_each_alone(row: Row) -> None:
    # without a cache the batch is one ubatch
    n_ubatch = row.seq_ubatch if kind(row) == "decoder" else sum(map(len, SEQS))
    interleaved_against_llama_cpp(_model(row, Q.F32), _path(row, Q.F32), SEQS, n_ubatch=n_ubatch,
                                  alone_moves=row.split_moves)


@rows("decoder")
def test_a_saved_state_loaded_elsewhere_continues_bit_for_bit(row: Row) -> None:
    m = _model(row, Q.F32)
    ctx = m.new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT, 0))
    saved = ctx.state_save()
    other = m.new_context(n_ctx=64)
    other.state_load(saved)
    for c in (ctx, other):
        c.decode(Batch.one(PROMPT[0], len(PROMPT)))
    assert other.logits_ith(-1).tobytes() == ctx.logits_ith(-1).tobytes()


@rows("decoder")
def test_a_failing_ubatch_changes_nothing(row: Row, monkeypatch: pytest.MonkeyPatch) -> None:
    failing_second_ubatch_changes_nothing(_model(row, Q.F32), PROMPT, monkeypatch)


def outputs(row: Row, backend: str) -> list[np.ndarray]:
    """What the row's model computes on one backend (float32 caches): an encoder's token embeddings; a decoder's
    logits of the prompt, then of two steps (an encoder-decoder's encoder output first)."""
    ctx = load(str(_path(row, Q.F32)), backend=backend).new_context(n_ctx=64, type_k="f32", type_v="f32",
                                                                    embeddings=kind(row) == "encoder")
    got = []
    if kind(row) == "encoder-decoder":
        ctx.encode(Batch.from_tokens(PROMPT, 0))
        got.append(ctx.encoder_embeddings().copy())
    prompt = PROMPT if kind(row) != "encoder-decoder" else [_arch(row).decoder_start() or 0, *PROMPT[:3]]
    ctx.decode(Batch.from_tokens(prompt, 0, outputs="all"))
    if kind(row) == "encoder":
        return [ctx.embeddings().copy()]
    got.append(ctx.logits().copy())
    for p, token in enumerate(PROMPT[:2], len(prompt)):
        ctx.decode(Batch.one(token, p))
        got.append(ctx.logits().copy())
    return got


@rows("decoder", "encoder", "encoder-decoder", "bidirectional decoder")
def test_the_numba_backend_equals_the_reference_backend(row: Row) -> None:
    """The numpy reference (graphir.backends.reference) computes the same real numbers in its own float order."""
    ours, ref = outputs(row, "numba"), outputs(row, "reference")
    assert len(ours) == len(ref) >= 1
    for a, b in zip(ours, ref):
        assert a.shape == b.shape and np.isfinite(b).all()
        assert float(np.abs(a - b).max()) <= 1e-3


def llama_cpp_recurrent_rows(o: LlamaCpp, seq: int, layers: list[int]) -> dict[str, np.ndarray]:
    """The rows llama.cpp's recurrent memory keeps for one sequence, by graphir's buffer name (``blk.0.rs_r``,
    ``blk.0.rs_s``), read from its saved state of the sequence's recurrent part (llama_state_seq_get_data_ext with
    LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: a hybrid memory leaves its attention part out; then
    llama_memory_recurrent::state_write: the cells' positions and sequence counts, then per layer of ``layers``
    (those with a recurrent part) the r rows, then per such layer the s rows, each as type and row size before the
    data)."""
    import ctypes

    flags = o.lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
    size = o.lib.llama_state_seq_get_size_ext(o.ctx.ctx, seq, flags)
    buf = (ctypes.c_uint8 * size)()
    assert o.lib.llama_state_seq_get_data_ext(o.ctx.ctx, buf, size, seq, flags) == size
    data, at = bytes(buf), 0

    def take(fmt: str) -> Any:
        nonlocal at
        (v,) = np.frombuffer(data, fmt, 1, at)
        at += np.dtype(fmt).itemsize
        return int(v)

    take("<u4")  # llama_context's io_magic
    assert take("<i4") == seq
    n_cells = take("<u4")
    for _ in range(n_cells):
        take("<i4")
        assert take("<u4") == 0  # one sequence's state: no sequence ids listed
    assert take("<u4") == 0  # s_trans
    take("<u4")  # n_layer: every layer's, though only those with a recurrent part follow
    rows = {}
    for role in ("rs_r", "rs_s"):
        for il in layers:
            assert take("<i4") == 0  # GGML_TYPE_F32
            n = take("<u8") * n_cells
            rows[f"blk.{il}.{role}"] = np.frombuffer(data, np.float32, n // 4, at).reshape(n_cells, -1)
            at += n
    assert at == size
    return rows


# memories whose saved recurrent part llama.cpp writes alone (its hybrid_iswa memory writes its attention part too)
PARTIAL_STATES = ("recurrent", "hybrid")


@pytest.mark.oracle
@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS if _arch(r).contexts[0] in PARTIAL_STATES])
def test_the_recurrent_state_after_the_prompt_is_llama_cpps(row: Row) -> None:
    """Every recurrent layer's rolling and recurrent state of the sequence (a hybrid's too), as llama.cpp saves it
    after the same prompt."""
    ctx, o = _model(row, Q.F32).new_context(n_ctx=64), LlamaCpp(_path(row, Q.F32), n_ctx=64)
    try:
        ctx.decode(Batch.from_tokens(PROMPT, 0))
        o.decode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
        layers = [il for il, need in enumerate(_arch(row).needs) if "recurrent" in kinds_of((need,))]
        theirs = llama_cpp_recurrent_rows(o, 0, layers)
    finally:
        o.close()
    parts = getattr(ctx.memory, "parts", {"": ctx.memory}).values()  # a hybrid's recurrent part holds the states
    recurrent = next(p for p in parts if any(".rs_" in name for name in p.buffers()))
    (cell,) = np.flatnonzero(recurrent.seq & np.uint64(1))
    ours = recurrent.buffers()
    assert set(ours) == set(theirs)
    for name, rows in theirs.items():
        assert_as_llama_cpps(row, ours[name][cell], rows[0], name, "states")


@pytest.mark.same_on_every_path
@pytest.mark.oracle
@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_the_graph_is_llama_cpps_own(row: Row) -> None:
    from graphir.llamacpp.compare import agreement
    from graphir.model.meta import open_model

    phases = agreement(open_model(str(_path(row, Q.F32))))
    assert phases and all(first is None for first in phases.values()), phases


# the routing weights llama.cpp's build_moe_ffn names, in the order it makes them: the last one a layer has is what
# its experts' outputs are multiplied by
ROUTING_WEIGHTS = ("ffn_moe_weights", "ffn_moe_weights_softmax", "ffn_moe_weights_norm", "ffn_moe_weights_scaled")


@pytest.mark.oracle
@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS if r.moe])
def test_each_token_takes_llama_cpps_experts_with_its_weights(row: Row) -> None:
    """Every mixture-of-experts layer, node by node through llama.cpp's eval callback: each token's chosen experts
    (llama.cpp's ``ffn_moe_argsort``, best first) are graphir's ``ffn_moe_topk``, in the same order, and the weights
    its experts' outputs are multiplied by are llama.cpp's (a layer's first mixture where it has two). llama.cpp's
    last layer routes its output row only."""
    from llama_taps import llama_cpp_taps

    hp = _arch(row).hp
    T_ = len(PROMPT)
    taps: dict[str, np.ndarray] = {}
    _model(row, Q.F32).new_context(n_ctx=64).decode(Batch.from_tokens(PROMPT, 0, outputs="all"), taps=taps)
    theirs = llama_cpp_taps(str(_path(row, Q.F32)), PROMPT, ints=True, first=True)
    layers = [il for il in range(hp.n_layer) if f"ffn_moe_argsort-{il}" in theirs]
    assert layers, "llama.cpp routed no token"
    for il in layers:
        order = theirs[f"ffn_moe_argsort-{il}"].reshape(-1, hp.n_expert)
        rows, k = len(order), taps[f"blk.{il}.ffn_moe_topk"].size // T_  # the layer's count where it has its own
        chosen = taps[f"blk.{il}.ffn_moe_topk"].reshape(T_, k)[T_ - rows:]
        assert np.array_equal(chosen, order[:, :k]), f"layer {il}: experts {chosen.tolist()}, llama.cpp's {order[:, :k]}"
        name = [n for n in ROUTING_WEIGHTS if f"{n}-{il}" in theirs][-1]
        ours = taps[f"blk.{il}.{name}"].reshape(T_, k)[T_ - rows:]
        assert float(np.abs(ours - theirs[f"{name}-{il}"].reshape(rows, k)).max()) <= 1e-6, f"layer {il}: {name}"


@pytest.mark.oracle
@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS if r.made_by == "llama.cpp"
                                 and kind(r) == "decoder" and _arch(r).positions_per_token > 1])
def test_embedding_rows_with_positions_per_section_give_llama_cpps_logits(row: Row) -> None:
    """M-RoPE families: an image's rows between text, each with its time, row and column (test_embd_input)."""
    rows_between_text(_path(row, Q.F32), _model(row, Q.F32),
                      lambda ours, ref, what: assert_as_llama_cpps(row, ours, ref, what, "rows"))


def test_every_family_is_a_row() -> None:
    import graphir.arch

    assert {r.arch for r in ROWS} == set(graphir.arch.names())


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_the_family_has_golden_graphs(row: Row) -> None:
    presets = [name for name, p in all_presets().items() if p.arch == row.arch]
    assert any(next(SNAPSHOTS.glob(f"test_graph[[]{name}-*"), None) for name in presets), row.arch
