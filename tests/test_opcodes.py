"""The tape's opcode table is the one statement of its instructions: the recorder encodes a kernel's arguments
by it, and the player module is generated from it (never edited by hand)."""

from __future__ import annotations

import numpy as np

from graphir.backends.numba.kernels.rows import ADD, binary_kernel, move_rows
from graphir.backends.numba.tape import Tape
from graphir.backends.numba.tape.arrays import KINDS
from graphir.backends.numba.tape.opcodes import OPCODES, PLAYER_PATH, SCALARS, Op, player_source


def test_the_player_module_is_the_one_the_table_generates() -> None:
    """After a change of the table: python -m graphir.backends.numba.tape.opcodes writes the player again."""
    assert PLAYER_PATH.read_text() == player_source()


def test_every_argument_has_a_kind_the_player_reads() -> None:
    assert [o.name for o in OPCODES] == list(Op.__members__) and OPCODES[-1].name == "PLACE"
    for o in OPCODES:
        assert all(kind in KINDS or kind in SCALARS for kind in o.args), o.name
    assert player_source().count("call_at(at, (") == len(OPCODES) - 1     # a branch per kernel-calling opcode


def test_recording_encodes_the_arguments_as_the_table_declares_them() -> None:
    """record's code equals the words spelled by hand: arrays as table rows, a bool as 0/1, an int as itself;
    and an array not of its declared kind records nothing."""
    by_table, by_hand = Tape(16), Tape(16)
    src, dst, ids = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32), np.array([1, 0], np.int64)
    assert by_table.record(Op.MOVE, move_rows, (src, dst, ids, True))
    assert by_table.record(Op.BINARY, binary_kernel(src.size), (src, src, 1, dst, ADD))
    assert by_hand.emit(Op.MOVE, move_rows, (src, dst, ids, True),
                        (by_hand.ref("f2", src), by_hand.ref("f2", dst), by_hand.ref("i64", ids), 1))
    assert by_hand.emit(Op.BINARY, binary_kernel(src.size), (src, src, 1, dst, ADD),
                        (by_hand.ref("f2", src), by_hand.ref("f2", src), 1, by_hand.ref("f2", dst), ADD))
    assert by_table.code == by_hand.code and len(by_table.code) == OPCODES[Op.MOVE].words + OPCODES[Op.BINARY].words
    assert not by_table.record(Op.MOVE, move_rows, (src, dst, ids.astype(np.int32), True))
    by_table.segment()()
    assert dst.tolist() == [[2.0] * 4] * 2
