"""What every mixture-of-experts family reads and checks of its experts, as llama.cpp's loader does for all of them."""

from __future__ import annotations

from gguf import Keys

from graphir.errors import MetadataError
from graphir.model.hparams import HParams, Key

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
