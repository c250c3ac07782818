"""The registry of per-ubatch inputs: a graph's ruled inputs are found by role and filled from the ubatch."""

import numpy as np
import pytest

from graphir.batch import UBatch
from graphir.graph.ir import Graph, Node
from graphir.model import ubatch_inputs
from graphir.model.temperature import ROLE as TEMPERATURE
from graphir.model.temperature import Temperature


def _ubatch(pos: list[int]) -> UBatch:
    n = len(pos)
    return UBatch(np.zeros(n, np.int32), np.array(pos, np.int32), [(0,)] * n, np.arange(n, dtype=np.int32),
                  np.arange(n))


def _graph(*inputs: Node) -> Graph:
    return Graph({}, (), list(inputs), {})


def test_temperature_is_one_entry():
    rule = Temperature(4, 0.1, 0.0)
    node = Node(TEMPERATURE, "input", (), {"role": TEMPERATURE, **rule.facts()}, "f32", (1, 1, 3))
    ruled = ubatch_inputs.rules_of(_graph(node, Node("pos", "input", (), {"role": "pos"}, "i32", (3,))))
    assert [name for name, _, _ in ruled] == [TEMPERATURE]  # inputs without a rule are fed elsewhere
    ub = _ubatch([0, 5, 9])
    np.testing.assert_array_equal(ubatch_inputs.fill(ruled, ub)[TEMPERATURE], rule.factors(ub.pos))
    assert ubatch_inputs.fill(ruled, ub)[TEMPERATURE].ravel()[0] == 1.0 != rule.factors(ub.pos).ravel()[2]


def test_a_role_has_one_rule():
    with pytest.raises(ValueError, match=TEMPERATURE):
        ubatch_inputs.register(TEMPERATURE, lambda facts, ub: np.zeros(1, np.float32))
