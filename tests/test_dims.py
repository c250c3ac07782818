"""Specification of graphir.graph.dims: canonical symbolic sizes, their spelling, parsing, and the broadcast rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graphir.graph.dims import DimDecl, Sym, divides, numel, parse_dim

N = Sym.named("n_tokens")
KV = Sym.named("n_kv")
CTX = Sym.named("n_ctx")


# --------------------------------------------------------------------------- canonical forms


def test_scaling_a_symbol_from_either_side_gives_one_canonical_value():
    assert 64 * N == N * 64
    assert hash(64 * N) == hash(N * 64)


def test_scaled_symbol_prints_coefficient_first():
    assert str(N * 64) == "64*n_tokens"
    assert str(64 * N) == "64*n_tokens"


def test_symbol_plus_constant_prints_constant_last():
    assert str(N + 1) == "n_tokens+1"
    assert str(1 + N) == "n_tokens+1"


def test_symbol_minus_constant_prints_with_a_minus_sign():
    assert str(N - 3) == "n_tokens-3"


def test_product_of_two_symbols_is_ordered_by_name():
    assert KV * N == N * KV
    assert str(N * KV) == "n_kv*n_tokens"


def test_a_symbol_prints_by_its_own_name():
    assert str(N) == "n_tokens"
    assert repr(N) == "n_tokens"


def test_like_terms_are_collected():
    assert N + N == 2 * N
    assert str(N + 2 * N) == "3*n_tokens"


def test_cancelling_symbols_collapses_to_a_plain_int():
    d = (N + 3) - N
    assert d == 3
    assert type(d) is int


def test_multiplying_by_zero_collapses_to_int_zero():
    d = N * 0
    assert d == 0
    assert type(d) is int


def test_a_symbol_minus_itself_is_int_zero():
    d = N - N
    assert type(d) is int and d == 0


def test_a_sym_never_equals_an_int():
    assert N != 1
    assert (N + 0) == N


def test_symbols_are_the_names_in_the_polynomial():
    assert (64 * N * KV + CTX + 1).symbols == frozenset({"n_tokens", "n_kv", "n_ctx"})


def test_eval_binds_every_symbol():
    assert (64 * N + KV * N + 1).eval({"n_tokens": 3, "n_kv": 10}) == 64 * 3 + 30 + 1


# --------------------------------------------------------------------------- floor division


def test_floordiv_divides_every_coefficient_when_exact():
    assert (64 * N) // 64 == N
    assert (6 * N + 4) // 2 == 3 * N + 2


def test_floordiv_divides_coefficients_of_higher_degree_terms():
    assert (2 * N * N) // 2 == N * N


def test_floordiv_raises_when_a_coefficient_is_not_divisible():
    with pytest.raises(ValueError, match=r"64\*n_tokens\+1 is not divisible by 64"):
        (64 * N + 1) // 64


def test_floordiv_of_a_bare_symbol_by_more_than_one_raises():
    with pytest.raises(ValueError, match="n_tokens is not divisible by 2"):
        N // 2


# --------------------------------------------------------------------------- parse_dim


@pytest.mark.parametrize("text, expected", [
    ("576", 576),
    ("n_kv", KV),
    ("64*n_tokens", 64 * N),
    ("n_tokens+1", N + 1),
    ("n_tokens-1", N - 1),
    ("n_kv*n_tokens", KV * N),
    ("-3", -3),
])
def test_parse_dim_reads_the_printed_spellings(text, expected):
    assert parse_dim(text) == expected


def test_parse_dim_of_a_number_is_an_int():
    assert type(parse_dim("576")) is int


def test_parse_dim_accepts_non_canonical_order():
    assert parse_dim("n_tokens*64") == 64 * N
    assert parse_dim("1+n_tokens") == N + 1


def test_parse_dim_rejects_a_bad_factor():
    with pytest.raises(ValueError, match="bad dimension '64/n_tokens'"):
        parse_dim("64/n_tokens")


_NAMES = ("n_tokens", "n_kv", "n_ctx", "n_outputs")
_monomial = st.lists(st.sampled_from(_NAMES), max_size=3).map(lambda xs: tuple(sorted(xs)))
_poly = st.dictionaries(_monomial, st.integers(-300, 300), max_size=5)


@given(_poly)
def test_parse_dim_inverts_str_for_any_small_polynomial(acc):
    d = Sym.make(acc)
    assert parse_dim(str(d)) == d


@given(_poly)
def test_polynomials_built_by_arithmetic_equal_their_canonical_construction(acc):
    built = 0
    for mono, coeff in acc.items():
        term = coeff
        for name in mono:
            term = term * Sym.named(name)
        built = built + term
    assert built == Sym.make(acc)
    assert str(built) == str(Sym.make(acc))


# --------------------------------------------------------------------------- numel


def test_numel_of_a_fixed_shape_is_the_product():
    assert numel((576, 49152)) == 576 * 49152


def test_numel_of_a_symbolic_shape_is_a_polynomial():
    assert numel((64, 9, N)) == 576 * N


def test_numel_of_the_empty_shape_is_one():
    assert numel(()) == 1


def test_numel_multiplies_symbols_together():
    assert numel((KV, N, 9)) == 9 * KV * N


# --------------------------------------------------------------------------- divides (ggml_can_repeat)


def test_one_divides_anything():
    assert divides(1, 576)
    assert divides(1, N)


def test_a_dim_divides_itself():
    assert divides(N, N)
    assert divides(576, 576)


def test_an_int_divides_a_multiple():
    assert divides(3, 576)
    assert divides(192, 576)


def test_an_int_does_not_divide_a_non_multiple():
    assert not divides(5, 576)


def test_an_int_divides_a_polynomial_when_it_divides_every_coefficient():
    assert divides(64, 64 * N)
    assert divides(2, 2 * N + 4)


def test_an_int_does_not_divide_a_polynomial_with_a_coprime_coefficient():
    assert not divides(2, N)
    assert not divides(2, 2 * N + 1)


def test_a_symbol_is_not_known_to_divide_an_int():
    assert not divides(N, 576)


def test_a_symbol_is_not_known_to_divide_a_different_symbol():
    assert not divides(N, KV)


def test_zero_divides_only_itself():
    assert not divides(0, 576)


# --------------------------------------------------------------------------- DimDecl


def test_dimdecl_prints_an_unbounded_range_as_inf():
    assert str(DimDecl("n_tokens")) == "n_tokens in [1, inf]"


def test_dimdecl_prints_a_symbolic_upper_bound_by_name():
    assert str(DimDecl("n_kv", 1, CTX)) == "n_kv in [1, n_ctx]"


def test_dimdecl_prints_a_fixed_range():
    assert str(DimDecl("n_seq", 2, 64)) == "n_seq in [2, 64]"


def test_dimdecl_sym_is_the_named_symbol():
    assert DimDecl("n_kv").sym == KV


def test_dimdecls_compare_by_name_and_range_not_doc():
    assert DimDecl("n_kv", 1, CTX, "cells attended over") == DimDecl("n_kv", 1, CTX)
    assert DimDecl("n_kv", 1, CTX) != DimDecl("n_kv", 2, CTX)
