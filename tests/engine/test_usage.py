"""Usage normalisation: every server's names for the same few numbers."""

from __future__ import annotations

import pytest

from replay.engine.usage import Usage, parse_usage


def test_openai_without_cache_details_leaves_cache_unknown() -> None:
    u = parse_usage({"usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}})
    assert u == Usage(prompt_tokens=100, output_tokens=7)
    assert u.reprocessed_tokens is None and u.reprocessed_source is None


def test_openai_cached_tokens_derives_reprocessed() -> None:
    u = parse_usage(
        {
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 60},
            }
        }
    )
    assert (u.prompt_tokens, u.cached_tokens, u.reprocessed_tokens) == (100, 60, 40)
    assert u.reprocessed_source == "derived"


def test_ds4_openai_cache_write_is_server_reprocessed() -> None:
    usage = {
        "prompt_tokens": 14346,
        "completion_tokens": 100,
        "total_tokens": 14446,
        "prompt_tokens_details": {"cached_tokens": 14336, "cache_write_tokens": 10},
    }
    u = parse_usage({"usage": usage})
    assert u == Usage(14346, 14336, 10, 100, 10, "server")


def test_llamacpp_timings_win_and_are_server_reprocessed() -> None:
    obj = {
        "usage": {
            "prompt_tokens": 3966,
            "completion_tokens": 8,
            "prompt_tokens_details": {"cached_tokens": 3965},
        },
        "timings": {"prompt_n": 1, "cache_n": 3965, "predicted_n": 8, "prompt_ms": 3.1},
    }
    u = parse_usage(obj)
    assert (u.prompt_tokens, u.cached_tokens, u.reprocessed_tokens, u.reprocessed_source) == (
        3966,
        3965,
        1,
        "server",
    )
    assert u.output_tokens == 8


def test_llamacpp_timings_alone() -> None:
    u = parse_usage({"timings": {"prompt_n": 138, "cache_n": 3966, "predicted_n": 16}})
    assert u == Usage(4104, 3966, None, 16, 138, "server")


def test_anthropic_real_prompt_is_input_plus_read_plus_creation() -> None:
    usage = {
        "input_tokens": 50,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 200,
        "output_tokens": 30,
    }
    u = parse_usage({"usage": usage})
    assert u == Usage(1250, 1000, 200, 30, 250, "server")


def test_ds4_anthropic_input_tokens_is_zero() -> None:
    usage = {
        "input_tokens": 0,
        "cache_read_input_tokens": 14336,
        "cache_creation_input_tokens": 10,
        "output_tokens": 5,
    }
    u = parse_usage({"usage": usage})
    assert u == Usage(14346, 14336, 10, 5, 10, "server")


def test_anthropic_without_cache_fields_is_plain_input() -> None:
    u = parse_usage({"usage": {"input_tokens": 42, "output_tokens": 3}})
    assert (u.prompt_tokens, u.cached_tokens, u.reprocessed_tokens) == (42, None, None)


def test_responses_api_input_tokens_details() -> None:
    usage = {
        "input_tokens": 500,
        "output_tokens": 9,
        "input_tokens_details": {"cached_tokens": 480, "cache_write_tokens": 20},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    u = parse_usage({"usage": usage})
    assert u == Usage(500, 480, 20, 9, 20, "server")


def test_responses_api_cached_only_derives() -> None:
    u = parse_usage({"usage": {"input_tokens": 500, "input_tokens_details": {"cached_tokens": 100}}})
    assert (u.reprocessed_tokens, u.reprocessed_source) == (400, "derived")


def test_sglang_meta_info() -> None:
    u = parse_usage({"meta_info": {"prompt_tokens": 300, "completion_tokens": 4, "cached_tokens": 256}})
    assert u == Usage(300, 256, None, 4, 44, "derived")


def test_sglang_openai_usage_with_cache_report() -> None:
    u = parse_usage(
        {
            "usage": {
                "prompt_tokens": 300,
                "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 256},
            }
        }
    )
    assert (u.cached_tokens, u.reprocessed_tokens) == (256, 44)


def test_deepseek_hit_and_miss() -> None:
    usage = {
        "prompt_tokens": 900,
        "completion_tokens": 5,
        "prompt_cache_hit_tokens": 768,
        "prompt_cache_miss_tokens": 132,
    }
    u = parse_usage({"usage": usage})
    assert u == Usage(900, 768, None, 5, 132, "server")


def test_deepseek_without_prompt_tokens_sums_hit_and_miss() -> None:
    u = parse_usage({"usage": {"prompt_cache_hit_tokens": 768, "prompt_cache_miss_tokens": 132}})
    assert (u.prompt_tokens, u.cached_tokens, u.reprocessed_tokens) == (900, 768, 132)


@pytest.mark.parametrize("obj", [None, {}, {"usage": None}, {"usage": {}}, {"usage": "n/a"}, {"timings": []}])
def test_nothing_known_gives_all_none(obj: object) -> None:
    assert parse_usage(obj) == Usage()  # type: ignore[arg-type]


def test_values_that_are_not_counts_are_ignored() -> None:
    usage = {
        "prompt_tokens": "100",
        "completion_tokens": True,
        "prompt_tokens_details": {"cached_tokens": None},
    }
    assert parse_usage({"usage": usage}) == Usage()


def test_integral_floats_are_counts() -> None:
    u = parse_usage({"usage": {"prompt_tokens": 100.0, "prompt_tokens_details": {"cached_tokens": 40.0}}})
    assert (u.prompt_tokens, u.cached_tokens, u.reprocessed_tokens) == (100, 40, 60)


def test_derived_reprocessed_never_negative() -> None:
    # Text-prefix rebuilds can make a server's cached count exceed the prompt by a few tokens.
    u = parse_usage({"usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 12}}})
    assert u.reprocessed_tokens == 0
