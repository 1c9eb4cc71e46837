"""`--engine NAME=KIND:URL[,key=...,models=a|b,concurrency=N]`: parsed, or refused with why."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.config.upstreams import KINDS, UpstreamSpec, parse_engine_spec, parse_engine_specs
from tests.live import batchyard


def test_a_full_spec() -> None:
    spec = parse_engine_spec(
        "gpu1=openai:http://10.0.0.5:8000/v1/,key=sk-x,models=llama-3|qwen,concurrency=64,"
        "retries=3,backoff=0.25,timeout=90"
    )
    assert spec == UpstreamSpec(
        name="gpu1",
        url="http://10.0.0.5:8000/v1",
        kind="openai",
        key="sk-x",
        models=("llama-3", "qwen"),
        concurrency=64,
        retries=3,
        backoff=0.25,
        timeout=90.0,
    )
    assert spec.root == "http://10.0.0.5:8000"
    assert parse_engine_spec("o=openai:http://h:11434").root == "http://h:11434"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("gpu1", "expected NAME=KIND:URL"),
        ("gpu 1=openai:http://h/v1", "engine name"),
        ("embedded=openai:http://h/v1", "built-in engine"),
        ("g=tgi:http://h/v1", "kind must be 'openai' or 'vllm' or"),
        ("g=openai:h:8000", "not an http(s) URL"),
        ("g=openai:http://h/v1,concurrency=0", "concurrency must be a whole number from 1"),
        ("g=openai:http://h/v1,concurrency=many", "concurrency must be"),
        ("g=openai:http://h/v1,models=", "models= names no model"),
        ("g=openai:http://h/v1,speed=9", "unknown option 'speed'"),
        ("g=openai:http://h/v1,timeout=-1", "timeout must be"),
        ("g=openai:http://h/v1,backoff=0", "backoff must be a number of seconds above 0"),
        ("g=openai:http://h/v1,key", "must be key=value"),
        ("g=openai:http://h/v1,images=jpeg", "images must be one of pass, inline, png"),
        ("g=openai:http://h/v1,image_max_side=8", "image_max_side must be a number of pixels"),
        ("g=openai:http://h/v1,image_max_side=big", "image_max_side must be"),
        ("g=openai:http://h/v1,priority=yes", "priority must be on or off"),
    ],
)
def test_a_bad_spec_is_refused_with_its_reason(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"--engine") as caught:
        parse_engine_spec(text)
    assert says in str(caught.value)


def test_the_spec_keeps_its_kind() -> None:
    assert parse_engine_spec("g=openai:http://h/v1").kind == "openai"
    assert parse_engine_spec("g= openai :http://h/v1").kind == "openai"
    assert parse_engine_spec("g=llama-server:http://h:8080/v1").kind == "llama-server"


def test_the_table_of_kinds_says_which_kinds_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "gateway", "tests.unit.engine.upstream.gateway_kind")
    assert parse_engine_spec("g=gateway:http://h/gw").kind == "gateway"
    with pytest.raises(ValueError) as caught:
        parse_engine_spec("g=tgi:http://h/v1")
    assert "or 'batchyard' or 'gateway'" in str(caught.value)


def test_two_engines_with_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="two engines are named 'a'"):
        parse_engine_specs(["a=openai:http://h1/v1", "a=openai:http://h2/v1"])


def test_settings_read_engines_from_the_environment_separated_by_semicolons() -> None:
    s = Settings.load(
        environ={"BATCHYARD_ENGINE": "a=openai:http://h1/v1,models=x|y; b=openai:http://h2/v1"}
    )
    assert [u.name for u in s.upstreams] == ["a", "b"]
    assert s.upstreams[0].models == ("x", "y")
    with pytest.raises(ValueError, match="--no-embedded needs at least one --engine"):
        Settings.load(environ={"BATCHYARD_NO_EMBEDDED": "1"})


def test_serve_refuses_a_bad_engine_at_start_up() -> None:
    r = batchyard("serve", "--no-browser", "--engine", "gpu1=openai:nowhere", timeout=60)
    assert r.returncode != 0
    assert "batchyard: --engine 'gpu1=openai:nowhere': 'nowhere' is not an http(s) URL" in r.stderr


def test_an_image_setting_and_bound() -> None:
    spec = parse_engine_spec("lms=openai:http://h:9000/v1,images=PNG,image_max_side=1024")
    assert (spec.images, spec.image_mode, spec.image_max_side) == ("png", "png", 1024)
    assert parse_engine_spec("v=openai:http://h:8000/v1").image_max_side == 0


def test_priority_is_off_unless_turned_on() -> None:
    assert parse_engine_spec("v=openai:http://h:8000/v1").priority is False
    assert parse_engine_spec("v=openai:http://h:8000/v1,priority=ON").priority is True
    assert parse_engine_spec("v=openai:http://h:8000/v1,priority=off").priority is False
