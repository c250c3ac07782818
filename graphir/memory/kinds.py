"""The memory kinds a context can be made with, by the name users pick them by: the only such table.

Adding a kind is one class (a :class:`graphir.memory.Memory` with ``kind`` set and ``for_context``) and one
entry here; contexts, graph dumps and the command line all read this table.
"""

from __future__ import annotations

from graphir.memory import Memory
from graphir.memory.kv import KVCache
from graphir.memory.none import NoMemory
from graphir.memory.recurrent import RecurrentMemory

KINDS: dict[str, type[Memory]] = {m.kind: m for m in (NoMemory, KVCache, RecurrentMemory)}
