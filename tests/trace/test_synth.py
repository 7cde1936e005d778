from hypothesis import given
from hypothesis import strategies as st

from replay.trace.synth import synth_text


@given(st.integers(0, 3000), st.integers(0, 2**31))
def test_synth_is_deterministic_with_one_word_per_token(tokens, seed):
    text = synth_text(tokens, seed)
    assert text == synth_text(tokens, seed)
    assert len(text.split()) == tokens
    assert text == text.strip()


@given(st.integers(1, 500), st.integers(1, 500), st.integers(0, 10**6))
def test_fewer_tokens_give_a_prefix(a, b, seed):
    short, long = sorted((a, b))
    assert synth_text(long, seed).split()[:short] == synth_text(short, seed).split()


def test_different_seeds_differ():
    assert synth_text(200, 1) != synth_text(200, 2)
