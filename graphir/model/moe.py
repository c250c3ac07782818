"""What every mixture-of-experts family reads and checks of its experts, as llama.cpp's loader does for all of them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError, TensorError
from graphir.model.hparams import HParams, Key
from graphir.model.tensors import TensorSpec, spec, tensor_name

if TYPE_CHECKING:
    from graphir.graph.ir import Node
    from graphir.model.builder import GraphBuilder

# Mixture-of-experts hparams as llama.cpp's loader reads them for every family (0: absent)
MOE_KEYS = (
    Key("n_expert", Keys.LLM.EXPERT_COUNT, int, 0, minimum=0),
    Key("n_expert_used", Keys.LLM.EXPERT_USED_COUNT, int, 0, minimum=0),
    Key("n_expert_groups", Keys.LLM.EXPERT_GROUP_COUNT, int, 0, minimum=0),
)


def check_experts(hp: HParams, arch: str, groups: bool = False) -> None:
    """llama.cpp's checks of the expert counts. ``groups``: the family routes group-limited (expert_group_count
    > 1, DeepSeek-V3: it reads ``hp.n_group_used``), which llama.cpp's checks of the groups then cover; the
    families that do not build it refuse such a file rather than route it differently."""
    key = lambda t: t.format(arch=arch)  # noqa: E731
    if hp.n_expert_used > hp.n_expert or (hp.n_expert and not hp.n_expert_used):
        raise MetadataError(f"{hp.n_expert} experts per layer ('{key(Keys.LLM.EXPERT_COUNT)}') of which "
                            f"{hp.n_expert_used} are used ('{key(Keys.LLM.EXPERT_USED_COUNT)}'): a token needs "
                            f"between 1 and all of them")
    if hp.n_expert_groups > 1 and not groups:
        raise MetadataError(f"'{key(Keys.LLM.EXPERT_GROUP_COUNT)}' = {hp.n_expert_groups}: group-limited expert "
                            f"routing is not built")
    n_groups, used = hp.n_expert_groups, getattr(hp, "n_group_used", 0) if groups else 0
    if (n_groups and n_groups >= max(hp.n_expert, 1)) or (n_groups > 1 and (hp.n_expert % n_groups
                                                                             or not 0 < used < n_groups)):
        raise MetadataError(f"{hp.n_expert} experts in {n_groups} groups ('{key(Keys.LLM.EXPERT_GROUP_COUNT)}') "
                            f"of which {used} are used ('{key(Keys.LLM.EXPERT_GROUP_USED_COUNT)}'): the groups "
                            f"must be fewer than the experts and divide them, and a token takes between 1 and all "
                            f"but one of them")


def gate_up_tensors(n_embd: int, n_ff: int, n_expert: int, il: int) -> list[TensorSpec]:
    """A layer's experts' gate and up stacks in either form llama.cpp's loader takes (``create_tensor_gate_up_exps``):
    one stack of both [n_embd, 2 n_ff, n_expert], or one each; all optional here, :func:`gate_up` needs a whole form."""
    return [spec(T.FFN_GATE_UP_EXP, (n_embd, 2 * n_ff, n_expert), il, optional=True),
            spec(T.FFN_GATE_EXP, (n_embd, n_ff, n_expert), il, optional=True),
            spec(T.FFN_UP_EXP, (n_embd, n_ff, n_expert), il, optional=True)]


def gate_up_problems(tensors: Mapping[str, Any], il: int) -> list[str]:
    """What layer il lacks of its experts' gate and up stacks (empty: the file has a whole form), one line each."""
    fused = tensor_name(T.FFN_GATE_UP_EXP, il)
    if fused in tensors:
        return []
    return [f"missing tensor '{tensor_name(t, il)}' (or '{fused}' of both stacks)"
            for t in (T.FFN_UP_EXP, T.FFN_GATE_EXP) if tensor_name(t, il) not in tensors]


def gate_up(b: GraphBuilder, il: int) -> dict[str, Node | None]:
    """Layer il's gate and up stacks as ``build_moe_ffn`` takes them, in the form the file holds: the fused stack
    when it is there, else the two (both required then, as llama.cpp's loader requires them)."""
    fused = b.w_opt(T.FFN_GATE_UP_EXP, il)
    if fused is not None:
        return {"gate_up_exps": fused, "gate_exps": None, "up_exps": None}
    problems = gate_up_problems(b.tensors, il)
    if problems:
        raise TensorError(f"{b.label}: {problems[0]}")
    return {"up_exps": b.w_opt(T.FFN_UP_EXP, il), "gate_exps": b.w_opt(T.FFN_GATE_EXP, il)}


def require_experts(hp: HParams, arch: str) -> None:
    """The checks of a family whose FFNs are mixtures of experts only: llama.cpp's loader refuses a file without
    any, then checks the counts (:func:`check_experts`)."""
    if not hp.n_expert:
        raise MetadataError(f"a '{arch}' model needs experts ('{Keys.LLM.EXPERT_COUNT.format(arch=arch)}' > 0)")
    check_experts(hp, arch)


def expert_tensors(n_embd: int, n_ff: int, n_expert: int, il: int) -> list[TensorSpec]:
    """A layer's router and its experts' gate, down and up stacks, all required."""
    E, F, X = n_embd, n_ff, n_expert
    return [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_GATE_EXP, (E, F, X), il), spec(T.FFN_DOWN_EXP, (F, E, X), il),
            spec(T.FFN_UP_EXP, (E, F, X), il)]


def shared_expert_tensors(n_embd: int, n_ff: int, il: int) -> list[TensorSpec]:
    """A layer's shared expert: gate, down and up of width ``n_ff``."""
    return [spec(T.FFN_GATE_SHEXP, (n_embd, n_ff), il), spec(T.FFN_DOWN_SHEXP, (n_ff, n_embd), il),
            spec(T.FFN_UP_SHEXP, (n_embd, n_ff), il)]


def experts(b: GraphBuilder, il: int) -> dict[str, Node | None]:
    """Layer il's router and expert stacks (:func:`expert_tensors`) as ``build_moe_ffn`` takes them."""
    return {"gate_inp": b.w(T.FFN_GATE_INP, il), "up_exps": b.w(T.FFN_UP_EXP, il),
            "gate_exps": b.w(T.FFN_GATE_EXP, il), "down_exps": b.w(T.FFN_DOWN_EXP, il)}


def shared_expert(b: GraphBuilder, x: Node, il: int, name: str = "ffn_shexp") -> Node:
    """Layer il's shared expert over x: a SwiGLU FFN without biases or scales."""
    return b.build_ffn(x, up=b.w(T.FFN_UP_SHEXP, il), gate=b.w(T.FFN_GATE_SHEXP, il), down=b.w(T.FFN_DOWN_SHEXP, il),
                       name=name)
